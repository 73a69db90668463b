// `essaim slice` as a user runs it: the plan printed without writing, a written plan verified, a flipped
// byte and a bad range reported with a message and exit code 1 (the file) or 2 (the command line).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "slice/expert_slice.h"
#include "slice_test_util.h"

namespace essaim {
namespace {

struct CliRun {
  int code = -1;
  std::string out;  // stdout and stderr
};

CliRun essaim(const std::string& args) {
  const std::string cmd = std::string(ESSAIM_BINARY_DIR) + "/src/cli/essaim slice " + args + " 2>&1";
  CliRun r;
  std::FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) r.out.append(buf.data(), n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kModel = std::string(ESSAIM_FIXTURES_DIR) + "/qwen3moe-small-q4k.gguf";

TEST(SliceCli, PlanPrintsWithoutWritingThenWritesAndVerifies) {
  const std::string dir = testing::make_test_dir("cli");
  CliRun r = essaim("-m " + kModel + " --plan 3 --backbone");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("qwen3moe.L1.E6-7.gguf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("qwen3moe.backbone.gguf"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("nothing written"), std::string::npos) << r.out;
  EXPECT_TRUE(std::filesystem::is_empty(dir));

  r = essaim("-m " + kModel + " --plan 3 --backbone -o " + dir + "/out");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("wrote 7 files"), std::string::npos) << r.out;
  r = essaim("--verify " + dir + "/out/manifest.json");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("ok: 7 files"), std::string::npos) << r.out;

  {
    std::fstream f(dir + "/out/qwen3moe.L0.E3-5.gguf", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.put('\x5a');
  }
  r = essaim("--verify " + dir + "/out/manifest.json");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_NE(r.out.find("qwen3moe.L0.E3-5.gguf: SHA-256"), std::string::npos) << r.out;
}

TEST(SliceCli, OneSliceAndItsErrors) {
  const std::string dir = testing::make_test_dir("cli-one");
  CliRun r = essaim("-m " + kModel + " --layers 0-1 --experts 2-4 -o " + dir + "/s.gguf");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("sha256 "), std::string::npos) << r.out;
  Result<ExpertSlice> s = ExpertSlice::open(dir + "/s.gguf");
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->layer_count(), 2u);
  EXPECT_EQ(s->expert_first(), 2u);
  EXPECT_EQ(s->expert_count(), 3u);

  // Exit 1: the work failed (the file says no); exit 2: the command line is wrong (docs/cli.md).
  const std::tuple<std::string, const char*, int> bad[] = {
      {"-m " + kModel + " --layers 1-2 --experts 0 -o " + dir + "/x.gguf", "layers 1-2 lie beyond the model's 2 layers", 1},
      {"-m " + kModel + " --layers 0 --experts 7-8 -o " + dir + "/x.gguf", "experts 7-8 lie beyond the model's 8", 1},
      {"-m " + kModel + " --layers 3-1 --experts 0 -o " + dir + "/x.gguf", "ends before it starts", 2},
      {"-m " + kModel + " --layers 0 -o " + dir + "/x.gguf", "needs both --layers A-B and --experts X-Y", 2},
      {"-m " + kModel + " --layers 0 --experts 0 -o " + dir + "/no/such/x.gguf", "cannot create", 1},
      {"-m " + dir + "/s.gguf --plan 2", "is an essaim expert slice", 1},
      {"-m " + std::string(ESSAIM_FIXTURES_DIR) + "/tokens.txt --plan 2", "tokens.txt", 1},
  };
  for (const auto& [args, expect, code] : bad) {
    r = essaim(args);
    EXPECT_EQ(r.code, code) << args << "\n" << r.out;
    EXPECT_NE(r.out.find(expect), std::string::npos) << args << "\n" << r.out;
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/x.gguf"));
}

}  // namespace
}  // namespace essaim
