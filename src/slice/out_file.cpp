#include "slice/out_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <future>

#include "gguf/gguf_layout.h"
#include "gguf/gguf_writer.h"

namespace essaim {
namespace {

// Large enough that per-call overhead vanishes next to the memcpy into the page cache, small enough that
// read-ahead of the next chunk overlaps the write of this one.
constexpr size_t kCopyChunk = size_t(8) << 20;
constexpr uint32_t kGgufVersion = 3;

template <typename T>
void put(std::string& out, T v) {
  char raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));  // GGUF is little-endian, as is every host essaim runs on
  out.append(raw, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.append(s);
}

// One scalar of type t from the widened payloads of a GgufValue (docs/reference.md 1.3).
void put_scalar(std::string& out, GgufValueType t, uint64_t u, int64_t i, double f) {
  switch (t) {
    case GgufValueType::UINT8: put<uint8_t>(out, uint8_t(u)); return;
    case GgufValueType::INT8: put<int8_t>(out, int8_t(i)); return;
    case GgufValueType::UINT16: put<uint16_t>(out, uint16_t(u)); return;
    case GgufValueType::INT16: put<int16_t>(out, int16_t(i)); return;
    case GgufValueType::UINT32: put<uint32_t>(out, uint32_t(u)); return;
    case GgufValueType::INT32: put<int32_t>(out, int32_t(i)); return;
    case GgufValueType::FLOAT32: put<float>(out, float(f)); return;
    case GgufValueType::BOOL: put<uint8_t>(out, u != 0 ? 1 : 0); return;
    case GgufValueType::UINT64: put<uint64_t>(out, u); return;
    case GgufValueType::INT64: put<int64_t>(out, i); return;
    case GgufValueType::FLOAT64: put<double>(out, f); return;
    case GgufValueType::STRING: case GgufValueType::ARRAY: case GgufValueType::COUNT: break;
  }
  ESSAIM_CHECK(false && "not a fixed-size GGUF type");
}

void put_value(std::string& out, const GgufValue& v) {
  put<int32_t>(out, int32_t(v.type));
  if (v.type == GgufValueType::STRING) return put_string(out, v.str);
  if (v.type != GgufValueType::ARRAY) return put_scalar(out, v.type, v.u, v.i, v.f);
  put<int32_t>(out, int32_t(v.elem_type));
  put<uint64_t>(out, v.array_size());
  for (uint64_t k = 0; k < v.array_size(); ++k) {
    switch (v.elem_type) {
      case GgufValueType::STRING: put_string(out, v.strs[k]); break;
      case GgufValueType::FLOAT32: case GgufValueType::FLOAT64: put_scalar(out, v.elem_type, 0, 0, v.floats[k]); break;
      case GgufValueType::INT8: case GgufValueType::INT16: case GgufValueType::INT32: case GgufValueType::INT64:
        put_scalar(out, v.elem_type, 0, v.ints[k], 0);
        break;
      default: put_scalar(out, v.elem_type, v.uints[k], 0, 0); break;
    }
  }
}

uint64_t align_up(uint64_t x, uint32_t alignment) {
  uint64_t out = 0;
  ESSAIM_CHECK(gguf_align_up(x, alignment, &out));
  return out;
}

// SHA-256 of the file write_out_file produces, from the header and the source bytes (no file read).
Sha256Digest hash_out_file(const OutFile& f, const std::string& header) {
  static const uint8_t kZeros[4096] = {};
  Sha256 h;
  h.update({reinterpret_cast<const uint8_t*>(header.data()), header.size()});
  for (const OutTensor& t : f.tensors) {
    for (size_t off = 0; off < t.bytes.size(); off += kCopyChunk)
      h.update(t.bytes.subspan(off, std::min(kCopyChunk, t.bytes.size() - off)));
    for (uint64_t pad = align_up(t.bytes.size(), f.alignment) - t.bytes.size(); pad > 0;) {
      const size_t n = size_t(std::min<uint64_t>(pad, sizeof(kZeros)));
      h.update({kZeros, n});
      pad -= n;
    }
  }
  return h.finish();
}

// The first n bytes of the file at path, or an error.
Result<std::string> read_prefix(const std::string& path, size_t n) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Status::error("cannot open '" + path + "': " + std::strerror(errno));
  std::string buf(n, '\0');
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::pread(fd, buf.data() + got, n - got, off_t(got));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += size_t(r);
  }
  ::close(fd);
  if (got != n) return Status::error("cannot read back the header of '" + path + "'");
  return buf;
}

}  // namespace

std::string OutFile::header() const {
  std::string h;
  h.append("GGUF", 4);
  put<uint32_t>(h, kGgufVersion);
  put<int64_t>(h, int64_t(tensors.size()));
  put<int64_t>(h, int64_t(kvs.size()));
  for (const GgufKv& kv : kvs) {
    put_string(h, kv.key);
    put_value(h, kv.value);
  }
  uint64_t offset = 0;
  for (const OutTensor& t : tensors) {
    put_string(h, t.name);
    put<uint32_t>(h, uint32_t(t.ne.size()));
    for (int64_t e : t.ne) put<int64_t>(h, e);
    put<int32_t>(h, int32_t(t.type));
    put<uint64_t>(h, offset);
    offset += align_up(t.bytes.size(), alignment);
  }
  h.resize(align_up(h.size(), alignment), '\0');
  return h;
}

uint64_t OutFile::size() const {
  uint64_t n = header().size();
  for (const OutTensor& t : tensors) n += align_up(t.bytes.size(), alignment);
  return n;
}

Result<WrittenFile> write_out_file(const OutFile& f, const std::string& path, bool hash, Progress* progress) {
  GgufWriter w(f.alignment);
  for (const GgufKv& kv : f.kvs) w.set_value(kv.key, kv.value);
  for (const OutTensor& t : f.tensors) w.add_tensor(t.name, t.type, t.ne);
  const std::string part = path + ".part";
  ESSAIM_RETURN_IF_ERROR(w.begin(part));

  const std::string header = f.header();
  // Hashing reads the same source pages as the copy below, on another core; joined before returning.
  std::future<Sha256Digest> digest;
  if (hash) digest = std::async(std::launch::async, [&f, &header] { return hash_out_file(f, header); });

  const uint8_t* base = f.source != nullptr ? f.source->mapping().bytes().data() : nullptr;
  for (const OutTensor& t : f.tensors) {
    for (size_t off = 0; off < t.bytes.size(); off += kCopyChunk) {
      const std::span<const uint8_t> chunk = t.bytes.subspan(off, std::min(kCopyChunk, t.bytes.size() - off));
      // Ask for the next chunk while this one is written, so a cold source streams at disk speed.
      if (base != nullptr && off + kCopyChunk < t.bytes.size())
        f.source->mapping().advise_willneed(size_t(chunk.data() + kCopyChunk - base),
                                            std::min(kCopyChunk, t.bytes.size() - off - kCopyChunk));
      ESSAIM_RETURN_IF_ERROR(w.write_tensor_data(chunk));
      if (progress != nullptr) progress->advance(chunk.size());
    }
  }
  ESSAIM_RETURN_IF_ERROR(w.finish());
  uint64_t data_bytes = 0;
  for (const OutTensor& t : f.tensors) data_bytes += t.bytes.size();
  if (progress != nullptr) progress->advance(f.size() - data_bytes);  // the header and padding: done == size()

  WrittenFile out;
  out.path = path;
  struct stat st {};
  if (::stat(part.c_str(), &st) != 0) return Status::error("cannot stat '" + part + "': " + std::strerror(errno));
  out.bytes = uint64_t(st.st_size);
  // header() and size() mirror the writer's layout; the digest is only the file's digest while they do.
  ESSAIM_CHECK(out.bytes == f.size());
  ESSAIM_ASSIGN_OR_RETURN(const std::string written, read_prefix(part, header.size()));
  ESSAIM_CHECK(written == header);
  if (hash) out.sha256 = digest.get();

  if (std::rename(part.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(part.c_str());
    return Status::error("cannot rename '" + part + "' to '" + path + "': " + std::strerror(err));
  }
  return out;
}

}  // namespace essaim
