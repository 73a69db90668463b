#include "core/huge_pages.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <span>
#include <sstream>
#include <string>

namespace essaim {
namespace {

bool parse_hex(std::string_view s, uintptr_t* v) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), *v, 16);
  return ec == std::errc() && end == s.data() + s.size();
}

// "7f3a72200000-7f3a72400000 r--s 00000000 fe:01 1234 /path": the range of a mapping's header line.
bool mapping_range(std::string_view line, uintptr_t* lo, uintptr_t* hi) {
  const size_t dash = line.find('-');
  const size_t space = line.find(' ');
  if (dash == std::string_view::npos || space == std::string_view::npos || dash > space) return false;
  return parse_hex(line.substr(0, dash), lo) && parse_hex(line.substr(dash + 1, space - dash - 1), hi) && *lo < *hi;
}

// "FilePmdMapped:      2048 kB" -> bytes.
bool field_kb(std::string_view line, std::string_view name, uint64_t* bytes) {
  if (line.substr(0, name.size()) != name || line.size() <= name.size() || line[name.size()] != ':') return false;
  std::string_view rest = line.substr(name.size() + 1);
  while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
  uint64_t kb = 0;
  const auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), kb);
  if (ec != std::errc() || std::string_view(end, size_t(rest.data() + rest.size() - end)) != " kB") return false;
  if (kb > UINT64_MAX / 1024) return false;
  *bytes = kb * 1024;
  return true;
}

}  // namespace

uint64_t file_pmd_mapped_bytes(std::string_view smaps, uintptr_t begin, uintptr_t end) {
  uint64_t total = 0;
  bool inside = false;
  while (!smaps.empty()) {
    const size_t nl = smaps.find('\n');
    const std::string_view line = smaps.substr(0, nl);
    smaps.remove_prefix(nl == std::string_view::npos ? smaps.size() : nl + 1);
    uintptr_t lo = 0, hi = 0;
    uint64_t bytes = 0;
    if (mapping_range(line, &lo, &hi))
      inside = lo >= begin && hi <= end;
    else if (inside && field_kb(line, "FilePmdMapped", &bytes))
      total = bytes > UINT64_MAX - total ? UINT64_MAX : total + bytes;  // saturates (no such kernel text)
  }
  return total;
}

uint64_t file_pmd_mapped_bytes(const void* p, size_t n) {
  std::ifstream in("/proc/self/smaps");
  if (!in) return 0;
  std::ostringstream text;
  text << in.rdbuf();
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const auto page = uintptr_t(sysconf(_SC_PAGESIZE));  // a mapping's last page is whole
  return file_pmd_mapped_bytes(text.str(), begin, (begin + n + page - 1) / page * page);
}

bool transparent_huge_pages_enabled() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string setting;
  if (!in || !std::getline(in, setting)) return false;
  return setting.find("[never]") == std::string::npos;
}

uint8_t touch_pages(std::span<const uint8_t> bytes, size_t stride) {
  uint8_t acc = 0;
  for (size_t i = 0; i < bytes.size(); i += stride) acc ^= bytes[i];
  return acc;
}

std::string HugePageReport::describe(const std::string& path) const {
  char line[512];
  const auto percent = [&](uint64_t huge) { return bytes ? 100.0 * double(huge) / double(bytes) : 0.0; };
  if (!error.empty()) {
    std::snprintf(line, sizeof line, "could not read %s again in 2 MiB pages (%s); it stays mapped as cached",
                  path.c_str(), error.c_str());
    return line;
  }
  if (!reread) return {};
  std::snprintf(line, sizeof line,
                "%s was cached in 4 KiB pages (%.0f %% in 2 MiB pages): dropped them and read the file again "
                "through its mapping in %.1f s, now %.0f %% in 2 MiB pages (weight streams need fewer TLB misses; "
                "--keep-page-cache skips this)",
                path.c_str(), percent(huge_before), seconds, percent(huge_after));
  return line;
}

HugePageReport map_in_huge_pages(const MappedFile& f) {
  constexpr size_t kHuge = size_t(2) << 20;
  HugePageReport r;
  const std::span<const uint8_t> bytes = f.bytes();
  r.bytes = bytes.size();
  if (!f.file_backed() || bytes.size() < 2 * kHuge || reinterpret_cast<uintptr_t>(bytes.data()) % kHuge != 0 ||
      !transparent_huge_pages_enabled())
    return r;  // a mapping the kernel did not align to 2 MiB gets no 2 MiB pages
  r.checked = true;
  volatile uint8_t sink = touch_pages(bytes, kHuge);
  r.huge_before = r.huge_after = file_pmd_mapped_bytes(bytes.data(), bytes.size());
  // Re-read unless nine tenths are in 2 MiB pages already: a qwen35moe decode with the file half in 4 KiB
  // pages ran at 61 tok/s (AVX2 kernels, Zen 5) against 80-83 once re-read, and the re-read is one read of
  // the file, once per page-cache lifetime.
  if (r.huge_before * 10 >= bytes.size() * 9) return r;
  const auto t0 = std::chrono::steady_clock::now();
  if (const Status s = f.drop_cached_pages(); !s) {
    r.error = s.message();
    return r;
  }
  // Faults alone, no MADV_WILLNEED: its readahead fills the cache in 4 KiB pages (31 % in 2 MiB pages
  // measured with it, 99 % without, on a 6 GB file).
  sink = sink ^ touch_pages(bytes, 4096);
  r.reread = true;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.huge_after = file_pmd_mapped_bytes(bytes.data(), bytes.size());
  return r;
}

}  // namespace essaim
