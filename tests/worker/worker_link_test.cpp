// docs/invariants.md invariant 4, checked on the binary: essaim-worker defines none of the functions that the model
// library (architectures, attention, caches) or the text library (tokenizer, chat template, sampler) define.
// The configure step checks the same on the library graph (src/worker/CMakeLists.txt); this checks what
// actually got linked. The main essaim binary, which does link them, is the control: the same check on it
// must find them, or the test would prove nothing.
#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <sstream>
#include <string>

namespace {

// Defined, strong text symbols ("T"): functions a library itself defines. Weak symbols (inline functions and
// templates from shared headers, e.g. essaim::Status) may legitimately appear in both sides.
std::set<std::string> strong_text_symbols(const std::string& file) {
  std::set<std::string> out;
  const std::string cmd = "nm --defined-only --format=posix '" + file + "' 2>/dev/null";
  FILE* p = popen(cmd.c_str(), "r");
  EXPECT_NE(p, nullptr) << cmd;
  if (p == nullptr) return out;
  char line[8192];
  while (std::fgets(line, sizeof line, p)) {
    std::istringstream s(line);
    std::string name, type;
    if (s >> name >> type && type == "T") out.insert(name);
  }
  EXPECT_EQ(pclose(p), 0) << cmd;
  return out;
}

size_t shared(const std::set<std::string>& a, const std::set<std::string>& b, std::string* example) {
  size_t n = 0;
  for (const std::string& s : a)
    if (b.count(s) && n++ == 0) *example = s;
  return n;
}

TEST(WorkerLink, WorkerBinaryHasNoModelOrTextCode) {
  const std::set<std::string> worker = strong_text_symbols(ESSAIM_WORKER_BINARY);
  const std::set<std::string> full = strong_text_symbols(ESSAIM_FULL_BINARY);
  const std::set<std::string> moe = strong_text_symbols(ESSAIM_MOE_LIBRARY);
  // The worker binary carries the expert FFN: the symbol sets are real.
  std::string example;
  ASSERT_GT(shared(worker, moe, &example), 0u) << "essaim-worker lacks moe's functions; nm output unusable?";

  for (const char* lib : {ESSAIM_MODEL_LIBRARY, ESSAIM_TEXT_LIBRARY}) {
    const std::set<std::string> forbidden = strong_text_symbols(lib);
    ASSERT_GT(forbidden.size(), 20u) << lib;
    EXPECT_GT(shared(full, forbidden, &example), 0u) << "control: essaim links " << lib;
    const size_t n = shared(worker, forbidden, &example);
    EXPECT_EQ(n, 0u) << "essaim-worker defines " << n << " functions of " << lib << ", e.g. " << example;
  }
}

// The phone build joins the market through a relay by itself: essaim-worker carries the market client and
// the relay client, and none of the coordinator's server code.
TEST(WorkerLink, WorkerBinaryCarriesTheMarketAndRelayClientsButNoCoordinator) {
  const std::set<std::string> worker = strong_text_symbols(ESSAIM_WORKER_BINARY);
  std::string example;
  for (const char* lib : {ESSAIM_NODE_LIBRARY, ESSAIM_RELAY_LIBRARY}) {
    EXPECT_GT(shared(worker, strong_text_symbols(lib), &example), 0u) << "essaim-worker lacks the functions of " << lib;
  }
#ifdef ESSAIM_COORD_LIBRARY
  const std::set<std::string> coord = strong_text_symbols(ESSAIM_COORD_LIBRARY);
  ASSERT_GT(coord.size(), 20u);
  const size_t n = shared(worker, coord, &example);
  EXPECT_EQ(n, 0u) << "essaim-worker defines " << n << " functions of the coordinator, e.g. " << example;
#endif
}

}  // namespace
