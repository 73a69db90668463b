#include "sim/model_shape.h"

#include <algorithm>
#include <string>

#include "slice/gguf_slice.h"
#include "slice/model_identity.h"
#include "proto/frame.h"
#include "proto/messages.h"
#include "synth/synth_quant_rule.h"

namespace essaim::sim {

ModelShape qwen35_122b() {
  ModelShape m;
  m.n_layers = 48;
  m.n_experts = 256;
  m.k = 8;
  m.n_embd = 3072;
  m.n_ff = 1024;
  const uint32_t blocks = 49;  // 48 layers + the MTP block, as the file counts them for the type rule
  for (int32_t l = 0; l < m.n_layers; ++l) {
    const auto type = [&](TensorName kind, int64_t ne0) {
      return synth_tensor_type(SynthTypeMix::Q4_K_M,
                               {.kind = kind, .n_dims = 3, .ne0 = ne0, .layer = uint32_t(l), .block_count = blocks});
    };
    const GgmlType gate = type(TensorName::FFN_GATE_EXPS, m.n_embd), up = type(TensorName::FFN_UP_EXPS, m.n_embd);
    const GgmlType down = type(TensorName::FFN_DOWN_EXPS, m.n_ff);
    m.down_type.push_back(down);
    const auto row = [](GgmlType t, int64_t n) { return int64_t(type_traits(t).row_bytes(uint64_t(n))); };
    m.expert_bytes.push_back(m.n_ff * (row(gate, m.n_embd) + row(up, m.n_embd)) + m.n_embd * row(down, m.n_ff));
  }
  return m;
}

Result<ModelShape> model_shape_from_gguf(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(GgufFile f, GgufFile::open(path));
  ESSAIM_ASSIGN_OR_RETURN(MoeLayout moe, moe_layout(f));
  if (moe.layers.empty()) return Status::error(path + ": no layer has routed experts");
  if (moe.expert_used_count == 0) return Status::error(path + ": the file does not say how many experts a token uses");
  ModelShape m;
  m.n_layers = int32_t(moe.layers.size());
  m.n_experts = int32_t(moe.expert_count);
  m.k = int32_t(moe.expert_used_count);
  m.n_embd = moe.n_embd;
  m.n_ff = moe.n_ff;
  for (const MoeLayer& l : moe.layers) {
    const GgufTensor* down = l.tensor(ExpertTensorKind::DOWN);
    const GgufTensor* gate = moe.gate_up_fused ? l.tensor(ExpertTensorKind::GATE_UP) : l.tensor(ExpertTensorKind::GATE);
    if (!down || !gate) return Status::error(path + ": layer " + std::to_string(l.layer) + " lacks its gate or down experts");
    m.down_type.push_back(down->type);
    m.act_type = type_traits(gate->type).vec_dot_type;
    m.expert_bytes.push_back(int64_t(moe.expert_bytes(l)));
  }
  return m;
}

uint64_t ModelShape::request_bytes(uint64_t rows, uint64_t pairs) const {
  auto [it, fresh] = request_memo_.try_emplace({rows, pairs}, 0);
  if (fresh) {
    const uint64_t act_row = type_traits(act_type).row_bytes(uint64_t(n_embd));
    proto::ExpertRequest r{.request_id = 1, .layer = 0, .act_type = act_type, .act_row_bytes = act_row};
    r.row_expert_counts.assign(rows, 0);
    for (uint64_t p = 0; p < pairs; ++p) ++r.row_expert_counts[rows ? p % rows : 0];
    r.expert_ids.assign(pairs, 0);
    r.activations.assign(rows * act_row, 0);
    it->second = proto::encode_message(r).size();
  }
  return it->second;
}

uint64_t ModelShape::response_bytes(uint64_t pairs, bool bf16) const {
  auto [it, fresh] = response_memo_.try_emplace({pairs, bf16}, 0);
  if (fresh) {
    proto::ExpertResponse r{.request_id = 1, .n_outputs = uint32_t(pairs), .n_embd = uint32_t(n_embd),
                            .output = bf16 ? ExpertOutput::BF16 : ExpertOutput::F32};
    r.outputs.assign(pairs * uint64_t(n_embd), 0.0f);
    it->second = proto::encode_message(r).size();
  }
  return it->second;
}

namespace {

coord::Catalogue empty_catalogue(const ModelShape& m) {
  coord::Catalogue c;
  c.model_identity = std::string(64, 'e');
  c.architecture = "qwen35moe";
  c.n_layers = m.n_layers;
  c.n_experts = m.n_experts;
  c.n_expert_used = m.k;
  c.protocol_version = proto::kProtocolVersion;
  c.kernel_abi = "sim";
  return c;
}

void add_slice(coord::Catalogue& c, const ModelShape& m, int64_t layer, int64_t first, int64_t count) {
  const std::string name = "sim.L" + std::to_string(layer) + ".E" + std::to_string(first) + ".gguf";
  const Sha256Digest d = sha256({reinterpret_cast<const uint8_t*>(name.data()), name.size()});
  c.slices.push_back({name, layer, first, count, count * m.expert_bytes[size_t(layer)], digest_hex(d)});
}

}  // namespace

coord::Catalogue slice_catalogue(const ModelShape& m, int64_t experts_per_slice) {
  coord::Catalogue c = empty_catalogue(m);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    for (int64_t first = 0; first < m.n_experts; first += experts_per_slice) {
      add_slice(c, m, l, first, std::min<int64_t>(experts_per_slice, m.n_experts - first));
    }
  }
  return c;
}

coord::Catalogue range_catalogue(const ModelShape& m, int64_t parts, std::vector<std::vector<size_t>>& held_by_part) {
  coord::Catalogue c = empty_catalogue(m);
  held_by_part.assign(size_t(parts), {});
  for (int64_t l = 0; l < m.n_layers; ++l) {
    for (int64_t p = 0; p < parts; ++p) {
      const int64_t first = m.n_experts * p / parts, end = m.n_experts * (p + 1) / parts;
      if (end == first) continue;
      held_by_part[size_t(p)].push_back(c.slices.size());
      add_slice(c, m, l, first, end - first);
    }
  }
  return c;
}

}  // namespace essaim::sim
