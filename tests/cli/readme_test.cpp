// The README's code blocks run as written. Every fenced block is marked by the line above it: either
// `<!-- readme_test: NAME -->` (run here) or `<!-- readme_test: not run: REASON -->` (a set-up command, a public
// host, a package CI does not give this test); a block with neither fails the test.
//
// The blocks to run run in the README's order in one fresh folder that stands for the repository's root: it
// holds a link `models` to the repository's models/ (the shipped model the commands use) and nothing else, so
// a later block finds what an earlier one wrote (slices/) and the servers it started. Substituted, and only
// this: a line ending in '&' runs in the background and must say where it listens (`--host H --port P` or
// `--listen H:P`), which becomes 127.0.0.1 and an OS-chosen port (loopback only; parallel CI jobs cannot
// collide); later lines name it as `hostN:P` (when its comment says `# on hostN`) or `127.0.0.1:P`, replaced by
// the real address. A line ending in '\' continues on the next. Every other line is run verbatim by /bin/sh,
// with the build's binaries first on PATH, each within 120 s.
// Checks: every command exits 0; the swarm run prints the one-machine run's text (same seed) with both workers
// connected; the coordinator registers a node (its token comes back); the server answers a chat completion.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <regex>
#include <sstream>

#include "cli_test_util.h"

namespace essaim::cli_test {
namespace {

struct Block {
  std::string marker;  // "swarm", or "not run: ..." ; empty when the line above has no marker
  std::string lang;    // "sh", "js", ...
  std::vector<std::string> lines;
};

std::vector<Block> readme_blocks() {
  std::istringstream in(read_text(std::string(ESSAIM_SOURCE_DIR) + "/README.md"));
  std::vector<Block> blocks;
  std::string previous;
  const std::regex marker(R"(^<!-- readme_test: (.+) -->$)");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("```", 0) != 0) {
      previous = line;
      continue;
    }
    Block b;
    b.lang = line.substr(3);
    std::smatch m;
    if (std::regex_match(previous, m, marker)) b.marker = m[1];
    while (std::getline(in, line) && line.rfind("```", 0) != 0) b.lines.push_back(line);
    blocks.push_back(std::move(b));
    previous.clear();
  }
  return blocks;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

// The commands of a block: comments cut, continuation lines joined, blank lines dropped. `line` keeps the
// command as written, with its comment (where a background line says its host).
struct Command {
  std::string text;
  std::string line;
};

std::vector<Command> commands_of(const Block& b) {
  std::vector<Command> out;
  std::string pending;
  for (const std::string& line : b.lines) {
    std::string command = line.substr(0, line.find(" #"));
    while (!command.empty() && command.back() == ' ') command.pop_back();
    if (!pending.empty()) command = pending + " " + command.substr(command.find_first_not_of(' '));
    if (!command.empty() && command.back() == '\\') {
      pending = command.substr(0, command.size() - 1);
      while (!pending.empty() && pending.back() == ' ') pending.pop_back();
      continue;
    }
    pending.clear();
    if (command.empty() || command[0] == '#') continue;
    out.push_back({command, line});
  }
  return out;
}

struct Ran {
  std::string command;  // as run, after substitution
  CliRun result;
};

// Runs the marked blocks in order, in one folder, keeping their background servers up until the end.
class ReadmeRun {
 public:
  explicit ReadmeRun(std::string dir) : dir_(std::move(dir)) {}

  // Each foreground command's result, in order.
  std::vector<Ran> run_block(const Block& b) {
    std::vector<Ran> results;
    for (const Command& c : commands_of(b)) {
      SCOPED_TRACE(c.line);
      std::string local = c.text;
      for (const auto& [from, to] : addresses_) local = replace_all(local, from, to);
      if (local.back() == '&') {
        start_background(local.substr(0, local.size() - 1), c.line);
        if (::testing::Test::HasFatalFailure()) return results;
        continue;
      }
      const CliRun r = run_cli(local, dir_);
      EXPECT_EQ(r.code, 0) << local << "\nstdout: " << r.out << "\nstderr: " << r.err;
      results.push_back({local, r});
      if (r.code != 0) return results;
    }
    return results;
  }
  const std::vector<std::unique_ptr<BackgroundProcess>>& background() const { return background_; }

 private:
  void start_background(const std::string& command, const std::string& line) {
    static const std::regex host_port(R"(--host (\S+) --port (\d+))"), listen(R"(--listen (\S+):(\d+))");
    std::smatch m;
    std::string local;
    if (std::regex_search(command, m, host_port)) {
      local = std::regex_replace(command, host_port, "--host 127.0.0.1 --port 0");
    } else if (std::regex_search(command, m, listen)) {
      local = std::regex_replace(command, listen, "--listen 127.0.0.1:0");
    } else {
      FAIL() << "a background line that does not say where it listens: " << command;
    }
    const std::string port = m[2];
    background_.push_back(std::make_unique<BackgroundProcess>(local, dir_));
    ASSERT_NE(background_.back()->port(), 0) << local << "\n" << background_.back()->stderr_text();
    const std::string real = "127.0.0.1:" + std::to_string(background_.back()->port());
    addresses_["127.0.0.1:" + port] = real;
    const size_t host_at = line.find("# on ");
    if (host_at != std::string::npos) {
      const std::string host = line.substr(host_at + 5, line.find_first_of(" ,;)", host_at + 5) - host_at - 5);
      addresses_[host + ":" + port] = real;
    }
  }

  std::string dir_;
  std::vector<std::unique_ptr<BackgroundProcess>> background_;
  std::map<std::string, std::string> addresses_;  // "hostN:900N" -> "127.0.0.1:PORT"
};

TEST(Readme, EveryCodeBlockIsRunOrSaysWhyNot) {
  const std::vector<Block> blocks = readme_blocks();
  ASSERT_GE(blocks.size(), 5u);
  for (const Block& b : blocks) {
    const std::string first = b.lines.empty() ? "" : b.lines[0];
    EXPECT_FALSE(b.marker.empty()) << "a ```" << b.lang << " block of README.md without a <!-- readme_test: NAME --> "
                                   << "or <!-- readme_test: not run: REASON --> line above it: " << first;
    if (b.marker.rfind("not run", 0) == 0)
      EXPECT_GT(b.marker.size(), std::string("not run: ").size() + 10) << "say why it does not run: " << first;
    else if (!b.marker.empty())
      EXPECT_EQ(b.lang, "sh") << "only sh blocks can be run: " << first;
  }
}

TEST(Readme, TheMarkedBlocksRunAsWritten) {
  const std::string dir = make_temp_dir("readme");
  std::filesystem::create_directory_symlink(std::string(ESSAIM_SOURCE_DIR) + "/models", dir + "/models");
  ReadmeRun readme(dir);
  std::map<std::string, std::vector<Ran>> results;
  for (const Block& b : readme_blocks()) {
    if (b.marker.empty() || b.marker.rfind("not run", 0) == 0) continue;
    SCOPED_TRACE("block " + b.marker);
    results[b.marker] = readme.run_block(b);
    ASSERT_FALSE(::testing::Test::HasFailure());
  }
  ASSERT_EQ(results.count("swarm"), 1u) << "README.md has no <!-- readme_test: swarm --> block";
  std::vector<CliRun> runs;  // the swarm block's `essaim run` lines: one machine, then the swarm
  for (const Ran& r : results["swarm"])
    if (r.command.rfind("essaim run ", 0) == 0) runs.push_back(r.result);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_FALSE(runs[0].out.empty());
  EXPECT_EQ(runs[1].out, runs[0].out) << "the swarm's text differs from one machine's";
  EXPECT_NE(runs[1].err.find("2 of 2 workers connected"), std::string::npos) << runs[1].err;
  EXPECT_NE(runs[1].err.find(" 0 fallback"), std::string::npos) << runs[1].err;
  for (size_t i = 0; i < 2 && i < readme.background().size(); ++i)
    EXPECT_NE(readme.background()[i]->stderr_text().find("layer 0 experts"), std::string::npos);
  ASSERT_EQ(results.count("coordinator"), 1u);
  ASSERT_FALSE(results["coordinator"].empty());
  const std::string registered = results["coordinator"].back().result.out;
  EXPECT_NE(registered.find("\"token\""), std::string::npos) << registered;
  ASSERT_EQ(results.count("serve"), 1u);
  ASSERT_FALSE(results["serve"].empty());
  const std::string answer = results["serve"].back().result.out;
  EXPECT_NE(answer.find("\"choices\""), std::string::npos) << answer;
}

}  // namespace
}  // namespace essaim::cli_test
