// libFuzzer target for the /proc/self/smaps reader (core/huge_pages.h): any text sums to a count no larger
// than the text could describe and never crashes; the range comes from the first 16 bytes.
//
//   build-fuzz/fuzz/fuzz_smaps -max_total_time=60 fuzz/corpus/fuzz_smaps
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "core/huge_pages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  uintptr_t range[2] = {0, UINTPTR_MAX};
  if (size >= sizeof(range)) {
    std::memcpy(range, data, sizeof(range));
    data += sizeof(range);
    size -= sizeof(range);
  }
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const uint64_t all = essaim::file_pmd_mapped_bytes(text, 0, UINTPTR_MAX);
  const uint64_t part = essaim::file_pmd_mapped_bytes(text, range[0], range[1]);
  if (part > all) std::abort();  // a range's mappings are some of all mappings
  return 0;
}
