#include "synth/synth_quant_rule.h"

#include "core/status.h"

namespace essaim {
namespace {

using K = TensorName;

// Tensors llama-quantize never touches besides 1-D ones: names containing "_norm.weight", the router
// ffn_gate_inp, ssm_conv1d, and names not ending in "weight" (ssm_a, ssm_dt.bias).
bool never_quantised(K kind) {
  switch (kind) {
    case K::OUTPUT_NORM: case K::ATTN_NORM: case K::ATTN_Q_NORM: case K::ATTN_K_NORM: case K::POST_ATTN_NORM:
    case K::FFN_NORM: case K::SSM_NORM: case K::NEXTN_ENORM: case K::NEXTN_HNORM:
    case K::NEXTN_SHARED_HEAD_NORM:
    case K::FFN_GATE_INP: case K::SSM_CONV1D:
    case K::SSM_A: case K::SSM_DT_BIAS:
      return true;
    default:
      return false;
  }
}

}  // namespace

bool q4_k_m_more_bits(int64_t i, int64_t n) {
  // C++ '%' truncates like C's, which is what llama.cpp evaluates for a negative (i - n/8).
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

namespace {

GgmlType q4_k_m_choice(const SynthTypeQuery& q) {
  switch (q.kind) {
    case K::OUTPUT:
      return GgmlType::Q6_K;
    case K::TOKEN_EMBD:
      // A tied model's embedding is also the LM head and gets the output rule.
      return q.has_output ? GgmlType::Q4_K : GgmlType::Q6_K;
    case K::ATTN_V: case K::ATTN_QKV:  // the GDN fused projection counts as attn_v-like
      return q4_k_m_more_bits(q.attn_v_ordinal, q.attn_v_count) ? GgmlType::Q6_K : GgmlType::Q4_K;
    case K::FFN_DOWN_EXPS: case K::FFN_DOWN_SHEXP:
      return q4_k_m_more_bits(q.layer, q.block_count) ? GgmlType::Q6_K : GgmlType::Q4_K;
    default:
      return GgmlType::Q4_K;
  }
}

}  // namespace

GgmlType synth_tensor_type(SynthTypeMix mix, const SynthTypeQuery& q) {
  ESSAIM_CHECK(q.kind < K::COUNT && mix < SynthTypeMix::COUNT);
  if (mix == SynthTypeMix::F32 || q.n_dims < 2 || never_quantised(q.kind)) return GgmlType::F32;
  if (mix == SynthTypeMix::BF16) return GgmlType::BF16;
  if (mix == SynthTypeMix::Q8_0) return GgmlType::Q8_0;
  const GgmlType t = q4_k_m_choice(q);
  return q.ne0 % 256 == 0 ? t : GgmlType::Q8_0;
}

uint32_t synth_file_type(SynthTypeMix mix) {
  switch (mix) {
    case SynthTypeMix::BF16: return 32;
    case SynthTypeMix::Q8_0: return 7;
    case SynthTypeMix::Q4_K_M: return 15;
    default: return 0;
  }
}

}  // namespace essaim
