// The Q4_K_M per-tensor rule against docs/reference.md 3's own worked numbers: the more_bits layer sets for 48
// and 49 blocks written out literally, and the rule applied to a 48 + 1 MTP block Qwen3.5-122B plan.
#include <gtest/gtest.h>

#include <set>

#include "synth/synth.h"
#include "synth/synth_quant_rule.h"

namespace essaim {
namespace {

// docs/reference.md 3: "For n = 48 this selects layers {0–5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35, 38, 41, 42–47}
// (24 of 48). For n = 49 (48 + one MTP block) the same set plus 48."
const std::set<int> kMoreBits48 = {0,  1,  2,  3,  4,  5,  8,  11, 14, 17, 20, 23,
                                   26, 29, 32, 35, 38, 41, 42, 43, 44, 45, 46, 47};

TEST(SynthQuantRule, MoreBitsSelectsTheDocumentedLayers) {
  std::set<int> got48, got49;
  for (int i = 0; i < 48; ++i)
    if (q4_k_m_more_bits(i, 48)) got48.insert(i);
  for (int i = 0; i < 49; ++i)
    if (q4_k_m_more_bits(i, 49)) got49.insert(i);
  EXPECT_EQ(got48, kMoreBits48);
  EXPECT_EQ(got48.size(), 24u);
  std::set<int> want49 = kMoreBits48;
  want49.insert(48);
  EXPECT_EQ(got49, want49);
}

TEST(SynthQuantRule, SmallBlockCounts) {
  // n = 2: n/8 = 0, 7n/8 = 1 -> layer 0 has (0 - 0) % 3 = 0 (no), layer 1 >= 1 (yes).
  EXPECT_FALSE(q4_k_m_more_bits(0, 2));
  EXPECT_TRUE(q4_k_m_more_bits(1, 2));
  // n = 4: 7n/8 = 3 -> only layer 3; layer 2 has (2 - 0) % 3 == 2 -> yes as well.
  EXPECT_FALSE(q4_k_m_more_bits(0, 4));
  EXPECT_FALSE(q4_k_m_more_bits(1, 4));
  EXPECT_TRUE(q4_k_m_more_bits(2, 4));
  EXPECT_TRUE(q4_k_m_more_bits(3, 4));
}

TEST(SynthQuantRule, KindRules) {
  using K = TensorName;
  const auto type = [](K kind, uint32_t n_dims, bool has_output = true) {
    return synth_tensor_type(SynthTypeMix::Q4_K_M,
                             {.kind = kind, .n_dims = n_dims, .layer = 10, .block_count = 48, .attn_v_ordinal = 10,
                              .attn_v_count = 48, .has_output = has_output});
  };
  EXPECT_EQ(type(K::OUTPUT, 2), GgmlType::Q6_K);
  EXPECT_EQ(type(K::TOKEN_EMBD, 2), GgmlType::Q4_K);
  EXPECT_EQ(type(K::TOKEN_EMBD, 2, /*has_output=*/false), GgmlType::Q6_K);  // tied: the output rule
  for (K k : {K::ATTN_NORM, K::ATTN_Q_NORM, K::ATTN_K_NORM, K::POST_ATTN_NORM, K::FFN_NORM, K::OUTPUT_NORM,
              K::SSM_NORM, K::SSM_A, K::SSM_DT_BIAS, K::FFN_GATE_INP_SHEXP, K::NEXTN_ENORM, K::NEXTN_HNORM,
              K::NEXTN_SHARED_HEAD_NORM})
    EXPECT_EQ(type(k, 1), GgmlType::F32) << int(k);
  EXPECT_EQ(type(K::FFN_GATE_INP, 2), GgmlType::F32);  // router: explicit exclusion
  EXPECT_EQ(type(K::SSM_CONV1D, 2), GgmlType::F32);    // explicit exclusion
  for (K k : {K::ATTN_Q, K::ATTN_K, K::ATTN_OUTPUT, K::ATTN_GATE, K::SSM_OUT, K::SSM_ALPHA, K::SSM_BETA,
              K::NEXTN_EH_PROJ, K::FFN_GATE_SHEXP, K::FFN_UP_SHEXP})
    EXPECT_EQ(type(k, 2), GgmlType::Q4_K) << int(k);
  for (K k : {K::FFN_GATE_EXPS, K::FFN_UP_EXPS, K::FFN_GATE_UP_EXPS}) EXPECT_EQ(type(k, 3), GgmlType::Q4_K) << int(k);
  // Layer 10 of 48 is not in the more_bits set; 11 is.
  EXPECT_EQ(type(K::ATTN_V, 2), GgmlType::Q4_K);
  EXPECT_EQ(type(K::FFN_DOWN_EXPS, 3), GgmlType::Q4_K);
  const SynthTypeQuery q11{.kind = K::FFN_DOWN_SHEXP, .n_dims = 2, .layer = 11, .block_count = 48};
  EXPECT_EQ(synth_tensor_type(SynthTypeMix::Q4_K_M, q11), GgmlType::Q6_K);
  const SynthTypeQuery v11{.kind = K::ATTN_QKV, .n_dims = 2, .attn_v_ordinal = 11, .attn_v_count = 48};
  EXPECT_EQ(synth_tensor_type(SynthTypeMix::Q4_K_M, v11), GgmlType::Q6_K);
  EXPECT_EQ(synth_tensor_type(SynthTypeMix::F32, q11), GgmlType::F32);
  EXPECT_EQ(synth_file_type(SynthTypeMix::Q4_K_M), 15u);
  EXPECT_EQ(synth_file_type(SynthTypeMix::F32), 0u);
}

// The whole 122B table: attn_v / attn_qkv by ordinal and ffn_down_exps / ffn_down_shexp by layer follow the
// literal 48-layer set, with the MTP block (48) counted in block_count.
TEST(SynthQuantRule, Qwen35_122bPlanFollowsTheDocumentedSets) {
  for (uint32_t nextn : {0u, 1u}) {
    Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN35MOE, .preset = SynthPreset::Q35_122B,
                                         .layers = 48, .types = SynthTypeMix::Q4_K_M, .nextn = nextn});
    ASSERT_TRUE(plan.is_ok()) << plan.status().message();
    std::set<int> want = kMoreBits48;
    if (nextn == 1) want.insert(48);
    std::set<int> v6, down6, shdown6;
    int n_v = 0;
    for (const SynthTensor& t : plan->tensors) {
      const bool q6 = t.type == GgmlType::Q6_K;
      if (t.kind == TensorName::ATTN_V || t.kind == TensorName::ATTN_QKV) {
        ++n_v;
        if (q6) v6.insert(t.layer);
      }
      if (t.kind == TensorName::FFN_DOWN_EXPS && q6) down6.insert(t.layer);
      if (t.kind == TensorName::FFN_DOWN_SHEXP && q6) shdown6.insert(t.layer);
      if (t.kind == TensorName::OUTPUT) {
        EXPECT_EQ(t.type, GgmlType::Q6_K);
      }
      if (t.kind == TensorName::TOKEN_EMBD) {
        EXPECT_EQ(t.type, GgmlType::Q4_K);
      }
    }
    EXPECT_EQ(n_v, 48 + int(nextn));
    EXPECT_EQ(v6, want) << "nextn " << nextn;
    EXPECT_EQ(down6, want) << "nextn " << nextn;
    EXPECT_EQ(shdown6, want) << "nextn " << nextn;
  }
}

}  // namespace
}  // namespace essaim
