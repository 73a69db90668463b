// The skip helper (skip.h): a missing dependency skips on a developer's machine and fails under CI, missing
// hardware skips everywhere. The macros return from a test body, so each case runs this binary again as a
// child with a chosen environment and reads what gtest made of the child test.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "skip.h"
#include "temp_dir.h"

namespace essaim::test_support {
namespace {

// The children: inert unless the parent asks for them.
bool is_child() { return std::getenv("ESSAIM_SKIP_TEST_CHILD") != nullptr; }

TEST(SkipChild, MissingDependency) {
  if (!is_child()) GTEST_SKIP() << "runs as a child of SkipHelper.*";
  ESSAIM_SKIP_MISSING_DEP(Dep::POSTGRESQL, "initdb is not on this machine");
  ADD_FAILURE() << "the macro did not return";
}

TEST(SkipChild, MissingHardware) {
  if (!is_child()) GTEST_SKIP() << "runs as a child of SkipHelper.*";
  ESSAIM_SKIP_MISSING_HARDWARE("no CUDA device visible (cudaErrorNoDevice)");
  ADD_FAILURE() << "the macro did not return";
}

// An unbraced if/else around the macro binds as written.
TEST(SkipChild, InsideIfElse) {
  if (!is_child()) GTEST_SKIP() << "runs as a child of SkipHelper.*";
  bool ran_else = false;
  if (std::getenv("ESSAIM_SKIP_TEST_NEVER_SET") != nullptr)
    ESSAIM_SKIP_MISSING_DEP(Dep::CHROMIUM, "unreachable");
  else
    ran_else = true;
  EXPECT_TRUE(ran_else);
}

struct ChildRun {
  int code = -1;
  std::string out;
};

// This binary again with one child test, CI / ESSAIM_REQUIRE_DEPS set as given ("" = unset).
ChildRun run_child(const std::string& test, const std::string& ci, const std::string& require) {
  std::array<char, 4096> self{};
  const ssize_t n = ::readlink("/proc/self/exe", self.data(), self.size() - 1);
  EXPECT_GT(n, 0);
  const std::string dir = essaim::testing::make_temp_dir("essaim-skip-test");
  const std::string log = dir + "/out.txt";
  std::string env = "env -u CI -u ESSAIM_REQUIRE_DEPS ESSAIM_SKIP_TEST_CHILD=1";
  if (!ci.empty()) env += " CI=" + ci;
  if (!require.empty()) env += " ESSAIM_REQUIRE_DEPS=" + require;
  const std::string cmd = env + " '" + std::string(self.data(), size_t(std::max<ssize_t>(n, 0))) +
                          "' --gtest_filter=SkipChild." + test + " > '" + log + "' 2>&1";
  const int rc = std::system(cmd.c_str());
  ChildRun r;
  r.code = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::stringstream s;
  s << std::ifstream(log).rdbuf();
  r.out = s.str();
  std::filesystem::remove_all(dir);
  return r;
}

bool skipped(const ChildRun& r) { return r.code == 0 && r.out.find("[  SKIPPED ] SkipChild.") != std::string::npos; }
bool failed(const ChildRun& r) { return r.code == 1 && r.out.find("[  FAILED  ] SkipChild.") != std::string::npos; }

TEST(SkipHelper, AMissingDependencySkipsOnADevelopersMachine) {
  const ChildRun r = run_child("MissingDependency", "", "");
  EXPECT_TRUE(skipped(r)) << r.out;
  EXPECT_NE(r.out.find("PostgreSQL 15 missing: initdb is not on this machine (provided by scripts/install-deps.sh"),
            std::string::npos) << r.out;
  EXPECT_TRUE(skipped(run_child("MissingDependency", "false", "")));
  EXPECT_TRUE(skipped(run_child("MissingDependency", "true", "0"))) << "ESSAIM_REQUIRE_DEPS=0 overrides CI";
}

TEST(SkipHelper, AMissingDependencyFailsUnderCi) {
  for (const auto& [ci, require] : {std::pair<std::string, std::string>{"true", ""}, {"1", ""}, {"", "1"}, {"false", "1"}}) {
    const ChildRun r = run_child("MissingDependency", ci, require);
    EXPECT_TRUE(failed(r)) << "CI=" << ci << " ESSAIM_REQUIRE_DEPS=" << require << ":\n" << r.out;
    EXPECT_NE(r.out.find("PostgreSQL 15 missing: initdb is not on this machine"), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("a skipped test would count as passed"), std::string::npos) << r.out;
    EXPECT_EQ(r.out.find("the macro did not return"), std::string::npos) << r.out;
  }
}

TEST(SkipHelper, MissingHardwareSkipsEvenUnderCi) {
  for (const std::string ci : {"", "true"}) {
    const ChildRun r = run_child("MissingHardware", ci, ci.empty() ? "" : "1");
    EXPECT_TRUE(skipped(r)) << "CI=" << ci << ":\n" << r.out;
    EXPECT_NE(r.out.find("skipped: no CUDA device visible (cudaErrorNoDevice)"), std::string::npos) << r.out;
  }
}

TEST(SkipHelper, TheMacroIsOneStatement) {
  const ChildRun r = run_child("InsideIfElse", "true", "");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("[       OK ] SkipChild.InsideIfElse"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace essaim::test_support
