// The llama.cpp spellings: each short or alternative flag parses to the same option as its long form —
// through the shared definitions (cli/common_flags.h) and through the real binary, whose `run --json`
// reports what it parsed; the exit-code convention (0 / 1 runtime / 2 usage) of every subcommand.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "cli/common_flags.h"
#include "cli_test_util.h"
#include "model_fixture.h"

namespace essaim::cli_test {
namespace {

using cli::add_batch_flag;
using cli::add_ctx_flag;
using cli::add_parallel_flag;
using cli::add_threads_flag;

struct Parsed {
  int32_t threads = -1, n_ctx = -1, batch = -1, parallel = -1;
};

// Parses argv (after the program name) through the shared definitions, with -np rewritten as main() does.
Parsed parse(std::vector<std::string> args) {
  CLI::App app;
  Parsed p;
  add_threads_flag(app, p.threads);
  add_ctx_flag(app, p.n_ctx, "ctx");
  add_batch_flag(app, p.batch, "batch");
  add_parallel_flag(app, p.parallel, "parallel");
  args.insert(args.begin(), "prog");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  std::vector<std::string> rewritten = cli::rewrite_llama_spellings(int(argv.size()), argv.data());
  rewritten.erase(rewritten.begin());
  std::reverse(rewritten.begin(), rewritten.end());
  app.parse(rewritten);
  return p;
}

TEST(Flags, ShortAndAlternativeSpellingsSetTheSameOption) {
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> same = {
      {{"-t", "3"}, {"--threads", "3"}},       {{"-c", "512"}, {"--ctx-size", "512"}},
      {{"--ctx", "512"}, {"--ctx-size", "512"}}, {{"-b", "7"}, {"--batch-size", "7"}},
      {{"--batch", "7"}, {"--batch-size", "7"}}, {{"-np", "4"}, {"--parallel", "4"}},
      {{"-np=4"}, {"--parallel=4"}},
  };
  for (const auto& [a, b] : same) {
    const Parsed x = parse(a), y = parse(b);
    EXPECT_EQ(x.threads, y.threads) << a[0];
    EXPECT_EQ(x.n_ctx, y.n_ctx) << a[0];
    EXPECT_EQ(x.batch, y.batch) << a[0];
    EXPECT_EQ(x.parallel, y.parallel) << a[0];
    EXPECT_FALSE(x.threads == -1 && x.n_ctx == -1 && x.batch == -1 && x.parallel == -1) << a[0] << " set nothing";
  }
  EXPECT_EQ(parse({"-np", "4"}).parallel, 4);
  EXPECT_EQ(parse({"-c", "512"}).n_ctx, 512);
}

TEST(Flags, TheRewriteLeavesEverythingElseAlone) {
  std::vector<std::string> args = {"essaim", "run", "-p", "-np", "-np", "2", "--", "-np"};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  // Every "-np" word before "--" is rewritten, even one meant as a value ("-p -np"): the rewrite runs before
  // the parser knows which flags take values. A value "-np" is written "--prompt=-np" (docs/cli.md).
  const std::vector<std::string> out = cli::rewrite_llama_spellings(int(argv.size()), argv.data());
  EXPECT_EQ(out, (std::vector<std::string>{"essaim", "run", "-p", "--parallel", "--parallel", "2", "--", "-np"}));
}

nlohmann::json run_json(const std::string& flags) {
  const CliRun r = run_cli("essaim run -m " + tiny_model() + " -p Hello -n 3 --json " + flags);
  EXPECT_EQ(r.code, 0) << flags << "\n" << r.err;
  try {
    return nlohmann::json::parse(r.out);
  } catch (const std::exception& e) {
    ADD_FAILURE() << flags << ": not JSON: " << r.out;
    return {};
  }
}

TEST(Flags, TheBinaryParsesShortAndLongFormsAlike) {
  const nlohmann::json s = run_json("-t 1 -c 64 -b 2 -s 7 --temp 0.5 --top-k 5 --top-p 0.9 --min-p 0.1 "
                                    "--repeat-penalty 1.1");
  const nlohmann::json l = run_json("--threads 1 --ctx-size 64 --batch-size 2 --seed 7 --temp 0.5 --top-k 5 "
                                    "--top-p 0.9 --min-p 0.1 --repeat-penalty 1.1");
  const nlohmann::json old = run_json("--threads 1 --ctx 64 --batch 2 --seed 7 --temp 0.5 --top-k 5 "
                                      "--top-p 0.9 --min-p 0.1 --repeat-penalty 1.1");
  ASSERT_TRUE(s.is_object() && l.is_object() && old.is_object());
  EXPECT_EQ(s["threads"], 1);
  EXPECT_EQ(s["n_ctx"], 64);
  EXPECT_EQ(s["batch"], 2);
  EXPECT_EQ(s["seed"], 7);
  EXPECT_EQ(s["sampling"]["top_k"], 5);
  for (const char* key : {"threads", "n_ctx", "batch", "seed", "sampling", "tokens", "text"}) {
    EXPECT_EQ(s[key], l[key]) << key;
    EXPECT_EQ(s[key], old[key]) << key;
  }
}

TEST(ExitCodes, UsageErrorsAreTwoFailuresOneHelpZero) {
  const std::string m = tiny_model();
  const std::pair<std::string, int> cases[] = {
      {"essaim", 2},                                              // no subcommand
      {"essaim frobnicate", 2},                                   // unknown subcommand
      {"essaim --help", 0},
      {"essaim run --help", 0},
      {"essaim --version", 0},
      {"essaim run -m " + m, 2},                                   // -p missing
      {"essaim run -m " + m + " -p hi --no-such-flag", 2},
      {"essaim run -m " + m + " -p hi -t -1", 2},
      {"essaim run -m " + m + " -p hi --kv-type f8", 2},
      {"essaim run -m /no/such.gguf -p hi", 1},                   // the model cannot be loaded
      {"essaim eval -m " + m + " --logits-out /dev/null", 2},     // neither --tokens nor -p
      {"essaim eval -m " + m + " --tokens 1,x --logits-out /dev/null", 1},
      {"essaim synth --arch qwen3moe --preset tiny --types q4_k_m", 2},    // -o missing
      {"essaim slice -m " + m + " --layers 1-0 --experts 0 -o /dev/null", 2},
      {"essaim slice -m " + m + " --layers 0", 2},
      {"essaim slice -m " + m + " --layers 5 --experts 0 -o x.gguf", 1},  // beyond the model: found in the file
      {"essaim slice -m /no/such.gguf --plan 2", 1},
      {"essaim inspect /no/such.gguf", 1},
      {"essaim worker", 2},                                        // no slice
      {"essaim worker --experts 0-2", 2},                          // --experts without --slices
      {"essaim worker --slice /no/such.gguf", 2},                  // CLI11's ExistingFile
      {"essaim-worker --bogus", 2},
      {"essaim-worker --version", 0},
      {"essaim version --json", 0},
  };
  for (const auto& [cmd, want] : cases) {
    const CliRun r = run_cli(cmd);
    EXPECT_EQ(r.code, want) << cmd << "\nstdout: " << r.out << "\nstderr: " << r.err;
    if (want == 2) {
      EXPECT_FALSE(r.err.empty()) << cmd << ": a usage error says why";
    }
  }
}

}  // namespace
}  // namespace essaim::cli_test
