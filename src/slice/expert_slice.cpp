#include "slice/expert_slice.h"

#include <algorithm>

#include "slice/expert_digest.h"

namespace essaim {
namespace {

// Required slice keys with their exact types: a slice comes off the network, so a key of the wrong type is
// as bad as a missing one.
class SliceKeys {
 public:
  SliceKeys(const GgufFile& f, std::string where) : f_(f), where_(std::move(where)) {}

  Result<uint32_t> u32(std::string_view key) const {
    if (const std::optional<uint32_t> v = f_.get_u32(key)) return *v;
    return missing(key, "UINT32");
  }
  Result<std::string> str(std::string_view key) const {
    if (std::optional<std::string> v = f_.get_string(key)) return std::move(*v);
    return missing(key, "STRING");
  }
  Result<bool> boolean(std::string_view key) const {
    if (const std::optional<bool> v = f_.get_bool(key)) return *v;
    return missing(key, "BOOL");
  }

 private:
  Status missing(std::string_view key, const char* type) const {
    const GgufValue* v = f_.find_kv(key);
    if (v == nullptr) return Status::error(where_ + ": missing key " + std::string(key));
    return Status::error(where_ + ": key " + std::string(key) + " is " + std::string(gguf_value_type_name(v->type)) +
                         ", expected " + type);
  }
  const GgufFile& f_;
  std::string where_;
};

}  // namespace

Result<ExpertSlice> ExpertSlice::open(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path));
  return from_gguf(std::move(f));
}

// Checked after the ranges: layer_count × expert_count is then bounded by the tensors' real sizes.
Status ExpertSlice::read_digests(const GgufFile& file, const std::string& where) {
  const auto fail = [&where](const std::string& msg) -> Status { return Status::error(where + ": " + msg); };
  const std::vector<std::string>* hex = file.get_string_array(kSliceKeyExpertSha256);
  if (hex == nullptr)
    return fail("missing key " + std::string(kSliceKeyExpertSha256) + " (an array of STRING); cut the slice again");
  const uint64_t n_digests = uint64_t(layer_count_) * expert_count_;
  if (hex->size() != n_digests)
    return fail(std::string(kSliceKeyExpertSha256) + " holds " + std::to_string(hex->size()) + " digests; " +
                std::to_string(layer_count_) + " layers of " + std::to_string(expert_count_) + " experts need " +
                std::to_string(n_digests));
  digests_.reserve(hex->size());
  for (size_t i = 0; i < hex->size(); ++i) {
    const std::optional<Sha256Digest> d = digest_from_hex((*hex)[i]);
    if (!d) return fail(std::string(kSliceKeyExpertSha256) + "[" + std::to_string(i) + "] is not 64 hex digits");
    digests_.push_back(*d);
  }
  return Status::ok();
}

Result<ExpertSlice> ExpertSlice::from_gguf(GgufFile file) {
  const std::string where = "expert slice '" + file.path() + "'";
  const auto fail = [&where](const std::string& msg) -> Status { return Status::error(where + ": " + msg); };

  const std::optional<std::string> arch = file.get_string("general.architecture");
  if (arch != std::string(kSliceArchitecture))
    return fail("not an essaim expert slice (general.architecture is " + (arch ? gguf_quote_string(*arch) : std::string("absent")) +
                ", expected '" + std::string(kSliceArchitecture) + "'); cut one with `essaim slice`");

  ExpertSlice s;
  const SliceKeys keys(file, where);
  ESSAIM_ASSIGN_OR_RETURN(const uint32_t version, keys.u32(kSliceKeyVersion));
  if (version == 1)
    return fail("slice format 1 (cut by an older essaim) records no expert digests, which this build needs to "
                "prove the bytes are the backbone's; cut the slice again with `essaim slice`");
  if (version != kSliceFormatVersion)
    return fail("slice format version " + std::to_string(version) + " is not supported (this build reads " +
                std::to_string(kSliceFormatVersion) + ")");
  std::string model_hex, activation;
  ESSAIM_ASSIGN_OR_RETURN(model_hex, keys.str(kSliceKeySourceModel));
  ESSAIM_ASSIGN_OR_RETURN(s.source_architecture_, keys.str(kSliceKeySourceArchitecture));
  ESSAIM_ASSIGN_OR_RETURN(s.source_block_count_, keys.u32(kSliceKeySourceBlockCount));
  ESSAIM_ASSIGN_OR_RETURN(s.source_expert_count_, keys.u32(kSliceKeySourceExpertCount));
  ESSAIM_ASSIGN_OR_RETURN(s.expert_used_count_, keys.u32(kSliceKeyExpertUsedCount));
  ESSAIM_ASSIGN_OR_RETURN(s.layer_first_, keys.u32(kSliceKeyLayerFirst));
  ESSAIM_ASSIGN_OR_RETURN(s.layer_count_, keys.u32(kSliceKeyLayerCount));
  ESSAIM_ASSIGN_OR_RETURN(s.expert_first_, keys.u32(kSliceKeyExpertFirst));
  ESSAIM_ASSIGN_OR_RETURN(s.expert_count_, keys.u32(kSliceKeyExpertCount));
  ESSAIM_ASSIGN_OR_RETURN(s.n_embd_, keys.u32(kSliceKeyEmbeddingLength));
  ESSAIM_ASSIGN_OR_RETURN(s.n_ff_, keys.u32(kSliceKeyExpertFfLength));
  ESSAIM_ASSIGN_OR_RETURN(activation, keys.str(kSliceKeyActivation));
  ESSAIM_ASSIGN_OR_RETURN(s.gate_up_fused_, keys.boolean(kSliceKeyGateUpFused));

  const std::optional<Sha256Digest> model = digest_from_hex(model_hex);
  if (!model) return fail(std::string(kSliceKeySourceModel) + " is not 64 hex digits");
  s.source_model_ = *model;
  const std::optional<ExpertActivation> act = expert_activation_from_name(activation);
  if (!act) return fail("expert activation " + gguf_quote_string(activation) + " is not one this build runs");
  s.activation_ = *act;
  if (s.n_embd_ == 0 || s.n_ff_ == 0) return fail("embedding_length and expert_feed_forward_length must be positive");
  // 64-bit sums: a u32 first + count cannot wrap.
  if (s.layer_count_ == 0 || uint64_t(s.layer_first_) + s.layer_count_ > s.source_block_count_)
    return fail("layers " + std::to_string(s.layer_first_) + " + " + std::to_string(s.layer_count_) +
                " do not lie inside the source's " + std::to_string(s.source_block_count_) + " layers");
  if (s.expert_count_ == 0 || uint64_t(s.expert_first_) + s.expert_count_ > s.source_expert_count_)
    return fail("experts " + std::to_string(s.expert_first_) + " + " + std::to_string(s.expert_count_) +
                " do not lie inside the source's " + std::to_string(s.source_expert_count_) + " experts");
  if (s.expert_used_count_ > s.source_expert_count_)
    return fail("expert_used_count " + std::to_string(s.expert_used_count_) + " exceeds the expert count " +
                std::to_string(s.source_expert_count_));

  // Exactly the expert tensors of the declared layers and nothing else. Counting first also bounds the loop
  // below by the file's real tensor count, whatever layer_count claims.
  const uint64_t per_layer = s.gate_up_fused_ ? 2 : 3;
  if (uint64_t(s.layer_count_) * per_layer != file.tensors().size())
    return fail("holds " + std::to_string(file.tensors().size()) + " tensors; " + std::to_string(s.layer_count_) +
                " layers of " + (s.gate_up_fused_ ? "fused gate_up + down" : "gate + up + down") + " experts need " +
                std::to_string(uint64_t(s.layer_count_) * per_layer));
  for (uint32_t layer = s.layer_first_; layer < s.layer_first_ + s.layer_count_; ++layer) {
    MoeLayer l;
    l.layer = layer;
    for (size_t k = 0; k < kExpertTensorKindCount; ++k)
      l.tensors[k] = file.find_tensor(expert_tensor_name(layer, ExpertTensorKind(k)));
    if (Status st = check_expert_layer(l, s.n_embd_, s.n_ff_, s.expert_count_, s.gate_up_fused_); !st)
      return st.with_context(where);
    s.layers_.push_back(l);
  }
  ESSAIM_RETURN_IF_ERROR(s.read_digests(file, where));
  // The pointers in layers_ point into file.tensors()'s heap buffer, which a move of the vector keeps.
  s.file_ = std::move(file);
  return s;
}

bool ExpertSlice::holds(uint32_t layer, uint32_t expert) const {
  return layer >= layer_first_ && layer - layer_first_ < layer_count_ && expert >= expert_first_ &&
         expert - expert_first_ < expert_count_;
}

std::span<const Sha256Digest> ExpertSlice::recorded_digests(uint32_t layer) const {
  if (layer < layer_first_ || layer - layer_first_ >= layer_count_) return {};
  return std::span(digests_).subspan(size_t(layer - layer_first_) * expert_count_, expert_count_);
}

Status ExpertSlice::verify_digests() const {
  for (const MoeLayer& l : layers_) {
    std::span<const Sha256Digest> recorded = recorded_digests(l.layer);
    for (uint32_t j = 0; j < expert_count_; ++j) {
      const Sha256Digest d = expert_digest(l, j);
      if (d != recorded[j])
        return Status::error("expert slice '" + file_.path() + "': the bytes of expert " +
                             std::to_string(expert_first_ + j) + " of layer " + std::to_string(l.layer) +
                             " hash to " + digest_hex(d).substr(0, 16) + "..., not the " +
                             digest_hex(recorded[j]).substr(0, 16) +
                             "... recorded when it was cut: the file is damaged or was altered; download or cut "
                             "it again");
    }
  }
  return Status::ok();
}

const MoeLayer* ExpertSlice::layer(uint32_t layer) const {
  if (layer < layer_first_ || layer - layer_first_ >= layer_count_) return nullptr;
  return &layers_[layer - layer_first_];
}

}  // namespace essaim
