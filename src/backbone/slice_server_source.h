// Where the hot-expert cache (backbone/hot_expert_cache.h) gets one expert's bytes: the coordinator's slice
// server (docs/market.md, "Downloads"), by HTTP Range requests into the slice file that holds it — first the
// slice's GGUF header (to learn where the expert's slabs lie and what digest the slice recorded), then
// each slab. Nothing here trusts the answers: the header is parsed by the hardened GGUF reader and must be
// a slice of this model holding the expert; the bytes are checked against the digest by the cache.
//
//   std::vector<SliceRef> slices = ...;              // from the coordinator's catalogue
//   auto source = std::make_unique<SliceServerSource>(model_identity, slices,
//       [&](const std::string& target, uint64_t offset, uint64_t length) {
//         return node::fetch_byte_range(url, token, target, offset, length); });
//   HotExpertCache cache(std::move(source), options);
//
// The fetch function is injected so that the backbone library links no HTTP client (the CLI passes
// node::fetch_byte_range).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "backbone/hot_expert_cache.h"
#include "slice/model_identity.h"

namespace essaim::backbone {

struct SliceRef {  // one catalogue entry: one layer, a contiguous expert range
  uint32_t layer = 0;
  uint32_t expert_first = 0;
  uint32_t expert_count = 0;
  std::string target;  // the path on the coordinator ("/slices/NAME")
  uint64_t bytes = 0;  // the whole file's length
};

// Bytes [offset, offset + length) of the file at `target`, exactly that many, or an error.
using RangeFetch = std::function<Result<std::vector<uint8_t>>(const std::string& target, uint64_t offset, uint64_t length)>;

class SliceServerSource final : public HotExpertSource {
 public:
  SliceServerSource(const ModelIdentity& model, std::vector<SliceRef> slices, RangeFetch fetch);
  Result<uint64_t> expert_bytes(int32_t layer, int32_t expert) override;
  Result<FetchedExpert> fetch(int32_t layer, int32_t expert) override;

  uint64_t header_fetches() const { return header_fetches_; }

 private:
  struct Slab {
    GgmlType type = GgmlType::F32;
    int64_t cols = 0, rows = 0;
    uint64_t file_offset = 0;  // of the tensor's data
    uint64_t expert_bytes = 0;  // one expert's slab
  };
  struct Header {
    bool fused = false;
    std::vector<Slab> slabs;  // digest order: gate, up, down or gate_up, down
    std::vector<Sha256Digest> digests;  // recorded, expert_count of them
    uint64_t expert_bytes = 0;
  };
  Result<const SliceRef*> slice_of(int32_t layer, int32_t expert) const;
  Result<const Header*> header(const SliceRef& s);

  ModelIdentity model_;
  std::vector<SliceRef> slices_;
  RangeFetch fetch_;
  std::map<std::string, Header> headers_;  // by target
  uint64_t header_fetches_ = 0;
};

}  // namespace essaim::backbone
