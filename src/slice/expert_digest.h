// Content digests of routed experts: the identity of the weight bytes themselves (docs/slicing.md,
// "Expert digests"). The model identity names a layout; these name the bytes, so a backbone can refuse a
// worker whose slices were cut from another model of the same shape (docs/protocol.md, WEIGHTS).
//
//   Sha256Digest d = expert_digest(layer, j);                    // expert j of a MoeLayer (local index)
//   Sha256Digest h = holding_digest(std::span(digests));         // a range: SHA-256 over its experts' digests
//
//   ESSAIM_ASSIGN_OR_RETURN(auto cache, ExpertDigestCache::open(model_file, layout));   // the backbone
//   ESSAIM_ASSIGN_OR_RETURN(Sha256Digest mine, cache->holding(7, 32, 32));  // hashes only what it lacks
//
// expert_digest(L, e) = SHA-256 of expert e's slabs in the order gate, up, down (a fused gate_up slab is
// gate rows then up rows, i.e. the same bytes as gate then up). A holding's digest is SHA-256 of the
// concatenated 32-byte digests of its experts, so any range can be checked from per-expert digests without
// re-reading the weights. The cache keeps per-expert digests of a full model in a file beside it, keyed
// on the model identity, the file size and its mtime, and fills it lazily: only the experts some worker
// claims are ever hashed, once.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice/model_identity.h"

namespace essaim {

// The digest of expert `local_expert` (index along ne[2] of the layer's tensors).
Sha256Digest expert_digest(const MoeLayer& layer, uint32_t local_expert);
Sha256Digest holding_digest(std::span<const Sha256Digest> expert_digests);

// Per-expert digests of a full model, computed on demand and kept in `<model>.essaim-digests.json`.
// Thread-safe. When the cache file cannot be written (a read-only directory) the digests live in memory.
class ExpertDigestCache {
 public:
  // `file` and `layout` must outlive the cache. cache_path empty: `file.path() + ".essaim-digests.json"`.
  static Result<std::unique_ptr<ExpertDigestCache>> open(const GgufFile& file, const MoeLayout& layout,
                                                         std::string cache_path = {});

  // The digest of experts [first, first + count) of `layer`; hashes (and records) the experts not yet known.
  // An error for a layer without routed experts or a range beyond the model's experts.
  Result<Sha256Digest> holding(uint32_t layer, uint32_t first, uint32_t count);

  uint64_t experts_hashed() const;  // by this process (the rest came from the cache file)
  const std::string& cache_path() const { return path_; }

 private:
  ExpertDigestCache(const GgufFile& file, const MoeLayout& layout, std::string path);
  void load();   // caller holds mu_; ignores a file of another model, size or mtime
  void save();   // caller holds mu_; best effort, atomic (write + rename)

  const GgufFile& file_;
  const MoeLayout& layout_;
  std::string path_;
  uint64_t file_bytes_ = 0;
  int64_t mtime_ns_ = 0;
  mutable std::mutex mu_;
  std::vector<std::vector<Sha256Digest>> digests_;  // [layout_.layers index][expert]; guarded by mu_
  std::vector<std::vector<bool>> known_;            // guarded by mu_
  uint64_t hashed_ = 0;                             // guarded by mu_
};

}  // namespace essaim
