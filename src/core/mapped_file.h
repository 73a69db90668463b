// A read-only memory map of a whole file (the GGUF reader's and the worker's only view of weights).
//
//   ESSAIM_ASSIGN_OR_RETURN(MappedFile f, MappedFile::open(path));
//   std::span<const uint8_t> bytes = f.bytes();
//
// Zero-copy: pages are faulted in on first touch. lock() pins them (mlock) when asked to. read() instead
// copies the whole file into private anonymous memory (llama.cpp's --no-mmap): the file's size in RAM and
// one read of it at load, against weight streams that run faster on some machines (docs/engine.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace essaim {

class MappedFile {
 public:
  static Result<MappedFile> open(const std::string& path);
  // The whole file read into private anonymous memory, read-only once read. A read error, or a file that
  // shrinks while being read, is an error, and nothing stays allocated.
  static Result<MappedFile> read(const std::string& path);
  // Wraps caller-owned bytes (tests, fuzzers); the memory must outlive this object.
  static MappedFile borrow(std::span<const uint8_t> bytes);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const uint8_t> bytes() const { return {data_, size_}; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

  Status lock();  // mlock the whole mapping
  // Hint the kernel the range will be read soon / sequentially (madvise); no-op for borrowed bytes.
  void advise_willneed(size_t offset, size_t length) const;
  // True for a mapping of the file (open), false for bytes read into memory or borrowed.
  bool file_backed() const { return file_backed_; }
  // Unmaps this mapping's pages and asks the kernel to drop the file's clean pages from the page cache
  // (posix_fadvise DONTNEED; pages another process maps, or not yet written back, stay), so that the next
  // touches read the file again, through faults on this mapping. The bytes seen are the same. No-op unless
  // file_backed().
  Status drop_cached_pages() const;

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  bool owned_ = false;
  bool file_backed_ = false;
  std::string path_;
};

}  // namespace essaim
