// Who a file belongs to: the model identity (SHA-256 of a full GGUF's header and tensor table) and
// streaming SHA-256 of files and byte ranges, for slice manifests (docs/invariants.md invariant 3).
//
//   ESSAIM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open("model.gguf"));
//   ModelIdentity id = model_identity(f);                  // hash of bytes [0, data_start)
//   std::string hex = digest_hex(id);                      // 64 lowercase hex digits
//   ESSAIM_ASSIGN_OR_RETURN(Sha256Digest d, sha256_file("slice.gguf"));
//
// The identity covers every metadata key and every tensor's name, type, shape and offset, so two files with
// the same identity carry the same model layout; it does not read the weights (hashing 70 GB to name a model
// would take a minute). Slices and backbone files record their source's identity under their own keys
// (docs/slicing.md); `source_model_identity` returns it for any of the three kinds of file.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"
#include "gguf/gguf_file.h"

struct evp_md_ctx_st;

namespace essaim {

using Sha256Digest = std::array<uint8_t, 32>;
using ModelIdentity = Sha256Digest;

// Incremental SHA-256 (OpenSSL EVP). update() any number of times, then finish() once.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void update(std::span<const uint8_t> bytes);
  Sha256Digest finish();

 private:
  evp_md_ctx_st* ctx_ = nullptr;
  bool finished_ = false;
};

Sha256Digest sha256(std::span<const uint8_t> bytes);

// SHA-256 of `length` bytes of a file from `offset` (to the end when length is nullopt), read in large
// chunks. An error when the file cannot be read or is shorter than the range.
Result<Sha256Digest> sha256_file(const std::string& path, uint64_t offset = 0,
                                 std::optional<uint64_t> length = std::nullopt);

// SHA-256 of the file's bytes [0, data_start): magic, version, counts, every KV, every tensor info and the
// padding before the data. The same for a full model however it is later cut.
ModelIdentity model_identity(const GgufFile& f);

// The identity of the full model a file stands for: a slice's essaim.slice.source_model, a backbone file's
// essaim.backbone.source_model, else (a full model) model_identity(f). Errors on a malformed recorded value.
Result<ModelIdentity> source_model_identity(const GgufFile& f);

std::string digest_hex(std::span<const uint8_t> digest);  // lowercase
// Exactly 64 hex digits (either case) -> digest; nullopt otherwise.
std::optional<Sha256Digest> digest_from_hex(std::string_view hex);

}  // namespace essaim
