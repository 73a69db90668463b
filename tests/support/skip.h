// Skipping a test for something this machine lacks, in the two kinds a CI run must tell apart:
//  - a DEPENDENCY that scripts/install-deps.sh installs (PostgreSQL, Chromium, node + npm, the ARM64 worker with
//    qemu-user): skipped on a developer's machine, but a FAILURE when dependencies are required — under
//    `CI=true` (or `CI=1`) and under `ESSAIM_REQUIRE_DEPS=1`, which scripts/test.sh sets. A skipped gtest exits
//    0, so without this a CI machine missing PostgreSQL would pass every PostgreSQL test without running one.
//  - HARDWARE no script can install (a GPU, a CPU feature): skipped everywhere, CI included, with the reason.
//
//   if (!pg.ok()) ESSAIM_SKIP_MISSING_DEP(essaim::test_support::Dep::POSTGRESQL, pg.why());
//   if (devices == 0) ESSAIM_SKIP_MISSING_HARDWARE("no CUDA device visible (" + reason + ")");
//
// Both are statements that return from the test body (or SetUp), like GTEST_SKIP / GTEST_FAIL. ctest shows a
// skipped test as "Skipped" (gtest_discover_tests' SKIP_REGULAR_EXPRESSION) and lists it among the tests
// that did not run; a test failed here is a failure like any other.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <string_view>

namespace essaim::test_support {

// What scripts/install-deps.sh (and, for the ARM64 worker, scripts/build-arm64.sh) provides.
enum class Dep { POSTGRESQL, CHROMIUM, NODE_NPM, ARM64_WORKER, PYTHON_JINJA2, DEP_COUNT };

struct DepInfo {
  const char* name;
  const char* provided_by;
};
inline constexpr DepInfo kDeps[] = {
    {"PostgreSQL 15", "scripts/install-deps.sh (postgresql)"},
    {"Chromium", "scripts/install-deps.sh (chromium)"},
    {"node + npm", "scripts/install-deps.sh (nodejs npm)"},
    {"the ARM64 worker under qemu-user", "scripts/install-deps.sh --arm64 and scripts/build-arm64.sh"},
    {"python3-jinja2", "scripts/install-deps.sh (python3-jinja2, the chat-template oracle)"},
};
static_assert(std::size(kDeps) == size_t(Dep::DEP_COUNT));

// True when a missing dependency must fail the test: ESSAIM_REQUIRE_DEPS=1, or CI=true|1 (a CI service's
// convention) unless ESSAIM_REQUIRE_DEPS=0 says otherwise.
inline bool deps_required() {
  const char* req = std::getenv("ESSAIM_REQUIRE_DEPS");
  if (req != nullptr && std::string_view(req) == "1") return true;
  if (req != nullptr && std::string_view(req) == "0") return false;
  const char* ci = std::getenv("CI");
  if (ci == nullptr) return false;
  const std::string_view v(ci);
  return v == "1" || v == "true" || v == "TRUE" || v == "True";
}

inline std::string missing_dep_message(Dep dep, std::string_view why, bool required) {
  const DepInfo& d = kDeps[size_t(dep)];
  std::string m = std::string(d.name) + " missing: " + std::string(why) + " (provided by " + d.provided_by + ")";
  if (required) {
    m += ". Dependencies are required here (CI=true or ESSAIM_REQUIRE_DEPS=1): a skipped test would count as "
         "passed, so this is a failure";
  }
  return m;
}

}  // namespace essaim::test_support

// `switch (0) case 0: default:` makes the macro one statement, safe inside an unbraced if/else.
#define ESSAIM_SKIP_MISSING_DEP(dep, why)                                                                   \
  switch (0)                                                                                                \
  case 0:                                                                                                   \
  default:                                                                                                  \
    if (const bool essaim_required_ = ::essaim::test_support::deps_required(); essaim_required_)           \
      GTEST_FAIL() << ::essaim::test_support::missing_dep_message((dep), (why), true);                     \
    else                                                                                                    \
      GTEST_SKIP() << ::essaim::test_support::missing_dep_message((dep), (why), false)

// Hardware: never a failure, CI or not.
#define ESSAIM_SKIP_MISSING_HARDWARE(why) \
  GTEST_SKIP() << "skipped: " << (why) << " (hardware this machine lacks: a skip under CI too)"
