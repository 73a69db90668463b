// What a llama.cpp user meets first on the command line: an unknown subcommand is named with the list of the
// real ones, a bad number says what it must be (not a 300-digit range), help names the program, and inspect
// takes the model as -m like every other subcommand.
#include <gtest/gtest.h>

#include "cli_test_util.h"

namespace essaim::cli_test {
namespace {

TEST(Papercuts, AnUnknownSubcommandIsNamedWithTheRealOnes) {
  const CliRun r = run_cli("essaim foo");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("unknown subcommand 'foo'"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("perplexity"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find("A subcommand is required"), std::string::npos) << r.err;
}

TEST(Papercuts, ABadNumberSaysWhatItMustBe) {
  for (const char* cmd : {"essaim run -m x.gguf -p hi -c -5", "essaim run -m x.gguf -p hi -b 0",
                          "essaim eval -m x.gguf -p hi --logits-out x.npy -t -1"}) {
    const CliRun r = run_cli(cmd);
    EXPECT_EQ(r.code, 2) << cmd;
    EXPECT_NE(r.err.find("is not a number >= "), std::string::npos) << cmd << ": " << r.err;
    EXPECT_LT(r.err.size(), 200u) << cmd << ": " << r.err;
  }
}

TEST(Papercuts, HelpNamesTheProgram) {
  const CliRun r = run_cli("essaim serve --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("Usage: essaim serve"), std::string::npos) << r.out.substr(0, 200);
}

TEST(Papercuts, InspectTakesTheModelAsDashM) {
  const std::string model = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf";
  const CliRun a = run_cli("essaim inspect -m " + model);
  const CliRun b = run_cli("essaim inspect " + model);
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  const CliRun none = run_cli("essaim inspect");
  EXPECT_EQ(none.code, 2);
  EXPECT_NE(none.err.find("essaim inspect FILE (or -m FILE)"), std::string::npos) << none.err;
}

}  // namespace
}  // namespace essaim::cli_test
