// This process's resident memory, for tests that bound what a hostile client may cost a listener.
#pragma once

#include <cstdio>

namespace essaim::test_support {

// VmRSS from /proc/self/status in KiB; -1 when it cannot be read.
inline long rss_kib() {
  std::FILE* f = std::fopen("/proc/self/status", "r");
  if (f == nullptr) return -1;
  char line[256];
  long kib = -1;
  while (std::fgets(line, sizeof line, f) != nullptr)
    if (std::sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
  std::fclose(f);
  return kib;
}

}  // namespace essaim::test_support
