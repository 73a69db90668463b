#include "slice/backbone_experts.h"

#include <algorithm>
#include <span>
#include <string>

#include "slice/expert_digest.h"

namespace essaim {
namespace {

// Widths and counts beyond these are refused before any arithmetic: with them every byte count below fits
// in 64 bits (2^22-byte rows × 2^21 rows × 2^16 experts < 2^60).
constexpr uint32_t kMaxWidth = 1u << 20;
constexpr uint32_t kMaxExperts = 1u << 16;

// The kinds a layer has, in the order their types are recorded.
std::vector<ExpertTensorKind> kinds_of(bool fused) {
  if (fused) return {ExpertTensorKind::GATE_UP, ExpertTensorKind::DOWN};
  return {ExpertTensorKind::GATE, ExpertTensorKind::UP, ExpertTensorKind::DOWN};
}

// [in, out] of one expert of a kind.
std::pair<int64_t, int64_t> expert_shape(ExpertTensorKind k, int64_t E, int64_t F) {
  switch (k) {
    case ExpertTensorKind::GATE: case ExpertTensorKind::UP: return {E, F};
    case ExpertTensorKind::GATE_UP: return {E, 2 * F};
    default: return {F, E};
  }
}

}  // namespace

const BackboneExperts::Layer* BackboneExperts::find_layer(uint32_t layer) const {
  const int64_t i = layer_index(layer);
  return i < 0 ? nullptr : &layers[size_t(i)];
}

int64_t BackboneExperts::layer_index(uint32_t layer) const {
  const auto it = std::lower_bound(layers.begin(), layers.end(), layer,
                                   [](const Layer& l, uint32_t v) { return l.layer < v; });
  return it != layers.end() && it->layer == layer ? int64_t(it - layers.begin()) : -1;
}

std::vector<GgufTensor> BackboneExperts::shape_tensors() const {
  std::vector<GgufTensor> out;
  for (const Layer& l : layers) {
    for (ExpertTensorKind k : kinds_of(gate_up_fused)) {
      const auto [in, rows] = expert_shape(k, n_embd, n_ff);
      GgufTensor t;
      t.name = expert_tensor_name(l.layer, k);
      t.n_dims = 3;
      t.ne = {in, rows, int64_t(expert_count), 1};
      t.type = *l.types[size_t(k)];
      t.nbytes = type_traits(t.type).row_bytes(uint64_t(in)) * uint64_t(rows) * expert_count;
      t.data = nullptr;  // shape only: the bytes are on the workers
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::vector<GgufKv> backbone_expert_kvs(const MoeLayout& moe, BackboneDigests digests) {
  std::vector<GgufKv> kvs;
  const auto kv = [&kvs](std::string_view key, GgufValue v) { kvs.push_back(GgufKv{std::string(key), std::move(v)}); };
  kv(kBackboneKeyExpertCount, gguf_unsigned(GgufValueType::UINT32, moe.expert_count));
  kv(kBackboneKeyEmbeddingLength, gguf_unsigned(GgufValueType::UINT32, moe.n_embd));
  kv(kBackboneKeyExpertFfLength, gguf_unsigned(GgufValueType::UINT32, moe.n_ff));
  kv(kBackboneKeyGateUpFused, gguf_bool(moe.gate_up_fused));
  kv(kBackboneKeyActivation, gguf_string(std::string(expert_activation_name(moe.activation))));
  std::vector<uint32_t> layers, types;
  std::vector<std::string> hex;
  const std::string zero(64, '0');
  for (const MoeLayer& l : moe.layers) {
    layers.push_back(l.layer);
    for (ExpertTensorKind k : kinds_of(moe.gate_up_fused)) types.push_back(uint32_t(l.tensor(k)->type));
    for (uint32_t e = 0; e < moe.expert_count; ++e)
      hex.push_back(digests == BackboneDigests::COMPUTE ? digest_hex(expert_digest(l, e)) : zero);
  }
  kv(kBackboneKeyExpertLayers, gguf_array_u32(layers));
  kv(kBackboneKeyExpertTypes, gguf_array_u32(types));
  kv(kBackboneKeyExpertSha256, gguf_array_string(std::move(hex)));
  return kvs;
}

bool is_backbone_file(const GgufFile& f) {
  return f.find_kv(kBackboneKeyVersion) != nullptr || f.find_kv(kBackboneKeySourceModel) != nullptr;
}

namespace {

// Reads the backbone keys of one file, each error naming the file.
class BackboneKeys {
 public:
  explicit BackboneKeys(const GgufFile& f) : f_(f), where_("backbone file '" + f.path() + "'") {}

  Status fail(const std::string& msg) const { return Status::error(where_ + ": " + msg); }
  // The key is missing or of another type than `type`.
  Status typed(std::string_view key, const char* type) const {
    const GgufValue* v = f_.find_kv(key);
    if (v == nullptr) return fail("missing key " + std::string(key));
    return fail("key " + std::string(key) + " is " + std::string(gguf_value_type_name(v->type)) + ", expected " + type);
  }
  Result<uint32_t> u32(std::string_view key) const {
    if (const std::optional<uint32_t> v = f_.get_u32(key)) return *v;
    return typed(key, "UINT32");
  }
  Result<const std::vector<uint64_t>*> u32_list(std::string_view key) const {
    const GgufValue* v = f_.find_kv(key);
    if (v == nullptr || v->type != GgufValueType::ARRAY || v->elem_type != GgufValueType::UINT32)
      return typed(key, "ARRAY of UINT32");
    return &v->uints;
  }

  // Version, source model and the model's block count.
  Status read_header(BackboneExperts& b) const {
    ESSAIM_ASSIGN_OR_RETURN(const uint32_t version, u32(kBackboneKeyVersion));
    if (version == 1)
      return fail("backbone format 1 (cut by an older essaim) does not record the experts' types and digests, "
                  "which a backbone without the experts needs; cut it again with `essaim slice --backbone` of this version");
    if (version != kBackboneFormatVersion)
      return fail("backbone format version " + std::to_string(version) + " is not supported (this build reads " +
                  std::to_string(kBackboneFormatVersion) + ")");
    const std::optional<std::string> model_hex = f_.get_string(kBackboneKeySourceModel);
    if (!model_hex) return typed(kBackboneKeySourceModel, "STRING");
    const std::optional<Sha256Digest> model = digest_from_hex(*model_hex);
    if (!model) return fail(std::string(kBackboneKeySourceModel) + " is not 64 hex digits");
    b.source_model = *model;
    const std::optional<std::string> arch = f_.get_string("general.architecture");
    if (!arch) return typed("general.architecture", "STRING");
    Result<uint32_t> blocks = sliceable_block_count(f_, *arch);
    if (!blocks) return fail(blocks.status().message());
    b.block_count = *blocks;
    return Status::ok();
  }

  // Expert count, widths, gate/up fusion and activation.
  Status read_shape(BackboneExperts& b) const {
    ESSAIM_ASSIGN_OR_RETURN(b.expert_count, u32(kBackboneKeyExpertCount));
    ESSAIM_ASSIGN_OR_RETURN(b.n_embd, u32(kBackboneKeyEmbeddingLength));
    ESSAIM_ASSIGN_OR_RETURN(b.n_ff, u32(kBackboneKeyExpertFfLength));
    if (b.expert_count == 0 || b.expert_count > kMaxExperts)
      return fail(std::string(kBackboneKeyExpertCount) + " is " + std::to_string(b.expert_count) + ", expected 1.." +
                  std::to_string(kMaxExperts));
    if (b.n_embd == 0 || b.n_embd > kMaxWidth || b.n_ff == 0 || b.n_ff > kMaxWidth)
      return fail("expert widths " + std::to_string(b.n_embd) + " × " + std::to_string(b.n_ff) + " are not in 1.." +
                  std::to_string(kMaxWidth));
    const std::optional<bool> fused = f_.get_bool(kBackboneKeyGateUpFused);
    if (!fused) return typed(kBackboneKeyGateUpFused, "BOOL");
    b.gate_up_fused = *fused;
    const std::optional<std::string> act = f_.get_string(kBackboneKeyActivation);
    if (!act) return typed(kBackboneKeyActivation, "STRING");
    if (!expert_activation_from_name(*act))
      return fail("expert activation " + gguf_quote_string(*act) + " is not one this build runs");
    return Status::ok();
  }

  // The MoE layers (strictly ascending, below the block count) and their expert tensors' types.
  Status read_layers(BackboneExperts& b) const {
    ESSAIM_ASSIGN_OR_RETURN(const std::vector<uint64_t>* layers, u32_list(kBackboneKeyExpertLayers));
    ESSAIM_ASSIGN_OR_RETURN(const std::vector<uint64_t>* types, u32_list(kBackboneKeyExpertTypes));
    if (layers->empty()) return fail(std::string(kBackboneKeyExpertLayers) + " is empty: no MoE layer");
    if (layers->size() > b.block_count)
      return fail(std::string(kBackboneKeyExpertLayers) + " lists " + std::to_string(layers->size()) +
                  " layers, the model has " + std::to_string(b.block_count));
    const std::vector<ExpertTensorKind> kinds = kinds_of(b.gate_up_fused);
    if (types->size() != layers->size() * kinds.size())
      return fail(std::string(kBackboneKeyExpertTypes) + " holds " + std::to_string(types->size()) + " types; " +
                  std::to_string(layers->size()) + " layers of " + std::to_string(kinds.size()) + " tensors need " +
                  std::to_string(layers->size() * kinds.size()));
    for (size_t i = 0; i < layers->size(); ++i) {
      const uint64_t layer = (*layers)[i];
      if (layer >= b.block_count || (i > 0 && layer <= (*layers)[i - 1]))
        return fail(std::string(kBackboneKeyExpertLayers) + "[" + std::to_string(i) + "] = " + std::to_string(layer) +
                    ": layers must ascend strictly and lie below the model's " + std::to_string(b.block_count));
      ESSAIM_ASSIGN_OR_RETURN(BackboneExperts::Layer l,
                              read_layer_types(b, uint32_t(layer), std::span(*types).subspan(i * kinds.size(), kinds.size())));
      b.layers.push_back(l);
    }
    return Status::ok();
  }

  // One layer's types, in kinds_of order: computable, and blocks dividing the input width.
  Result<BackboneExperts::Layer> read_layer_types(const BackboneExperts& b, uint32_t layer,
                                                  std::span<const uint64_t> ids) const {
    const std::vector<ExpertTensorKind> kinds = kinds_of(b.gate_up_fused);
    BackboneExperts::Layer l;
    l.layer = layer;
    for (size_t k = 0; k < kinds.size(); ++k) {
      const std::optional<GgmlType> t = ggml_type_from_id(int64_t(ids[k]));
      const std::string what = expert_tensor_name(l.layer, kinds[k]);
      if (!t || !type_traits(*t).computable || type_traits(*t).block_size == 0)
        return fail("'" + what + "' has type id " + std::to_string(ids[k]) + ", which essaim cannot compute");
      const int64_t in = expert_shape(kinds[k], b.n_embd, b.n_ff).first;
      if (uint64_t(in) % type_traits(*t).block_size != 0)
        return fail("'" + what + "': input width " + std::to_string(in) + " is not a multiple of the " +
                    std::string(type_name(*t)) + " block size");
      l.types[size_t(kinds[k])] = *t;
    }
    if (!b.gate_up_fused && type_traits(*l.types[size_t(ExpertTensorKind::GATE)]).vec_dot_type !=
                                type_traits(*l.types[size_t(ExpertTensorKind::UP)]).vec_dot_type)
      return fail("layer " + std::to_string(layer) + ": gate and up weights need different activation formats");
    return l;
  }

  // One SHA-256 per (layer, expert), in layer order.
  Status read_digests(BackboneExperts& b) const {
    const std::vector<std::string>* hex = f_.get_string_array(kBackboneKeyExpertSha256);
    if (hex == nullptr) return typed(kBackboneKeyExpertSha256, "ARRAY of STRING");
    const uint64_t n_digests = uint64_t(b.layers.size()) * b.expert_count;  // ≤ 2^32 × 2^16: no wrap
    if (hex->size() != n_digests)
      return fail(std::string(kBackboneKeyExpertSha256) + " holds " + std::to_string(hex->size()) + " digests; " +
                  std::to_string(b.layers.size()) + " layers of " + std::to_string(b.expert_count) + " experts need " +
                  std::to_string(n_digests));
    b.digests.assign(b.layers.size(), {});
    for (size_t i = 0; i < hex->size(); ++i) {
      const std::optional<Sha256Digest> d = digest_from_hex((*hex)[i]);
      if (!d) return fail(std::string(kBackboneKeyExpertSha256) + "[" + std::to_string(i) + "] is not 64 hex digits");
      b.digests[i / b.expert_count].push_back(*d);
    }
    return Status::ok();
  }

  // Stored tensors only: the shape-only ones a loader added from these records have no bytes.
  Status check_no_stored_experts() const {
    for (const GgufTensor& t : f_.tensors())
      if (t.data != nullptr && is_routed_expert_tensor_name(t.name))
        return fail("holds routed-expert tensor " + gguf_quote_string(t.name) + ", which a backbone file cannot have");
    return Status::ok();
  }

 private:
  const GgufFile& f_;
  std::string where_;
};

}  // namespace

Result<BackboneExperts> read_backbone_experts(const GgufFile& f) {
  const BackboneKeys keys(f);
  BackboneExperts b;
  ESSAIM_RETURN_IF_ERROR(keys.read_header(b));
  ESSAIM_RETURN_IF_ERROR(keys.read_shape(b));
  ESSAIM_RETURN_IF_ERROR(keys.read_layers(b));
  ESSAIM_RETURN_IF_ERROR(keys.read_digests(b));
  ESSAIM_RETURN_IF_ERROR(keys.check_no_stored_experts());
  return b;
}

}  // namespace essaim
