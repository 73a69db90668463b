#include "core/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace essaim {

namespace {

// An open regular file: its descriptor, closed when this goes, and its size.
struct OpenFile {
  int fd = -1;
  size_t size = 0;
  OpenFile() = default;
  OpenFile(OpenFile&& o) noexcept : fd(o.fd), size(o.size) { o.fd = -1; }
  OpenFile(const OpenFile&) = delete;
  OpenFile& operator=(const OpenFile&) = delete;
  ~OpenFile() {
    if (fd >= 0) ::close(fd);
  }
};

Result<OpenFile> open_regular_file(const std::string& path) {
  OpenFile f;
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (f.fd < 0) return Status::error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (fstat(f.fd, &st) != 0) return Status::error("cannot stat '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::error("'" + path + "' is not a regular file");
  f.size = size_t(st.st_size);
  return f;
}

}  // namespace

Result<MappedFile> MappedFile::open(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(const OpenFile file, open_regular_file(path));
  MappedFile f;
  f.path_ = path;
  f.size_ = file.size;
  if (f.size_ > 0) {
    void* p = mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, file.fd, 0);
    if (p == MAP_FAILED) return Status::error("cannot map '" + path + "': " + std::strerror(errno));
    f.data_ = static_cast<const uint8_t*>(p);
    f.owned_ = true;
    f.file_backed_ = true;
  }
  return f;
}

Result<MappedFile> MappedFile::read(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(const OpenFile file, open_regular_file(path));
  MappedFile f;
  f.path_ = path;
  f.size_ = file.size;
  if (f.size_ == 0) return f;
  void* p = mmap(nullptr, f.size_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return Status::error("cannot allocate " + std::to_string(f.size_) + " bytes for '" + path +
                         "': " + std::strerror(errno));
  // No MADV_HUGEPAGE: its synchronous compaction made a 3 GB read take 2.6–6.6 s instead of 1.3–1.6 s on
  // the machine measured, for no decode speed the noise could show (docs/engine.md).
  auto* bytes = static_cast<uint8_t*>(p);
  size_t done = 0;
  constexpr size_t kChunk = size_t(64) << 20;
  while (done < f.size_) {
    const ssize_t n = ::pread(file.fd, bytes + done, std::min(kChunk, f.size_ - done), off_t(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "the file ended early (it changed while being read)";
      munmap(p, f.size_);
      return Status::error("cannot read '" + path + "' at byte " + std::to_string(done) + ": " + why);
    }
    done += size_t(n);
  }
  mprotect(p, f.size_, PROT_READ);  // as read-only as a mapping of the file
  f.data_ = bytes;
  f.owned_ = true;
  return f;
}

MappedFile MappedFile::borrow(std::span<const uint8_t> bytes) {
  MappedFile f;
  f.data_ = bytes.data();
  f.size_ = bytes.size();
  f.path_ = "<memory>";
  return f;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (owned_ && data_) munmap(const_cast<uint8_t*>(data_), size_);
    data_ = o.data_;
    size_ = o.size_;
    owned_ = o.owned_;
    file_backed_ = o.file_backed_;
    path_ = std::move(o.path_);
    o.data_ = nullptr;
    o.size_ = 0;
    o.owned_ = false;
    o.file_backed_ = false;
  }
  return *this;
}

MappedFile::~MappedFile() {
  if (owned_ && data_) munmap(const_cast<uint8_t*>(data_), size_);
}

Status MappedFile::lock() {
  if (!data_) return Status::ok();
  if (mlock(data_, size_) != 0)
    return Status::error("mlock of '" + path_ + "' failed: " + std::strerror(errno) +
                         " (raise RLIMIT_MEMLOCK or drop --mlock)");
  return Status::ok();
}

void MappedFile::advise_willneed(size_t offset, size_t length) const {
  if (!owned_ || offset >= size_) return;
  const size_t page = size_t(sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size_, offset + length);
  madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_WILLNEED);
}

Status MappedFile::drop_cached_pages() const {
  if (!file_backed_ || !data_) return Status::ok();
  // A shared mapping of a file: MADV_DONTNEED removes this process's page table entries, never the data.
  if (madvise(const_cast<uint8_t*>(data_), size_, MADV_DONTNEED) != 0)
    return Status::error("cannot unmap the pages of '" + path_ + "': " + std::strerror(errno));
  ESSAIM_ASSIGN_OR_RETURN(const OpenFile file, open_regular_file(path_));
  const int rc = posix_fadvise(file.fd, 0, 0, POSIX_FADV_DONTNEED);
  if (rc != 0) return Status::error("cannot drop the cached pages of '" + path_ + "': " + std::strerror(rc));
  return Status::ok();
}

}  // namespace essaim
