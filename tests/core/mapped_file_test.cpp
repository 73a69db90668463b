#include "core/mapped_file.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "temp_dir.h"

namespace essaim {
namespace {

std::string write_file(const std::string& dir, const char* name, const std::vector<uint8_t>& bytes) {
  const std::string path = dir + "/" + name;
  std::FILE* f = std::fopen(path.c_str(), "wb");
  EXPECT_NE(f, nullptr) << path;
  if (!bytes.empty()) EXPECT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
  std::fclose(f);
  return path;
}

// read() (--no-mmap) holds exactly the bytes open() maps, for sizes around the page and chunk sizes.
TEST(MappedFile, ReadHoldsTheBytesTheMappingShows) {
  const std::string dir = testing::make_temp_dir("mapped-file");
  for (size_t size : {size_t(1), size_t(4095), size_t(4097), size_t(3) << 20}) {
    std::vector<uint8_t> bytes(size);
    for (size_t i = 0; i < size; ++i) bytes[i] = uint8_t((i * 2654435761u) >> 13);
    const std::string path = write_file(dir, "f.bin", bytes);
    Result<MappedFile> mapped = MappedFile::open(path);
    Result<MappedFile> copy = MappedFile::read(path);
    ASSERT_TRUE(mapped.is_ok()) << mapped.status().message();
    ASSERT_TRUE(copy.is_ok()) << copy.status().message();
    ASSERT_EQ(copy->size(), size);
    EXPECT_NE(copy->bytes().data(), mapped->bytes().data());
    EXPECT_TRUE(std::equal(copy->bytes().begin(), copy->bytes().end(), bytes.begin())) << size;
    EXPECT_EQ(copy->path(), path);
    (void)copy->lock();  // mlock may be refused (RLIMIT_MEMLOCK); either way it must not disturb the bytes
    // Moving keeps the one owner: the moved-from object releases nothing.
    MappedFile moved = std::move(*copy);
    EXPECT_EQ(moved.size(), size);
    EXPECT_EQ(moved.bytes()[size - 1], bytes[size - 1]);
  }
}

TEST(MappedFile, ReadOfAnEmptyFileIsEmpty) {
  const std::string path = write_file(testing::make_temp_dir("mapped-empty"), "empty.bin", {});
  Result<MappedFile> copy = MappedFile::read(path);
  ASSERT_TRUE(copy.is_ok()) << copy.status().message();
  EXPECT_EQ(copy->size(), 0u);
}

TEST(MappedFile, ReadRefusesWhatIsNotARegularFile) {
  const std::string dir = testing::make_temp_dir("mapped-bad");
  Result<MappedFile> missing = MappedFile::read(dir + "/absent.gguf");
  ASSERT_FALSE(missing.is_ok());
  EXPECT_NE(missing.status().message().find("cannot open"), std::string::npos) << missing.status().message();
  Result<MappedFile> directory = MappedFile::read(dir);
  ASSERT_FALSE(directory.is_ok());
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos) << directory.status().message();
}

}  // namespace
}  // namespace essaim
