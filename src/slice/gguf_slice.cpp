#include "slice/gguf_slice.h"

#include <algorithm>
#include <filesystem>

#include "slice/backbone_experts.h"
#include "slice/expert_digest.h"
#include "gguf/gguf_layout.h"

namespace essaim {
namespace {

std::string range_text(uint64_t first, uint64_t count) {
  return count == 1 ? std::to_string(first) : std::to_string(first) + "-" + std::to_string(first + count - 1);
}

std::string shape_text(const std::array<int64_t, 4>& ne) {
  return "[" + std::to_string(ne[0]) + ", " + std::to_string(ne[1]) + ", " + std::to_string(ne[2]) + ", " +
         std::to_string(ne[3]) + "]";
}

// "0-47" or "1-3, 5, 7-9": the MoE layers, for error messages.
std::string layers_text(const std::vector<MoeLayer>& layers) {
  std::string s;
  for (size_t i = 0; i < layers.size();) {
    size_t j = i;
    while (j + 1 < layers.size() && layers[j + 1].layer == layers[j].layer + 1) ++j;
    if (!s.empty()) s += ", ";
    s += range_text(layers[i].layer, layers[j].layer - layers[i].layer + 1);
    i = j + 1;
  }
  return s.empty() ? "none" : s;
}

GgufValue u32_value(uint32_t v) {
  GgufValue x;
  x.type = GgufValueType::UINT32;
  x.u = v;
  return x;
}

GgufValue string_value(std::string_view v) {
  GgufValue x;
  x.type = GgufValueType::STRING;
  x.str = std::string(v);
  return x;
}

GgufValue bool_value(bool v) {
  GgufValue x;
  x.type = GgufValueType::BOOL;
  x.u = v ? 1 : 0;
  return x;
}

// [in, out, X] with ne[3] = 1: the shape every routed-expert tensor must have.
Status check_expert_shape(const GgufTensor& t, int64_t in, int64_t out, uint32_t n_expert) {
  const std::array<int64_t, 4> want{in, out, int64_t(n_expert), 1};
  if (t.ne != want)
    return Status::error("expert tensor '" + t.name + "' has ne " + shape_text(t.ne) + ", expected " +
                         shape_text(want) + " (n_embd, expert ff width and expert count of the model)");
  return Status::ok();
}

Result<MoeLayout> moe_layout_impl(const GgufFile& src) {
  MoeLayout m;
  const std::optional<std::string> arch = src.get_string("general.architecture");
  if (!arch) return Status::error("no general.architecture string: not a model file");
  if (*arch == kSliceArchitecture)
    return Status::error("this is an essaim expert slice, not a full model: slice the model it was cut from");
  if (src.find_kv(kBackboneKeySourceModel) != nullptr)
    return Status::error("this is an essaim backbone file (its routed experts were cut away): slice the full model");
  m.architecture = *arch;
  const std::string a = *arch + ".";
  ESSAIM_ASSIGN_OR_RETURN(m.block_count, sliceable_block_count(src, *arch));

  const size_t n_expert_tensors = size_t(std::count_if(src.tensors().begin(), src.tensors().end(),
      [](const GgufTensor& t) { return is_routed_expert_tensor_name(t.name); }));
  const std::optional<uint32_t> x = src.get_u32(a + "expert_count");
  if (n_expert_tensors == 0)
    return Status::error("not a Mixture-of-Experts model: no routed-expert tensors (blk.N.ffn_*_exps.weight)" +
                         std::string(x && *x > 0 ? " although " + a + "expert_count is " + std::to_string(*x) : ""));
  if (!x || *x == 0) return Status::error(a + "expert_count is missing or 0, yet the file has routed-expert tensors");
  m.expert_count = *x;
  m.expert_used_count = src.get_u32(a + "expert_used_count").value_or(0);
  const std::optional<ExpertActivation> act = expert_activation_of_architecture(*arch);
  if (!act)
    return Status::error("architecture " + gguf_quote_string(*arch) + ": essaim does not know how its experts combine gate and up, "
                         "so it will not cut it into slices a worker would run wrongly");
  m.activation = *act;

  size_t claimed = 0;
  for (uint32_t layer = 0; layer < m.block_count; ++layer) {
    MoeLayer l;
    l.layer = layer;
    size_t present = 0;
    for (size_t k = 0; k < kExpertTensorKindCount; ++k) {
      l.tensors[k] = src.find_tensor(expert_tensor_name(layer, ExpertTensorKind(k)));
      present += l.tensors[k] != nullptr;
    }
    if (present == 0) continue;
    claimed += present;
    const bool fused = l.tensor(ExpertTensorKind::GATE_UP) != nullptr;
    if (m.layers.empty()) {
      // The first MoE layer fixes E and F (its down tensor is [F, E, X]); every layer is checked against them.
      m.gate_up_fused = fused;
      if (const GgufTensor* down = l.tensor(ExpertTensorKind::DOWN)) {
        if (down->ne[0] > int64_t(UINT32_MAX) || down->ne[1] > int64_t(UINT32_MAX))
          return Status::error("expert tensor '" + down->name + "' has ne " + shape_text(down->ne) + ", too large");
        m.n_ff = uint32_t(down->ne[0]);
        m.n_embd = uint32_t(down->ne[1]);
      }
    } else if (fused != m.gate_up_fused) {
      return Status::error("layer " + std::to_string(layer) + (fused ? " fuses" : " does not fuse") +
                           " gate and up, unlike layer " + std::to_string(m.layers.front().layer));
    }
    ESSAIM_RETURN_IF_ERROR(check_expert_layer(l, m.n_embd, m.n_ff, m.expert_count, fused));
    m.layers.push_back(l);
  }
  if (claimed != n_expert_tensors) {
    for (const GgufTensor& t : src.tensors()) {
      if (!is_routed_expert_tensor_name(t.name)) continue;
      bool known = false;
      for (const MoeLayer& l : m.layers)
        for (const GgufTensor* p : l.tensors) known = known || p == &t;
      if (!known)
        return Status::error("routed-expert tensor '" + t.name + "' is not one essaim can slice (it cuts "
                             "blk.N.ffn_{gate,up,down,gate_up}_exps.weight, N < " + a + "block_count = " +
                             std::to_string(m.block_count) + ")");
    }
  }
  if (const auto e = src.get_u32(a + "embedding_length"); e && *e != m.n_embd)
    return Status::error(a + "embedding_length is " + std::to_string(*e) + " but the expert tensors have n_embd " +
                         std::to_string(m.n_embd));
  if (const auto f = src.get_u32(a + "expert_feed_forward_length"); f && *f != m.n_ff)
    return Status::error(a + "expert_feed_forward_length is " + std::to_string(*f) +
                         " but the expert tensors are " + std::to_string(m.n_ff) + " wide");
  m.source_model = model_identity(src);
  return m;
}

}  // namespace

const MoeLayer* MoeLayout::find_layer(uint32_t layer) const {
  const auto it = std::lower_bound(layers.begin(), layers.end(), layer,
                                   [](const MoeLayer& l, uint32_t v) { return l.layer < v; });
  return it != layers.end() && it->layer == layer ? &*it : nullptr;
}

uint64_t MoeLayout::expert_bytes(const MoeLayer& l) const {
  uint64_t n = 0;
  for (const GgufTensor* t : l.tensors)
    if (t != nullptr) n += t->expert_slab_bytes();
  return n;
}

Result<MoeLayout> moe_layout(const GgufFile& src) {
  Result<MoeLayout> m = moe_layout_impl(src);
  if (!m) return m.status().with_context("'" + src.path() + "'");
  return m;
}

Status check_expert_layer(const MoeLayer& l, uint32_t n_embd, uint32_t n_ff, uint32_t n_experts, bool fused) {
  const bool complete = l.tensor(ExpertTensorKind::DOWN) != nullptr &&
                        (fused ? l.tensor(ExpertTensorKind::GATE_UP) != nullptr && !l.tensor(ExpertTensorKind::GATE) &&
                                     !l.tensor(ExpertTensorKind::UP)
                               : l.tensor(ExpertTensorKind::GATE) && l.tensor(ExpertTensorKind::UP) &&
                                     !l.tensor(ExpertTensorKind::GATE_UP));
  if (!complete)
    return Status::error("layer " + std::to_string(l.layer) + " does not have " +
                         (fused ? "exactly ffn_gate_up_exps and ffn_down_exps"
                                : "exactly ffn_gate_exps, ffn_up_exps and ffn_down_exps"));
  const int64_t E = n_embd, F = n_ff;
  if (fused) {
    ESSAIM_RETURN_IF_ERROR(check_expert_shape(*l.tensor(ExpertTensorKind::GATE_UP), E, 2 * F, n_experts));
  } else {
    ESSAIM_RETURN_IF_ERROR(check_expert_shape(*l.tensor(ExpertTensorKind::GATE), E, F, n_experts));
    ESSAIM_RETURN_IF_ERROR(check_expert_shape(*l.tensor(ExpertTensorKind::UP), E, F, n_experts));
  }
  return check_expert_shape(*l.tensor(ExpertTensorKind::DOWN), F, E, n_experts);
}

Status check_slice_range(const MoeLayout& moe, const SliceRange& r) {
  if (r.layer_count == 0) return Status::error("the layer range is empty");
  if (r.expert_count == 0) return Status::error("the expert range is empty");
  if (uint64_t(r.layer_first) + r.layer_count > moe.block_count)
    return Status::error("layers " + range_text(r.layer_first, r.layer_count) + " lie beyond the model's " +
                         std::to_string(moe.block_count) + " layers (0-" + std::to_string(moe.block_count - 1) + ")");
  if (uint64_t(r.expert_first) + r.expert_count > moe.expert_count)
    return Status::error("experts " + range_text(r.expert_first, r.expert_count) + " lie beyond the model's " +
                         std::to_string(moe.expert_count) + " experts (0-" + std::to_string(moe.expert_count - 1) + ")");
  for (uint32_t l = r.layer_first; l < r.layer_first + r.layer_count; ++l)
    if (moe.find_layer(l) == nullptr)
      return Status::error("layer " + std::to_string(l) + " has no routed experts (MoE layers: " +
                           layers_text(moe.layers) + ")");
  return Status::ok();
}

Result<OutFile> expert_slice_file(const GgufFile& src, const MoeLayout& moe, const SliceRange& r) {
  ESSAIM_RETURN_IF_ERROR(check_slice_range(moe, r));
  OutFile f;
  f.alignment = src.alignment();
  f.source = &src;
  const auto kv = [&f](std::string_view key, GgufValue v) { f.kvs.push_back(GgufKv{std::string(key), std::move(v)}); };
  kv("general.architecture", string_value(kSliceArchitecture));
  if (f.alignment != kGgufDefaultAlignment) kv("general.alignment", u32_value(f.alignment));
  if (const auto name = src.get_string("general.name")) kv("general.name", string_value(*name + " (expert slice)"));
  kv(kSliceKeyVersion, u32_value(kSliceFormatVersion));
  kv(kSliceKeySourceModel, string_value(digest_hex(moe.source_model)));
  kv(kSliceKeySourceArchitecture, string_value(moe.architecture));
  kv(kSliceKeySourceBlockCount, u32_value(moe.block_count));
  kv(kSliceKeySourceExpertCount, u32_value(moe.expert_count));
  kv(kSliceKeyExpertUsedCount, u32_value(moe.expert_used_count));
  kv(kSliceKeyLayerFirst, u32_value(r.layer_first));
  kv(kSliceKeyLayerCount, u32_value(r.layer_count));
  kv(kSliceKeyExpertFirst, u32_value(r.expert_first));
  kv(kSliceKeyExpertCount, u32_value(r.expert_count));
  kv(kSliceKeyEmbeddingLength, u32_value(moe.n_embd));
  kv(kSliceKeyExpertFfLength, u32_value(moe.n_ff));
  kv(kSliceKeyActivation, string_value(expert_activation_name(moe.activation)));
  kv(kSliceKeyGateUpFused, bool_value(moe.gate_up_fused));
  // The header must carry the digests, so the slabs are hashed once here, before the copy (which then
  // hashes the whole file for the manifest as it writes).
  GgufValue digests;
  digests.type = GgufValueType::ARRAY;
  digests.elem_type = GgufValueType::STRING;
  for (uint32_t layer = r.layer_first; layer < r.layer_first + r.layer_count; ++layer)
    for (uint32_t e = r.expert_first; e < r.expert_first + r.expert_count; ++e)
      digests.strs.push_back(digest_hex(expert_digest(*moe.find_layer(layer), e)));
  kv(kSliceKeyExpertSha256, std::move(digests));

  std::vector<const GgufTensor*> picked;
  for (uint32_t layer = r.layer_first; layer < r.layer_first + r.layer_count; ++layer)
    for (const GgufTensor* t : moe.find_layer(layer)->tensors)
      if (t != nullptr) picked.push_back(t);
  // Source data order, so that a multi-layer slice reads the source front to back.
  std::sort(picked.begin(), picked.end(),
            [](const GgufTensor* a, const GgufTensor* b) { return a->file_offset < b->file_offset; });
  for (const GgufTensor* t : picked) {
    // Experts X..Y of one tensor are one contiguous byte range: [X·nb2, (Y+1)·nb2).
    const uint64_t slab = t->expert_slab_bytes();
    f.tensors.push_back(OutTensor{t->name, t->type, {t->ne[0], t->ne[1], int64_t(r.expert_count)},
                                  t->bytes().subspan(r.expert_first * slab, r.expert_count * slab)});
  }
  return f;
}

OutFile backbone_file(const GgufFile& src, const MoeLayout& moe, BackboneDigests digests) {
  OutFile f;
  f.alignment = src.alignment();
  f.source = &src;
  f.kvs = src.kvs();
  f.kvs.push_back(GgufKv{std::string(kBackboneKeyVersion), u32_value(kBackboneFormatVersion)});
  f.kvs.push_back(GgufKv{std::string(kBackboneKeySourceModel), string_value(digest_hex(moe.source_model))});
  for (GgufKv& kv : backbone_expert_kvs(moe, digests)) f.kvs.push_back(std::move(kv));
  for (const GgufTensor& t : src.tensors()) {
    // moe_layout claimed every routed-expert tensor, so the name test drops exactly the routed experts.
    if (is_routed_expert_tensor_name(t.name)) continue;
    f.tensors.push_back(OutTensor{t.name, t.type, {t.ne.begin(), t.ne.begin() + t.n_dims}, t.bytes()});
  }
  return f;
}

Result<SliceManifest> plan_manifest(const GgufFile& src, const MoeLayout& moe, const SlicePlanOptions& opt) {
  if (opt.experts_per_slice == 0) return Status::error("a slice must hold at least 1 expert");
  const std::string stem = opt.stem.empty() ? moe.architecture : opt.stem;
  SliceManifest m;
  m.source_model = moe.source_model;
  m.source_file = std::filesystem::path(src.path()).filename().string();
  m.source_architecture = moe.architecture;
  m.source_block_count = moe.block_count;
  m.source_expert_count = moe.expert_count;
  if (opt.with_backbone) {
    m.backbone = ManifestBackbone{stem + ".backbone.gguf", backbone_file(src, moe, BackboneDigests::PLACEHOLDER).size(), {}};
    if (!manifest_file_name_is_plain(m.backbone->file))
      return Status::error("file name stem '" + stem + "' is not a plain file name");
  }
  for (const MoeLayer& l : moe.layers) {
    for (uint32_t e = 0; e < moe.expert_count; e += std::min(opt.experts_per_slice, moe.expert_count - e)) {
      const SliceRange r{.layer_first = l.layer, .layer_count = 1, .expert_first = e,
                         .expert_count = std::min(opt.experts_per_slice, moe.expert_count - e)};
      ESSAIM_ASSIGN_OR_RETURN(OutFile f, expert_slice_file(src, moe, r));
      ManifestSlice s{slice_file_name(stem, r.layer_first, r.layer_count, r.expert_first, r.expert_count,
                                      moe.block_count, moe.expert_count),
                      r.layer_first, r.layer_count, r.expert_first, r.expert_count, f.size(), {}};
      if (!manifest_file_name_is_plain(s.file))
        return Status::error("file name stem '" + stem + "' is not a plain file name");
      m.slices.push_back(std::move(s));
    }
  }
  return m;
}

Result<SliceManifest> write_plan(const GgufFile& src, const MoeLayout& moe, const SliceManifest& plan,
                                 const std::string& dir, Progress* progress) {
  if (plan.source_model != moe.source_model)
    return Status::error("the plan was made for model " + digest_hex(plan.source_model) + ", not for '" +
                         src.path() + "'");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error("cannot create directory '" + dir + "': " + ec.message());

  SliceManifest done = plan;
  struct Job {
    std::string file;
    uint64_t planned_bytes;
    Sha256Digest* sha256;
    std::optional<SliceRange> range;  // nullopt = the backbone
  };
  std::vector<Job> jobs;
  if (done.backbone) jobs.push_back({done.backbone->file, done.backbone->bytes, &done.backbone->sha256, std::nullopt});
  for (ManifestSlice& s : done.slices)
    jobs.push_back({s.file, s.bytes, &s.sha256, SliceRange{s.layer_first, s.layer_count, s.expert_first, s.expert_count}});

  for (const Job& job : jobs) {
    // A plan may have been loaded from JSON; parse() checks names, a hand-built manifest may not have been.
    if (!manifest_file_name_is_plain(job.file))
      return Status::error("'" + job.file + "' is not a plain file name inside '" + dir + "'");
    OutFile f;
    if (job.range) {
      ESSAIM_ASSIGN_OR_RETURN(f, expert_slice_file(src, moe, *job.range));
    } else {
      f = backbone_file(src, moe);
    }
    if (f.size() != job.planned_bytes)
      return Status::error("the plan says " + job.file + " has " + std::to_string(job.planned_bytes) +
                           " bytes, the source gives " + std::to_string(f.size()) + ": re-plan");
    ESSAIM_ASSIGN_OR_RETURN(const WrittenFile w, write_out_file(f, (std::filesystem::path(dir) / job.file).string(),
                                                                    /*hash=*/true, progress));
    *job.sha256 = w.sha256;
  }
  ESSAIM_RETURN_IF_ERROR(done.save((std::filesystem::path(dir) / "manifest.json").string()));
  return done;
}

}  // namespace essaim
