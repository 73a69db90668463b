// A GGUF file to be written as a copy of byte ranges of another: its metadata and, per tensor, the source
// bytes. Knows its exact size and header before anything is written (so a plan can list sizes), and writes
// itself while a second thread hashes the same bytes (so a slice costs max(copy, SHA-256), not their sum).
//
//   OutFile f{.alignment = src.alignment(), .source = &src};
//   f.kvs.push_back({"general.architecture", value});
//   f.tensors.push_back({.name = t.name, .type = t.type, .ne = {t.ne[0], t.ne[1], 4}, .bytes = t.bytes().first(n)});
//   ESSAIM_ASSIGN_OR_RETURN(WrittenFile w, write_out_file(f, "out.gguf"));    // w.bytes == f.size(), w.sha256
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/progress.h"
#include "core/status.h"
#include "gguf/gguf_file.h"
#include "slice/model_identity.h"

namespace essaim {

struct OutTensor {
  std::string name;
  GgmlType type = GgmlType::F32;
  std::vector<int64_t> ne = {};     // ggml order, as written (n_dims = ne.size())
  std::span<const uint8_t> bytes;   // the tensor's data, usually into the source mapping
};

struct OutFile {
  uint32_t alignment = 32;          // with general.alignment in kvs when it is not 32
  std::vector<GgufKv> kvs = {};     // in file order
  std::vector<OutTensor> tensors = {};  // in file (= data) order
  const GgufFile* source = nullptr; // the mapping `bytes` point into, for read-ahead hints; may be null

  // Exactly the bytes GgufWriter writes before the first tensor's data (docs/reference.md 1.9): header, KVs,
  // tensor infos with padded running-sum offsets, zero padding to the alignment.
  std::string header() const;
  uint64_t size() const;  // exact size of the file write_out_file produces
};

struct WrittenFile {
  std::string path;
  uint64_t bytes = 0;
  Sha256Digest sha256{};  // of the whole file; zero when not hashed
};

// Streams `f` to path through GgufWriter (via path.part, renamed when complete, so a crash never leaves a
// plausible-looking file) in large chunks straight from the source mapping. With hash = true a second thread
// computes the file's SHA-256 from the same in-memory bytes meanwhile; the header actually written is read
// back and compared with header(), so the digest is the digest of the file on disk.
// `progress` (may be null) advances as tensor data is written, by f.size() in all.
Result<WrittenFile> write_out_file(const OutFile& f, const std::string& path, bool hash = true,
                                   Progress* progress = nullptr);

}  // namespace essaim
