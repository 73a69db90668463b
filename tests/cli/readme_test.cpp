// The README's "Use it" commands run as written, in a fresh folder that stands for the repository's root:
// it holds a link `models` to the repository's models/ (the shipped model the commands use) and nothing else.
// Substituted, and only this: each worker line (ending in '&') runs in the background with `--host
// 0.0.0.0 --port 900N` replaced by `--host 127.0.0.1 --port 0` (loopback only, an OS-chosen port, so
// parallel CI jobs cannot collide), and `hostN:900N` in later lines by that worker's 127.0.0.1:PORT.
// Every other line is run verbatim by /bin/sh, with the build's binaries first on PATH.
// Checks: every command exits 0; the swarm run prints the one-machine run's text (same seed) with both
// workers connected.
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <regex>
#include <sstream>

#include "cli_test_util.h"

namespace essaim::cli_test {
namespace {

std::vector<std::string> readme_block(const std::string& marker) {
  const std::string readme = read_text(std::string(ESSAIM_SOURCE_DIR) + "/README.md");
  const size_t at = readme.find("<!-- readme_test: " + marker + " -->");
  if (at == std::string::npos) return {};
  const size_t open = readme.find("```sh\n", at);
  const size_t close = readme.find("\n```", open + 6);
  if (open == std::string::npos || close == std::string::npos) return {};
  std::vector<std::string> lines;
  std::istringstream in(readme.substr(open + 6, close - open - 6));
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

TEST(Readme, TheSwarmExampleRunsAsWritten) {
  const std::vector<std::string> lines = readme_block("swarm");
  ASSERT_GE(lines.size(), 6u) << "README.md has no <!-- readme_test: swarm --> block";
  const std::string dir = make_temp_dir("readme");
  std::filesystem::create_directory_symlink(std::string(ESSAIM_SOURCE_DIR) + "/models", dir + "/models");
  std::vector<std::unique_ptr<BackgroundProcess>> workers;
  std::vector<std::pair<std::string, std::string>> addresses;  // "hostN:900N" -> "127.0.0.1:PORT"
  std::vector<CliRun> runs;                                     // the `essaim run` lines, in order
  const std::regex worker_port(R"(--host 0\.0\.0\.0 --port (9\d\d\d))");
  for (std::string line : lines) {
    std::string command = line.substr(0, line.find(" #"));
    while (!command.empty() && command.back() == ' ') command.pop_back();
    if (command.empty() || command[0] == '#') continue;
    SCOPED_TRACE(line);
    if (command.back() == '&') {
      std::smatch m;
      ASSERT_TRUE(std::regex_search(command, m, worker_port)) << "a background line that is not a worker";
      const std::string port = m[1];
      const std::string local = std::regex_replace(command.substr(0, command.size() - 1), worker_port,
                                                   "--host 127.0.0.1 --port 0");
      workers.push_back(std::make_unique<BackgroundProcess>(local, dir));
      ASSERT_NE(workers.back()->port(), 0) << workers.back()->stderr_text();
      const size_t host_at = line.find("# on ");
      ASSERT_NE(host_at, std::string::npos) << "a worker line names its host in a comment";
      addresses.push_back({line.substr(host_at + 5) + ":" + port, "127.0.0.1:" + std::to_string(workers.back()->port())});
      continue;
    }
    std::string local = command;
    for (const auto& [from, to] : addresses) local = replace_all(local, from, to);
    const CliRun r = run_cli(local, dir);
    ASSERT_EQ(r.code, 0) << local << "\nstdout: " << r.out << "\nstderr: " << r.err;
    if (local.rfind("essaim run ", 0) == 0) runs.push_back(r);
  }
  ASSERT_EQ(workers.size(), 2u);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_FALSE(runs[0].out.empty());
  EXPECT_EQ(runs[1].out, runs[0].out) << "the swarm's text differs from one machine's";
  EXPECT_NE(runs[1].err.find("2 of 2 workers connected"), std::string::npos) << runs[1].err;
  EXPECT_NE(runs[1].err.find(" 0 fallback"), std::string::npos) << runs[1].err;
  for (const auto& w : workers) EXPECT_NE(w->stderr_text().find("layer 0 experts"), std::string::npos);
}

}  // namespace
}  // namespace essaim::cli_test
