// docs/cli.md says what the binaries are: its subcommand list, the flags of each subcommand, the table of
// flags shared with llama.cpp and the `essaim --version` example are compared with what the built binaries
// print (`essaim --help`, `essaim SUB --help`, `essaim-worker --help`, `essaim --version`, `essaim version
// --json`). A flag documented but absent, present but undocumented, a subcommand missing on either side, or
// a kernel ABI / protocol version the binary no longer has fails here.
//
// The page's parseable parts: the first table of "# The command line" (one row per subcommand, its name in
// backquotes first), "## Flags by subcommand" (one "### `essaim SUB`" heading per subcommand, then the flags
// as backquoted groups, "`-m, --model`", every name of a flag in one group), the table under "## Flags
// shared with llama.cpp" (flag, other spellings, meaning, the subcommands that take it) and the fenced
// example under "## `essaim version` and `--version`".
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "cli_test_util.h"

namespace essaim::cli_test {
namespace {

using Names = std::set<std::string>;

std::string cli_md() { return "\n" + read_text(std::string(ESSAIM_SOURCE_DIR) + "/docs/cli.md"); }

// The text from the heading `title` (a whole line) to the next heading of the same or a higher level.
std::string section(const std::string& doc, const std::string& title) {
  const size_t at = doc.find("\n" + title + "\n");
  if (at == std::string::npos) return "";
  const size_t level = title.find(' ');
  const size_t body = at + title.size() + 2;
  for (size_t next = doc.find("\n#", body); next != std::string::npos; next = doc.find("\n#", next + 1)) {
    const size_t hashes = doc.find_first_not_of('#', next + 1) - (next + 1);
    if (hashes <= level) return doc.substr(body, next - body);
  }
  return doc.substr(body);
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

std::vector<std::string> backquoted(const std::string& text) {
  std::vector<std::string> out;
  for (size_t open = text.find('`'); open != std::string::npos; open = text.find('`', open + 1)) {
    const size_t close = text.find('`', open + 1);
    if (close == std::string::npos) break;
    out.push_back(text.substr(open + 1, close - open - 1));
    open = close;
  }
  return out;
}

std::vector<std::string> table_cells(const std::string& row) {
  std::vector<std::string> cells;
  std::string cell;
  std::istringstream in(row.substr(1));
  while (std::getline(in, cell, '|')) cells.push_back(cell);
  return cells;
}

// Every flag name in a "-m, --model" or "-c N" group: the words that start with '-'.
Names flag_names(const std::string& group) {
  Names names;
  std::string word;
  std::istringstream in(std::regex_replace(group, std::regex("[,`]"), " "));
  while (in >> word)
    if (word.size() > 1 && word[0] == '-') names.insert(word);
  return names;
}

// CLI11's help: "  -m,--model TEXT REQUIRED   The GGUF model" under "Options:" (and, for the top level,
// subcommand names under "Subcommands:"). The first column ends at two spaces.
struct Help {
  Names flags;
  Names subcommands;
};

Help parse_help(const std::string& text) {
  Help help;
  std::string part;
  for (const std::string& line : lines_of(text)) {
    if (!line.empty() && line[0] != ' ') {
      part = line;
      continue;
    }
    const size_t start = line.find_first_not_of(' ');
    if (start == std::string::npos || start > 6) continue;  // a wrapped description
    const std::string first = line.substr(start, line.find("  ", start) - start);
    if (part.rfind("Subcommands", 0) == 0) {
      help.subcommands.insert(first.substr(0, first.find(' ')));
    } else if (part.rfind("Options", 0) == 0 || part.rfind("OPTIONS", 0) == 0 || first[0] == '-') {
      const Names names = flag_names(first.substr(0, first.find(' ')));
      help.flags.insert(names.begin(), names.end());
    }
  }
  return help;
}

Help help_of(const std::string& command) {
  const CliRun r = run_cli(command + " --help");
  EXPECT_EQ(r.code, 0) << command << " --help\n" << r.err;
  return parse_help(r.out);
}

// "### `essaim run`" → "essaim run", with the flag names listed under it.
std::map<std::string, Names> documented_flags(const std::string& doc) {
  std::map<std::string, Names> out;
  const std::string body = section(doc, "## Flags by subcommand");
  std::string current;
  for (const std::string& line : lines_of(body)) {
    if (line.rfind("### ", 0) == 0) {
      const std::vector<std::string> q = backquoted(line);
      current = q.empty() ? "" : q[0];
      out[current];
      continue;
    }
    if (current.empty()) continue;
    for (const std::string& group : backquoted(line)) {
      const Names names = flag_names(group);
      out[current].insert(names.begin(), names.end());
    }
  }
  return out;
}

std::string joined(const Names& names) {
  std::string s;
  for (const std::string& n : names) s += (s.empty() ? "" : " ") + n;
  return s;
}

TEST(CliDoc, TheSubcommandTableListsEverySubcommandTheBinaryHas) {
  const std::string doc = cli_md();
  Names documented;
  bool in_table = false;
  for (const std::string& line : lines_of(section(doc, "# The command line"))) {
    if (line.rfind("| subcommand |", 0) == 0) in_table = true;
    if (!in_table) continue;
    if (line.rfind("|", 0) != 0) break;  // the end of the first table
    if (line.rfind("| `", 0) != 0) continue;
    const std::string name = backquoted(line)[0];
    documented.insert(name.substr(0, name.find(' ')));
  }
  Names binary = help_of("essaim").subcommands;
  binary.erase("help");
  ASSERT_FALSE(binary.empty()) << "no subcommand found in `essaim --help`";
  EXPECT_EQ(joined(documented), joined(binary)) << "docs/cli.md's subcommand table against `essaim --help`";
}

TEST(CliDoc, EverySubcommandsFlagsAreThoseItsHelpLists) {
  const std::map<std::string, Names> documented = documented_flags(cli_md());
  Names commands = help_of("essaim").subcommands;
  commands.erase("help");
  Names sections;
  for (const auto& [name, flags] : documented) sections.insert(name);
  Names expected;
  for (const std::string& c : commands) expected.insert("essaim " + c);
  expected.insert("essaim-worker");
  EXPECT_EQ(joined(sections), joined(expected)) << "the ### sections of \"## Flags by subcommand\"";
  for (const std::string& command : expected) {
    SCOPED_TRACE(command);
    const Names in_help = help_of(command).flags;
    ASSERT_FALSE(in_help.empty()) << "no flag parsed from `" << command << " --help`";
    const auto it = documented.find(command);
    const Names in_doc = it == documented.end() ? Names{} : it->second;
    Names undocumented, absent;
    for (const std::string& f : in_help)
      if (!in_doc.count(f)) undocumented.insert(f);
    for (const std::string& f : in_doc)
      if (!in_help.count(f)) absent.insert(f);
    EXPECT_TRUE(undocumented.empty()) << "in --help, not in docs/cli.md: " << joined(undocumented);
    EXPECT_TRUE(absent.empty()) << "in docs/cli.md, not in --help: " << joined(absent);
  }
}

TEST(CliDoc, TheSharedFlagsTableNamesOnlyFlagsOfTheSubcommandsItLists) {
  const std::string table = section(cli_md(), "## Flags shared with llama.cpp");
  std::map<std::string, Names> helps;
  size_t rows = 0;
  for (const std::string& line : lines_of(table)) {
    if (line.rfind("| `", 0) != 0) continue;
    const std::vector<std::string> cells = table_cells(line);
    ASSERT_EQ(cells.size(), 4u) << line;
    Names names = flag_names(cells[0]);
    const Names also = flag_names(cells[1]);
    names.insert(also.begin(), also.end());
    // llama.cpp's two-letter `-np` is rewritten to `--parallel` before CLI11 parses (rewrite_llama_spellings),
    // so --help shows only the long form.
    ASSERT_FALSE(names.empty()) << "no flag parsed from " << line;
    if (names.erase("-np")) {
      EXPECT_TRUE(names.count("--parallel")) << line;
    }
    std::istringstream subs(std::regex_replace(cells[3], std::regex("[,;]"), " "));
    for (std::string sub; subs >> sub;) {
      if (!helps.count(sub)) helps[sub] = help_of("essaim " + sub).flags;
      for (const std::string& n : names)
        EXPECT_TRUE(helps[sub].count(n)) << n << " is listed for `essaim " << sub << "` but its --help has no such flag";
    }
    ++rows;
  }
  EXPECT_GE(rows, 20u) << "the shared-flags table was not found or not parsed";
}

TEST(CliDoc, TheVersionExampleShowsTheBinarysKernelAbiAndProtocol) {
  const std::string example = section(cli_md(), "## `essaim version` and `--version`");
  const CliRun r = run_cli("essaim version --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const std::string abi = std::to_string(j["kernel_abi"].get<uint32_t>());
  const std::string protocol = std::to_string(j["protocol_version"].get<uint32_t>());
  const std::string version = j["version"].get<std::string>();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(example, m, std::regex(R"(kernels: ABI (\d+), ISA)"))) << example;
  EXPECT_EQ(m[1], abi) << "docs/cli.md's `essaim --version` example shows another kernel ABI";
  ASSERT_TRUE(std::regex_search(example, m, std::regex(R"(\nprotocol: (\d+)\n)")));
  EXPECT_EQ(m[1], protocol) << "docs/cli.md's `essaim --version` example shows another protocol";
  ASSERT_TRUE(std::regex_search(example, m, std::regex(R"(\nessaim (\S+) \(commit)")));
  EXPECT_EQ(m[1], version);
  ASSERT_TRUE(std::regex_search(example, m, std::regex(R"(\{"build_type".*\})")));
  const nlohmann::json shown = nlohmann::json::parse(m[0].str());
  EXPECT_EQ(shown["kernel_abi"], j["kernel_abi"]);
  EXPECT_EQ(shown["protocol_version"], j["protocol_version"]);
  EXPECT_EQ(shown["version"], j["version"]);
  Names keys, shown_keys;
  for (const auto& [k, v] : j.items()) keys.insert(k);
  for (const auto& [k, v] : shown.items()) shown_keys.insert(k);
  EXPECT_EQ(joined(shown_keys), joined(keys)) << "the fields of `essaim version --json`";
  // The binary's own --version agrees with the page's form line by line.
  const CliRun flag = run_cli("essaim --version");
  EXPECT_NE(flag.out.find("kernels: ABI " + abi + ", ISA "), std::string::npos) << flag.out;
  EXPECT_NE(flag.out.find("\nprotocol: " + protocol + "\n"), std::string::npos) << flag.out;
}

}  // namespace
}  // namespace essaim::cli_test
