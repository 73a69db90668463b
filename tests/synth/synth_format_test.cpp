// The files synth writes, checked against expectations written here straight from docs/reference.md (4.1/4.2
// qwen3moe, 5.1/5.3 qwen35moe, 3 Q4_K_M types, 6 the 122B shapes, 9 key types) — not derived from synth's
// own tables: every key and its GGUF type, every tensor name, shape and type, llama-quantize's order, and
// data offsets that re-read with GgufFile.
#include <gtest/gtest.h>

#include <map>

#include "synth_test_util.h"

namespace essaim {
namespace {

using namespace synth_test;
using VT = GgufValueType;

class ScratchCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    std::filesystem::remove_all(scratch_path(), ec);
  }
};
[[maybe_unused]] ::testing::Environment* const kScratchCleanup =
    ::testing::AddGlobalTestEnvironment(new ScratchCleanup);
constexpr GgmlType F32 = GgmlType::F32, Q4K = GgmlType::Q4_K, Q6K = GgmlType::Q6_K;

struct ExpTensor {
  std::string name;
  std::vector<int64_t> ne;
  GgmlType q4km;  // its type in the Q4_K_M mix (F32 mix: always F32)
};

// docs/reference.md 3's use_more_bits, written here independently of synth.
bool more_bits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }
GgmlType q6_if_more_bits(int i, int n) { return more_bits(i, n) ? Q6K : Q4K; }

std::string blk(int i, const std::string& suffix) { return "blk." + std::to_string(i) + "." + suffix; }

std::vector<ExpTensor> globals(int64_t E, int64_t V) {
  return {{"output.weight", {E, V}, Q6K}, {"output_norm.weight", {E}, F32}, {"token_embd.weight", {E, V}, Q4K}};
}

// docs/reference.md 4.2, each block in name order.
std::vector<ExpTensor> expected_qwen3moe(int L, int64_t E, int64_t H, int64_t Hkv, int64_t D, int64_t X, int64_t F,
                                         int64_t V) {
  std::vector<ExpTensor> t = globals(E, V);
  for (int i = 0; i < L; ++i) {
    const std::vector<ExpTensor> b = {
        {blk(i, "attn_k.weight"), {E, Hkv * D}, Q4K},
        {blk(i, "attn_k_norm.weight"), {D}, F32},
        {blk(i, "attn_norm.weight"), {E}, F32},
        {blk(i, "attn_output.weight"), {H * D, E}, Q4K},
        {blk(i, "attn_q.weight"), {E, H * D}, Q4K},
        {blk(i, "attn_q_norm.weight"), {D}, F32},
        {blk(i, "attn_v.weight"), {E, Hkv * D}, q6_if_more_bits(i, L)},
        {blk(i, "ffn_down_exps.weight"), {F, E, X}, q6_if_more_bits(i, L)},
        {blk(i, "ffn_gate_exps.weight"), {E, F, X}, Q4K},
        {blk(i, "ffn_gate_inp.weight"), {E, X}, F32},
        {blk(i, "ffn_norm.weight"), {E}, F32},
        {blk(i, "ffn_up_exps.weight"), {E, F, X}, Q4K},
    };
    t.insert(t.end(), b.begin(), b.end());
  }
  return t;
}

struct Q35Shape {
  int L, nextn;
  bool fused;
  int64_t E, H, Hkv, D, X, F, Fs, Kc, Dk, Hk, Hv, V;
};

// docs/reference.md 5.3: attention blocks every 4th layer, GDN otherwise, MTP blocks after; each block in name
// order (attn_*, ffn_*, nextn.*, post_attention_norm, ssm_*). attn_v and attn_qkv are one per block, so
// their ordinal is the block index; block_count includes the MTP blocks.
std::vector<ExpTensor> expected_qwen35moe(const Q35Shape& s) {
  const int B = s.L + s.nextn;
  const int64_t E = s.E, key_dim = s.Hk * s.Dk, value_dim = s.Hv * s.Dk;
  std::vector<ExpTensor> t = globals(E, s.V);
  for (int i = 0; i < B; ++i) {
    const bool mtp = i >= s.L, recurrent = !mtp && (i + 1) % 4 != 0;
    std::vector<ExpTensor> b;
    if (recurrent) {
      b = {{blk(i, "attn_gate.weight"), {E, value_dim}, Q4K},
           {blk(i, "attn_norm.weight"), {E}, F32},
           {blk(i, "attn_qkv.weight"), {E, 2 * key_dim + value_dim}, q6_if_more_bits(i, B)}};
    } else {
      b = {{blk(i, "attn_k.weight"), {E, s.Hkv * s.D}, Q4K},
           {blk(i, "attn_k_norm.weight"), {s.D}, F32},
           {blk(i, "attn_norm.weight"), {E}, F32},
           {blk(i, "attn_output.weight"), {s.H * s.D, E}, Q4K},
           {blk(i, "attn_q.weight"), {E, 2 * s.H * s.D}, Q4K},
           {blk(i, "attn_q_norm.weight"), {s.D}, F32},
           {blk(i, "attn_v.weight"), {E, s.Hkv * s.D}, q6_if_more_bits(i, B)}};
    }
    b.push_back({blk(i, "ffn_down_exps.weight"), {s.F, E, s.X}, q6_if_more_bits(i, B)});
    b.push_back({blk(i, "ffn_down_shexp.weight"), {s.Fs, E}, q6_if_more_bits(i, B)});
    if (!s.fused) b.push_back({blk(i, "ffn_gate_exps.weight"), {E, s.F, s.X}, Q4K});
    b.push_back({blk(i, "ffn_gate_inp.weight"), {E, s.X}, F32});
    b.push_back({blk(i, "ffn_gate_inp_shexp.weight"), {E}, F32});
    b.push_back({blk(i, "ffn_gate_shexp.weight"), {E, s.Fs}, Q4K});
    if (s.fused) b.push_back({blk(i, "ffn_gate_up_exps.weight"), {E, 2 * s.F, s.X}, Q4K});
    if (!s.fused) b.push_back({blk(i, "ffn_up_exps.weight"), {E, s.F, s.X}, Q4K});
    b.push_back({blk(i, "ffn_up_shexp.weight"), {E, s.Fs}, Q4K});
    if (mtp) {
      b.push_back({blk(i, "nextn.eh_proj.weight"), {2 * E, E}, Q4K});
      b.push_back({blk(i, "nextn.enorm.weight"), {E}, F32});
      b.push_back({blk(i, "nextn.hnorm.weight"), {E}, F32});
      b.push_back({blk(i, "nextn.shared_head_norm.weight"), {E}, F32});
    }
    b.push_back({blk(i, "post_attention_norm.weight"), {E}, F32});
    if (recurrent) {
      const std::vector<ExpTensor> ssm = {
          {blk(i, "ssm_a"), {s.Hv}, F32},
          {blk(i, "ssm_alpha.weight"), {E, s.Hv}, Q4K},
          {blk(i, "ssm_beta.weight"), {E, s.Hv}, Q4K},
          {blk(i, "ssm_conv1d.weight"), {s.Kc, 2 * key_dim + value_dim}, F32},
          {blk(i, "ssm_dt.bias"), {s.Hv}, F32},
          {blk(i, "ssm_norm.weight"), {s.Dk}, F32},
          {blk(i, "ssm_out.weight"), {value_dim, E}, Q4K},
      };
      b.insert(b.end(), ssm.begin(), ssm.end());
    }
    t.insert(t.end(), b.begin(), b.end());
  }
  return t;
}

void expect_plan_tensors(const SynthPlan& plan, const std::vector<ExpTensor>& want, SynthTypeMix mix) {
  ASSERT_EQ(plan.tensors.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const SynthTensor& t = plan.tensors[i];
    EXPECT_EQ(t.name, want[i].name) << "tensor " << i;
    EXPECT_EQ(t.ne, want[i].ne) << want[i].name;
    EXPECT_EQ(t.type, mix == SynthTypeMix::F32 ? F32 : want[i].q4km) << want[i].name;
  }
}

// The written file, re-read: names, n_dims, extents, types, and offsets = padded running sum (REFERENCE 1.5).
void expect_file_tensors(const GgufFile& f, const std::vector<ExpTensor>& want, SynthTypeMix mix) {
  ASSERT_EQ(f.tensors().size(), want.size());
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_start() % 32, 0u);
  uint64_t offset = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const GgufTensor& t = f.tensors()[i];
    EXPECT_EQ(t.name, want[i].name) << "tensor " << i;
    ASSERT_EQ(t.n_dims, want[i].ne.size()) << want[i].name;
    for (size_t k = 0; k < 4; ++k) EXPECT_EQ(t.ne[k], k < want[i].ne.size() ? want[i].ne[k] : 1) << want[i].name;
    EXPECT_EQ(t.type, mix == SynthTypeMix::F32 ? F32 : want[i].q4km) << want[i].name;
    EXPECT_EQ(t.offset, offset) << want[i].name;
    EXPECT_LE(t.file_offset + t.nbytes, f.file_size()) << want[i].name;
    offset += (t.nbytes + 31) / 32 * 32;
  }
  EXPECT_EQ(f.data_start() + offset, f.file_size());  // the writer pads after the last tensor too
}

// Every key present has exactly the listed type, and every listed key is present (docs/reference.md 9).
void expect_key_types(const GgufFile& f, const std::map<std::string, VT>& want) {
  std::map<std::string, VT> got;
  for (const GgufKv& kv : f.kvs()) got[kv.key] = kv.value.type;
  for (const auto& [key, type] : want) {
    auto it = got.find(key);
    if (it == got.end()) {
      ADD_FAILURE() << "missing key " << key;
      continue;
    }
    EXPECT_EQ(it->second, type) << key;
  }
  for (const auto& [key, type] : got) EXPECT_TRUE(want.count(key)) << "unexpected key " << key;
}

void expect_tokenizer(const GgufFile& f, const std::string& pre) {
  EXPECT_EQ(f.get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f.get_string("tokenizer.ggml.pre"), pre);
  const std::vector<std::string>* tokens = f.get_string_array("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  const GgufValue* types = f.find_kv("tokenizer.ggml.token_type");
  ASSERT_NE(types, nullptr);
  EXPECT_EQ(types->elem_type, VT::INT32);
  ASSERT_EQ(types->array_size(), tokens->size());
  const GgufValue* merges = f.find_kv("tokenizer.ggml.merges");
  ASSERT_NE(merges, nullptr);
  EXPECT_EQ(merges->elem_type, VT::STRING);
  EXPECT_GE(merges->array_size(), 200u);
  const uint32_t bos = *f.get_u32("tokenizer.ggml.bos_token_id"), eos = *f.get_u32("tokenizer.ggml.eos_token_id");
  const uint32_t pad = *f.get_u32("tokenizer.ggml.padding_token_id");
  ASSERT_LT(std::max({bos, eos, pad}), tokens->size());
  EXPECT_EQ((*tokens)[bos], "<|endoftext|>");
  EXPECT_EQ((*tokens)[eos], "<|im_end|>");
  EXPECT_EQ((*tokens)[pad], "<|endoftext|>");
  EXPECT_EQ(f.get_bool("tokenizer.ggml.add_bos_token"), false);
  std::map<std::string, int64_t> special;
  for (size_t i = 0; i < tokens->size(); ++i)
    if (types->ints[i] != 1) special[(*tokens)[i]] = types->ints[i];
  const std::map<std::string, int64_t> want = {
      {"<|endoftext|>", 3}, {"<|im_start|>", 3}, {"<|im_end|>", 3}, {"<think>", 4}, {"</think>", 4}};
  EXPECT_EQ(special, want);
  const std::optional<std::string> tmpl = f.get_string("tokenizer.chat_template");
  ASSERT_TRUE(tmpl.has_value());
  EXPECT_NE(tmpl->find("<|im_start|>"), std::string::npos);
}

std::map<std::string, VT> tokenizer_keys() {
  return {{"tokenizer.ggml.model", VT::STRING},          {"tokenizer.ggml.pre", VT::STRING},
          {"tokenizer.ggml.tokens", VT::ARRAY},          {"tokenizer.ggml.token_type", VT::ARRAY},
          {"tokenizer.ggml.merges", VT::ARRAY},          {"tokenizer.ggml.bos_token_id", VT::UINT32},
          {"tokenizer.ggml.eos_token_id", VT::UINT32},   {"tokenizer.ggml.padding_token_id", VT::UINT32},
          {"tokenizer.ggml.add_bos_token", VT::BOOL},    {"tokenizer.chat_template", VT::STRING},
          {"general.architecture", VT::STRING},          {"general.name", VT::STRING},
          {"general.file_type", VT::UINT32}};
}

class SynthQwen3MoeTiny : public ::testing::TestWithParam<SynthTypeMix> {};

TEST_P(SynthQwen3MoeTiny, KeysTensorsAndOffsetsAreExact) {
  const SynthTypeMix mix = GetParam();
  const std::string path = scratch_file("qwen3moe_tiny_" + std::string(synth_type_mix_name(mix)) + ".gguf");
  const SynthPlan plan = write_model({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::TINY, .types = mix}, path);
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();

  std::map<std::string, VT> keys = tokenizer_keys();
  for (const char* k : {"context_length", "embedding_length", "block_count", "attention.head_count",
                        "attention.head_count_kv", "attention.key_length", "attention.value_length",
                        "rope.dimension_count", "expert_count", "expert_used_count", "expert_feed_forward_length"})
    keys[std::string("qwen3moe.") + k] = VT::UINT32;
  keys["qwen3moe.attention.layer_norm_rms_epsilon"] = VT::FLOAT32;
  keys["qwen3moe.rope.freq_base"] = VT::FLOAT32;
  if (mix == SynthTypeMix::Q4_K_M) keys["general.quantization_version"] = VT::UINT32;
  expect_key_types(*f, keys);

  EXPECT_EQ(f->get_string("general.architecture"), "qwen3moe");
  EXPECT_EQ(f->get_u32("general.file_type"), mix == SynthTypeMix::Q4_K_M ? 15u : 0u);
  if (mix == SynthTypeMix::Q4_K_M) {
    EXPECT_EQ(f->get_u32("general.quantization_version"), 2u);
  }
  EXPECT_EQ(f->get_u32("qwen3moe.block_count"), 2u);
  EXPECT_EQ(f->get_u32("qwen3moe.embedding_length"), 256u);
  EXPECT_EQ(f->get_u32("qwen3moe.attention.head_count"), 4u);
  EXPECT_EQ(f->get_u32("qwen3moe.attention.head_count_kv"), 2u);
  EXPECT_EQ(f->get_u32("qwen3moe.attention.key_length"), 64u);
  EXPECT_EQ(f->get_u32("qwen3moe.attention.value_length"), 64u);
  EXPECT_EQ(f->get_u32("qwen3moe.rope.dimension_count"), 64u);  // must equal D for qwen3moe
  EXPECT_EQ(f->get_u32("qwen3moe.expert_count"), 6u);
  EXPECT_EQ(f->get_u32("qwen3moe.expert_used_count"), 2u);
  EXPECT_EQ(f->get_u32("qwen3moe.expert_feed_forward_length"), 256u);
  EXPECT_EQ(f->get_f32("qwen3moe.attention.layer_norm_rms_epsilon"), 1e-6f);
  EXPECT_EQ(f->get_f32("qwen3moe.rope.freq_base"), 1e6f);
  expect_tokenizer(*f, "qwen2");

  const int64_t V = int64_t(f->get_string_array("tokenizer.ggml.tokens")->size());
  EXPECT_GT(V, 256 + 200);
  const std::vector<ExpTensor> want = expected_qwen3moe(2, 256, 4, 2, 64, 6, 256, V);
  expect_plan_tensors(plan, want, mix);
  expect_file_tensors(*f, want, mix);
  const uint64_t size = f->file_size();
  if (mix == SynthTypeMix::Q4_K_M) {  // "tiny": a few MB
    EXPECT_LT(size, 5u << 20);
  }
}

INSTANTIATE_TEST_SUITE_P(Mixes, SynthQwen3MoeTiny, ::testing::Values(SynthTypeMix::F32, SynthTypeMix::Q4_K_M));

std::map<std::string, VT> qwen35moe_keys(bool q4, bool flags, bool nextn) {
  std::map<std::string, VT> keys = tokenizer_keys();
  for (const char* k : {"context_length", "embedding_length", "block_count", "attention.head_count",
                        "attention.head_count_kv", "attention.key_length", "attention.value_length",
                        "rope.dimension_count", "expert_count", "expert_used_count", "expert_feed_forward_length",
                        "expert_shared_feed_forward_length", "ssm.conv_kernel", "ssm.inner_size", "ssm.state_size",
                        "ssm.time_step_rank", "ssm.group_count"})
    keys[std::string("qwen35moe.") + k] = VT::UINT32;
  keys["qwen35moe.attention.layer_norm_rms_epsilon"] = VT::FLOAT32;
  keys["qwen35moe.rope.freq_base"] = VT::FLOAT32;
  keys["qwen35moe.rope.dimension_sections"] = VT::ARRAY;
  if (flags) keys["qwen35moe.attention.recurrent_layers"] = VT::ARRAY;
  else keys["qwen35moe.full_attention_interval"] = VT::UINT32;
  if (nextn) keys["qwen35moe.nextn_predict_layers"] = VT::UINT32;
  if (q4) keys["general.quantization_version"] = VT::UINT32;
  return keys;
}

struct Q35Case {
  SynthTypeMix mix;
  bool flags;
  uint32_t nextn;
  bool fused;
};

class SynthQwen35MoeTiny : public ::testing::TestWithParam<Q35Case> {};

TEST_P(SynthQwen35MoeTiny, KeysTensorsAndOffsetsAreExact) {
  const Q35Case c = GetParam();
  const std::string path = scratch_file("qwen35moe_tiny_" + std::to_string(int(c.mix)) + std::to_string(c.flags) +
                                        std::to_string(c.nextn) + std::to_string(c.fused) + ".gguf");
  const SynthPlan plan = write_model({.arch = SynthArch::QWEN35MOE, .preset = SynthPreset::TINY, .types = c.mix,
                                      .recurrent_flags = c.flags, .nextn = c.nextn, .fused_gate_up = c.fused},
                                     path);
  Result<GgufFile> f = GgufFile::open(path);
  ASSERT_TRUE(f.is_ok()) << f.status().message();
  expect_key_types(*f, qwen35moe_keys(c.mix == SynthTypeMix::Q4_K_M, c.flags, c.nextn > 0));

  const uint32_t B = 4 + c.nextn;
  EXPECT_EQ(f->get_string("general.architecture"), "qwen35moe");
  EXPECT_EQ(f->get_u32("qwen35moe.block_count"), B);  // includes the MTP blocks
  EXPECT_EQ(f->get_u32("qwen35moe.embedding_length"), 256u);
  EXPECT_EQ(f->get_u32("qwen35moe.attention.head_count"), 4u);
  EXPECT_EQ(f->get_u32("qwen35moe.attention.head_count_kv"), 2u);
  EXPECT_EQ(f->get_u32("qwen35moe.attention.key_length"), 64u);
  EXPECT_EQ(f->get_u32("qwen35moe.rope.dimension_count"), 16u);
  const GgufValue* sections = f->find_kv("qwen35moe.rope.dimension_sections");
  ASSERT_NE(sections, nullptr);
  EXPECT_EQ(sections->elem_type, VT::INT32);
  EXPECT_EQ(sections->ints, (std::vector<int64_t>{3, 3, 2, 0}));  // sum = n_rot / 2
  EXPECT_EQ(f->get_u32("qwen35moe.expert_shared_feed_forward_length"), 256u);
  EXPECT_EQ(f->get_u32("qwen35moe.ssm.conv_kernel"), 4u);
  EXPECT_EQ(f->get_u32("qwen35moe.ssm.inner_size"), 256u);   // Hv * Dv
  EXPECT_EQ(f->get_u32("qwen35moe.ssm.state_size"), 64u);
  EXPECT_EQ(f->get_u32("qwen35moe.ssm.time_step_rank"), 4u);
  EXPECT_EQ(f->get_u32("qwen35moe.ssm.group_count"), 2u);
  EXPECT_EQ(f->get_f32("qwen35moe.rope.freq_base"), 1e7f);
  if (c.flags) {
    const GgufValue* flags = f->find_kv("qwen35moe.attention.recurrent_layers");
    ASSERT_NE(flags, nullptr);
    EXPECT_EQ(flags->elem_type, VT::BOOL);
    std::vector<uint64_t> want = {1, 1, 1, 0};  // layer 3 is attention; MTP blocks are not recurrent
    want.resize(B, 0);
    EXPECT_EQ(flags->uints, want);
  } else {
    EXPECT_EQ(f->get_u32("qwen35moe.full_attention_interval"), 4u);
  }
  if (c.nextn > 0) {
    EXPECT_EQ(f->get_u32("qwen35moe.nextn_predict_layers"), c.nextn);
  }
  expect_tokenizer(*f, "qwen35");

  const int64_t V = int64_t(f->get_string_array("tokenizer.ggml.tokens")->size());
  const std::vector<ExpTensor> want =
      expected_qwen35moe({.L = 4, .nextn = int(c.nextn), .fused = c.fused, .E = 256, .H = 4, .Hkv = 2, .D = 64,
                          .X = 6, .F = 256, .Fs = 256, .Kc = 4, .Dk = 64, .Hk = 2, .Hv = 4, .V = V});
  expect_plan_tensors(plan, want, c.mix);
  expect_file_tensors(*f, want, c.mix);
}

INSTANTIATE_TEST_SUITE_P(Variants, SynthQwen35MoeTiny,
                         ::testing::Values(Q35Case{SynthTypeMix::F32, false, 0, false},
                                           Q35Case{SynthTypeMix::Q4_K_M, false, 0, false},
                                           Q35Case{SynthTypeMix::Q4_K_M, true, 0, false},
                                           Q35Case{SynthTypeMix::Q4_K_M, false, 1, false},
                                           Q35Case{SynthTypeMix::F32, false, 0, true},
                                           Q35Case{SynthTypeMix::Q4_K_M, true, 2, true}));

// The 122B preset's tensor table, without writing 1.4 GB per layer: docs/reference.md 6's derived shapes as
// literal numbers, 48 executed layers + 1 MTP block as the real checkpoint has, Q4_K_M types.
TEST(SynthQ35_122b, Qwen35MoeTableHasTheRealShapes) {
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN35MOE, .preset = SynthPreset::Q35_122B, .layers = 48,
                                       .types = SynthTypeMix::Q4_K_M, .nextn = 1});
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  const int64_t V = int64_t(plan->vocab.tokens.size());
  expect_plan_tensors(*plan,
                      expected_qwen35moe({.L = 48, .nextn = 1, .fused = false, .E = 3072, .H = 32, .Hkv = 2, .D = 256,
                                          .X = 256, .F = 1024, .Fs = 1024, .Kc = 4, .Dk = 128, .Hk = 16, .Hv = 64,
                                          .V = V}),
                      SynthTypeMix::Q4_K_M);
  std::map<std::string, std::vector<int64_t>> shape;
  for (const SynthTensor& t : plan->tensors) shape[t.name] = t.ne;
  using S = std::vector<int64_t>;
  EXPECT_EQ(shape["blk.3.attn_q.weight"], (S{3072, 16384}));
  EXPECT_EQ(shape["blk.3.attn_k.weight"], (S{3072, 512}));
  EXPECT_EQ(shape["blk.3.attn_output.weight"], (S{8192, 3072}));
  EXPECT_EQ(shape["blk.0.attn_qkv.weight"], (S{3072, 12288}));
  EXPECT_EQ(shape["blk.0.attn_gate.weight"], (S{3072, 8192}));
  EXPECT_EQ(shape["blk.0.ssm_conv1d.weight"], (S{4, 12288}));
  EXPECT_EQ(shape["blk.0.ssm_alpha.weight"], (S{3072, 64}));
  EXPECT_EQ(shape["blk.0.ssm_a"], (S{64}));
  EXPECT_EQ(shape["blk.0.ssm_norm.weight"], (S{128}));
  EXPECT_EQ(shape["blk.0.ssm_out.weight"], (S{8192, 3072}));
  EXPECT_EQ(shape["blk.0.ffn_gate_inp.weight"], (S{3072, 256}));
  EXPECT_EQ(shape["blk.0.ffn_gate_exps.weight"], (S{3072, 1024, 256}));
  EXPECT_EQ(shape["blk.0.ffn_down_exps.weight"], (S{1024, 3072, 256}));
  EXPECT_EQ(shape["blk.0.ffn_gate_inp_shexp.weight"], (S{3072}));
  EXPECT_EQ(shape["blk.48.nextn.eh_proj.weight"], (S{6144, 3072}));
  // One expert's gate slab at Q4_K and down slab at Q6_K, as docs/reference.md 3 sizes them.
  for (const SynthTensor& t : plan->tensors) {
    if (t.name == "blk.0.ffn_gate_exps.weight") {
      EXPECT_EQ(t.nbytes / 256, 1769472u);
    }
    if (t.name == "blk.0.ffn_down_exps.weight") {  // layer 0: more bits
      EXPECT_EQ(t.nbytes / 256, 2580480u);
    }
    if (t.name == "blk.6.ffn_down_exps.weight") {
      EXPECT_EQ(t.nbytes / 256, 1769472u);
    }
  }
  const SynthMetadata& m = plan->metadata;
  EXPECT_EQ(m.find("qwen35moe.block_count")->u, 49u);
  EXPECT_EQ(m.find("qwen35moe.nextn_predict_layers")->u, 1u);
  EXPECT_EQ(m.find("qwen35moe.ssm.inner_size")->u, 8192u);
  EXPECT_EQ(m.find("qwen35moe.ssm.group_count")->u, 16u);
  EXPECT_EQ(m.find("qwen35moe.ssm.time_step_rank")->u, 64u);
  EXPECT_EQ(m.find("qwen35moe.ssm.state_size")->u, 128u);
  EXPECT_EQ(m.find("qwen35moe.rope.dimension_count")->u, 64u);
  EXPECT_EQ(m.find("qwen35moe.rope.dimension_sections")->ints, (std::vector<int64_t>{11, 11, 10, 0}));
  EXPECT_EQ(m.find("qwen35moe.context_length")->u, 262144u);
  EXPECT_EQ(m.find("qwen35moe.expert_count")->u, 256u);
  EXPECT_EQ(m.find("qwen35moe.expert_used_count")->u, 8u);
  EXPECT_EQ(m.find("qwen35moe.attention.head_count")->u, 32u);
  EXPECT_EQ(m.find("qwen35moe.attention.head_count_kv")->u, 2u);
  EXPECT_EQ(m.find("qwen35moe.attention.key_length")->u, 256u);
  EXPECT_FLOAT_EQ(float(m.find("qwen35moe.rope.freq_base")->f), 1e7f);
}

TEST(SynthQ35_122b, Qwen3MoeTableUsesTheSameAttentionAndExpertShapes) {
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::Q35_122B,
                                       .types = SynthTypeMix::Q4_K_M});
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  expect_plan_tensors(*plan, expected_qwen3moe(2, 3072, 32, 2, 256, 256, 1024, int64_t(plan->vocab.tokens.size())),
                      SynthTypeMix::Q4_K_M);
  EXPECT_EQ(plan->metadata.find("qwen3moe.rope.dimension_count")->u, 256u);
}

// llama-quantize orders blocks numerically: blk.2.* before blk.10.*.
TEST(SynthOrder, BlocksAreInNumericOrder) {
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .layers = 12, .types = SynthTypeMix::Q4_K_M});
  ASSERT_TRUE(plan.is_ok());
  expect_plan_tensors(*plan, expected_qwen3moe(12, 256, 4, 2, 64, 6, 256, int64_t(plan->vocab.tokens.size())),
                      SynthTypeMix::Q4_K_M);
}

// experts overrides the preset's routed-expert count (the fabric benchmark shards the tiny model 8 ways).
TEST(SynthOptionsCheck, ExpertsOverridesThePresetsCount) {
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .layers = 3, .experts = 16,
                                       .types = SynthTypeMix::Q4_K_M});
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  expect_plan_tensors(*plan, expected_qwen3moe(3, 256, 4, 2, 64, 16, 256, int64_t(plan->vocab.tokens.size())),
                      SynthTypeMix::Q4_K_M);
  EXPECT_EQ(plan->metadata.find("qwen3moe.expert_count")->u, 16u);
}

TEST(SynthOptionsCheck, BadOptionsAreRefusedWithAClearMessage) {
  const auto error_of = [](const SynthOptions& o) {
    Result<SynthPlan> p = synth_plan(o);
    return p.is_ok() ? std::string() : p.status().message();
  };
  EXPECT_NE(error_of({.arch = SynthArch::QWEN3MOE, .nextn = 1}).find("qwen35moe"), std::string::npos);
  EXPECT_NE(error_of({.arch = SynthArch::QWEN3MOE, .fused_gate_up = true}).find("qwen35moe"), std::string::npos);
  EXPECT_NE(error_of({.layers = 0}).find("--layers"), std::string::npos);
  EXPECT_NE(error_of({.router_skew = -1}).find("--router-skew"), std::string::npos);
  EXPECT_NE(error_of({.logits_scale = 0}).find("--logits-scale"), std::string::npos);
  EXPECT_NE(error_of({.arch = SynthArch::QWEN35MOE, .layers = 500, .nextn = 20}).find("512"), std::string::npos);
  EXPECT_NE(error_of({.tokenizer_json = scratch_file("does-not-exist.json")}), "");
  EXPECT_EQ(error_of({.arch = SynthArch::QWEN35MOE, .layers = 8, .nextn = 1}), "");
  EXPECT_NE(error_of({.experts = 1}).find("experts must be in [2, 1024]"), std::string::npos);  // top-2 needs 2
  EXPECT_NE(error_of({.experts = 5000}).find("experts must be in"), std::string::npos);
}

}  // namespace
}  // namespace essaim
