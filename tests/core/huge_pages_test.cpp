#include "core/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "core/mapped_file.h"
#include "temp_dir.h"

namespace essaim {
namespace {

// Two file mappings and an anonymous one, as /proc/self/smaps prints them (fields trimmed).
constexpr const char* kSmaps =
    "7f0000000000-7f0000400000 r--s 00000000 fe:01 131 /var/tmp/model.gguf\n"
    "Size:               4096 kB\n"
    "Rss:                4096 kB\n"
    "FilePmdMapped:      2048 kB\n"
    "VmFlags: rd sh mr mw me ms sd\n"
    "7f0000400000-7f0000600000 r--s 00400000 fe:01 131 /var/tmp/model.gguf\n"
    "FilePmdMapped:      2048 kB\n"
    "7f0000600000-7f0000800000 rw-p 00000000 00:00 0\n"
    "AnonHugePages:      2048 kB\n"
    "FilePmdMapped:         0 kB\n";

TEST(HugePages, SumsTheFilePmdMappedFieldsOfTheMappingsInTheRange) {
  EXPECT_EQ(file_pmd_mapped_bytes(kSmaps, 0x7f0000000000, 0x7f0000600000), uint64_t(4096) << 10);
  EXPECT_EQ(file_pmd_mapped_bytes(kSmaps, 0x7f0000000000, 0x7f0000400000), uint64_t(2048) << 10);
  EXPECT_EQ(file_pmd_mapped_bytes(kSmaps, 0x7f0000400000, 0x7f0000800000), uint64_t(2048) << 10);
  // A mapping that starts before the range or ends after it is not the range's.
  EXPECT_EQ(file_pmd_mapped_bytes(kSmaps, 0x7f0000000000, 0x7f00003ff000), 0u);
  EXPECT_EQ(file_pmd_mapped_bytes(kSmaps, 0x7f0000001000, 0x7f0000600000), uint64_t(2048) << 10);
}

TEST(HugePages, MalformedLinesAreSkipped) {
  const std::string text =
      "7f0000000000-7f0000400000 r--s 00000000 fe:01 131 /m\n"
      "FilePmdMapped: 12 MB\n"            // not kB
      "FilePmdMapped:\n"                  // no number
      "FilePmdMappedX: 4 kB\n"            // another name
      "FilePmdMapped: 99999999999999999999 kB\n"  // not a 64-bit number
      "FilePmdMapped:    8 kB\n"
      "zz-7f0000400000 r--s\n"            // not a range: the previous mapping goes on
      "FilePmdMapped:    4 kB\n"
      "7f0000400000-7f0000300000 r--s\n"  // an empty range is no header either
      "FilePmdMapped:    4 kB";           // no final newline
  EXPECT_EQ(file_pmd_mapped_bytes(text, 0x7f0000000000, 0x7f0000400000), uint64_t(16) << 10);
  EXPECT_EQ(file_pmd_mapped_bytes("", 0, UINTPTR_MAX), 0u);
  EXPECT_EQ(file_pmd_mapped_bytes("\n\n-\n - \n", 0, UINTPTR_MAX), 0u);
}

// The log line says what happened, and nothing when nothing did.
TEST(HugePages, TheReportSaysWhatWasDone) {
  HugePageReport r;
  r.checked = true;
  r.bytes = 4 << 20;
  r.huge_before = 1 << 20;
  EXPECT_EQ(r.describe("m.gguf"), "");
  r.reread = true;
  r.huge_after = 4 << 20;
  r.seconds = 1.5;
  EXPECT_EQ(r.describe("m.gguf"),
            "m.gguf was cached in 4 KiB pages (25 % in 2 MiB pages): dropped them and read the file again through "
            "its mapping in 1.5 s, now 100 % in 2 MiB pages (weight streams need fewer TLB misses; "
            "--keep-page-cache skips this)");
  r.error = "cannot drop the cached pages of 'm.gguf': Invalid argument";
  EXPECT_NE(r.describe("m.gguf").find("it stays mapped as cached"), std::string::npos) << r.describe("m.gguf");
}

// Dropping the cached pages and touching them again changes no byte, whatever the kernel then maps them in;
// the report stays within the file. Whether 2 MiB pages come back depends on the kernel and file system,
// so that is measured (essaim bench prints it), not asserted.
TEST(HugePages, ReadingTheFileAgainKeepsEveryByte) {
  const std::string dir = testing::make_temp_dir("huge-pages");
  const std::string path = dir + "/f.bin";
  const size_t size = (size_t(9) << 20) + 123;
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; ++i) bytes[i] = uint8_t((i * 2654435761u) >> 11);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(bytes.data(), 1, size, f), size);
  std::fclose(f);

  Result<MappedFile> mapped = MappedFile::open(path);
  ASSERT_TRUE(mapped.is_ok()) << mapped.status().message();
  ASSERT_TRUE(mapped->file_backed());
  ASSERT_TRUE(mapped->drop_cached_pages().is_ok());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), mapped->bytes().begin()));
  const HugePageReport r = map_in_huge_pages(*mapped);
  EXPECT_TRUE(r.error.empty()) << r.error;
  EXPECT_EQ(r.bytes, size);
  EXPECT_LE(r.huge_after, size);
  EXPECT_TRUE(r.checked || !r.reread);
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), mapped->bytes().begin()));
  std::printf("map_in_huge_pages on %zu bytes: checked %d, reread %d, %llu -> %llu bytes in 2 MiB pages\n", size,
              int(r.checked), int(r.reread), static_cast<unsigned long long>(r.huge_before),
              static_cast<unsigned long long>(r.huge_after));

  // Bytes read into memory or borrowed are no file mapping: nothing to drop, nothing done.
  Result<MappedFile> copy = MappedFile::read(path);
  ASSERT_TRUE(copy.is_ok());
  EXPECT_FALSE(copy->file_backed());
  EXPECT_TRUE(copy->drop_cached_pages().is_ok());
  const HugePageReport none = map_in_huge_pages(*copy);
  EXPECT_FALSE(none.checked);
  EXPECT_EQ(none.describe(path), "");
  EXPECT_FALSE(MappedFile::borrow(bytes).file_backed());
  EXPECT_TRUE(std::equal(bytes.begin(), bytes.end(), copy->bytes().begin()));
}

}  // namespace
}  // namespace essaim
