// How much of a file mapping the kernel maps in 2 MiB pages, and a way to get more of it so mapped.
//
//   const uint64_t huge = file_pmd_mapped_bytes(f.bytes().data(), f.size());   // from /proc/self/smaps
//
// A decode step streams every dense weight once: mapped in 4 KiB pages, that is one TLB entry per 4 KiB and
// a page walk for most of them; in 2 MiB pages, one per 2 MiB. Whether a file mapping gets 2 MiB pages
// depends on how the page cache holds the file, not on the mapping: pages read in by faults on the mapping
// (readahead in large folios) are 2 MiB where aligned, while pages left by write(2) (a file just written or
// downloaded) are 4 KiB, and a mapping of them stays in 4 KiB pages for as long as they are cached; pages
// evicted under memory pressure and read back may come back either way (docs/engine.md, "The mapped file in
// 2 MiB pages").
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/mapped_file.h"

namespace essaim {

// The sum of the FilePmdMapped fields of the mappings (VMAs) of an smaps text that lie within
// [begin, end). Lines it does not know are skipped; a text without such mappings gives 0.
uint64_t file_pmd_mapped_bytes(std::string_view smaps, uintptr_t begin, uintptr_t end);

// The same for [p, p + n) in this process, from /proc/self/smaps; 0 when that cannot be read.
uint64_t file_pmd_mapped_bytes(const void* p, size_t n);

// True unless transparent huge pages are off in this kernel ("[never]" or no such setting).
bool transparent_huge_pages_enabled();

// Reads one byte every `stride` bytes (faulting the pages in); returns their xor so the reads stay.
uint8_t touch_pages(std::span<const uint8_t> bytes, size_t stride);

// What map_in_huge_pages found and did.
struct HugePageReport {
  bool checked = false;   // a file mapping, 2 MiB aligned, with transparent huge pages on
  bool reread = false;    // its cached pages were dropped and read again through the mapping
  uint64_t bytes = 0;     // the mapping's size
  uint64_t huge_before = 0, huge_after = 0;  // bytes in 2 MiB pages before and after
  double seconds = 0;     // the time the re-read took
  std::string error;      // why the cached pages could not be dropped (the mapping then stays as it was)
  // One line for the log when there is something to say (a re-read or an error), else empty.
  std::string describe(const std::string& path) const;
};

// Touches one byte per 2 MiB of a file mapping and, when less than 90 % of it is then mapped in 2 MiB pages,
// drops the file's cached pages (MappedFile::drop_cached_pages) and touches every page again, so the file
// is read anew in large folios: once per page-cache lifetime of the file, at the cost of one read of it.
// Changes no byte; does nothing to bytes read into memory or borrowed. A speed step only: it never fails
// a load (an error is reported in the result).
HugePageReport map_in_huge_pages(const MappedFile& f);

}  // namespace essaim
