#include "slice_test_util.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "core/fp16.h"
#include "slice/expert_slice.h"
#include "gguf/gguf_writer.h"
#include "temp_dir.h"

namespace essaim::testing {
namespace {

struct Tensor {
  std::string name;
  GgmlType type;
  std::vector<int64_t> ne;
};

// Seeded bytes of a tensor of `type`: F32 values in [-1, 1]; block types get random bytes with finite f16
// scales at the start of each block (enough for every reader check; values are never computed with here).
std::vector<uint8_t> random_bytes(GgmlType type, uint64_t nbytes, std::mt19937_64& rng) {
  std::vector<uint8_t> b(nbytes);
  if (type == GgmlType::F32) {
    for (uint64_t i = 0; i + 4 <= nbytes; i += 4) {
      const float v = float(int32_t(rng() >> 40) - (1 << 23)) / float(1 << 23);  // [-1, 1)
      std::memcpy(&b[i], &v, 4);
    }
    return b;
  }
  for (uint8_t& x : b) x = uint8_t(rng());
  const TypeTraits& t = type_traits(type);
  if (t.block_size > 1) {
    for (uint64_t i = 0; i + t.type_size <= nbytes; i += t.type_size) {
      const uint16_t d = f32_to_f16(0.01f), dmin = f32_to_f16(0.001f);
      std::memcpy(&b[i], &d, 2);
      std::memcpy(&b[i + 2], &dmin, 2);
    }
  }
  return b;
}

}  // namespace

Status write_test_moe(const std::string& path, const TestMoeSpec& s) {
  const std::string a = s.arch + ".";
  const int64_t E = s.n_embd, F = s.n_ff, X = s.n_expert, V = 32;
  GgufWriter w(s.alignment);
  w.set_string("general.architecture", s.arch);
  w.set_string("general.name", "slice-test");
  w.set_u32(a + "block_count", s.n_layer);
  w.set_u32(a + "embedding_length", s.n_embd);
  w.set_u32(a + "context_length", 256);
  if (s.with_experts) {
    w.set_u32(a + "expert_count", s.n_expert);
    w.set_u32(a + "expert_used_count", 2);
    w.set_u32(a + "expert_feed_forward_length", s.n_ff);
  }
  w.set_array_string("tokenizer.ggml.tokens", std::vector<std::string>(size_t(V), "t"));

  const GgmlType down_type = s.down_type == GgmlType::COUNT ? s.expert_type : s.down_type;
  std::vector<Tensor> ts;
  ts.push_back({"token_embd.weight", GgmlType::F32, {E, V}});
  for (uint32_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    ts.push_back({p + "attn_norm.weight", GgmlType::F32, {E}});
    ts.push_back({p + "ffn_norm.weight", GgmlType::F32, {E}});
    if (!s.with_experts || l < s.n_dense_layers) {
      ts.push_back({p + "ffn_gate.weight", GgmlType::F32, {E, F}});
      ts.push_back({p + "ffn_up.weight", GgmlType::F32, {E, F}});
      ts.push_back({p + "ffn_down.weight", GgmlType::F32, {F, E}});
      continue;
    }
    ts.push_back({p + "ffn_gate_inp.weight", GgmlType::F32, {E, X}});
    if (s.fused_gate_up) {
      ts.push_back({p + "ffn_gate_up_exps.weight", s.expert_type, {E, 2 * F, X}});
    } else {
      ts.push_back({p + "ffn_gate_exps.weight", s.expert_type, {E, F, X}});
      ts.push_back({p + "ffn_up_exps.weight", s.expert_type, {E, F, X}});
    }
    ts.push_back({p + "ffn_down_exps.weight", down_type, {F, E, X}});
  }
  ts.push_back({"output_norm.weight", GgmlType::F32, {E}});
  for (const Tensor& t : ts) w.add_tensor(t.name, t.type, t.ne);
  ESSAIM_RETURN_IF_ERROR(w.begin(path));
  std::mt19937_64 rng(s.seed);
  for (size_t i = 0; i < ts.size(); ++i)
    ESSAIM_RETURN_IF_ERROR(w.write_tensor_data(random_bytes(ts[i].type, w.tensor_nbytes(i), rng)));
  return w.finish();
}

namespace {

// Removes every directory make_test_dir created once the test program ends.
class TestDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& d : dirs) std::filesystem::remove_all(d);
  }
  std::vector<std::string> dirs;
};
TestDirCleanup* const g_cleanup =
    static_cast<TestDirCleanup*>(::testing::AddGlobalTestEnvironment(new TestDirCleanup));

}  // namespace

// Every expert slab of every tensor the slice holds equals the source's slab of the same global expert.
void expect_slice_matches_source(const GgufFile& src, const ExpertSlice& s) {
  const uint32_t fused_kinds = s.gate_up_fused() ? 2 : 3;
  size_t compared = 0;
  for (const MoeLayer& l : s.layers()) {
    size_t kinds = 0;
    for (size_t k = 0; k < kExpertTensorKindCount; ++k) {
      const GgufTensor* t = l.tensors[k];
      if (t == nullptr) continue;
      ++kinds;
      const GgufTensor* from = src.find_tensor(t->name);
      ASSERT_NE(from, nullptr) << t->name;
      EXPECT_EQ(t->type, from->type) << t->name;
      EXPECT_EQ(t->ne[0], from->ne[0]) << t->name;
      EXPECT_EQ(t->ne[1], from->ne[1]) << t->name;
      EXPECT_EQ(t->ne[2], int64_t(s.expert_count())) << t->name;
      for (uint32_t j = 0; j < s.expert_count(); ++j) {
        const std::span<const uint8_t> got = t->expert_slab(j);
        const std::span<const uint8_t> want = from->expert_slab(s.expert_first() + j);
        ASSERT_EQ(got.size(), want.size());
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size()), 0)
            << t->name << " local expert " << j << " differs from source expert " << s.expert_first() + j;
        ++compared;
      }
    }
    EXPECT_EQ(kinds, fused_kinds) << "layer " << l.layer;
  }
  EXPECT_EQ(compared, size_t(s.layer_count()) * fused_kinds * s.expert_count());
}

void expect_backbone_matches_source(const GgufFile& src, const MoeLayout& moe, const GgufFile& bb) {
  size_t kept = 0;
  for (const GgufTensor& t : src.tensors()) {
    const GgufTensor* b = bb.find_tensor(t.name);
    if (is_routed_expert_tensor_name(t.name)) {
      EXPECT_EQ(b, nullptr) << t.name;
      continue;
    }
    ASSERT_NE(b, nullptr) << t.name;
    EXPECT_EQ(b->type, t.type);
    EXPECT_EQ(b->ne, t.ne);
    ASSERT_EQ(b->nbytes, t.nbytes);
    EXPECT_EQ(std::memcmp(b->data, t.data, t.nbytes), 0) << t.name;
    ++kept;
  }
  EXPECT_EQ(bb.tensors().size(), kept);
  EXPECT_EQ(kept + 3 * moe.layers.size() - (moe.gate_up_fused ? moe.layers.size() : 0), src.tensors().size());
  for (const GgufKv& kv : src.kvs()) {
    const GgufValue* v = bb.find_kv(kv.key);
    ASSERT_NE(v, nullptr) << kv.key;
    EXPECT_EQ(v->type, kv.value.type) << kv.key;
    EXPECT_EQ(v->array_size(), kv.value.array_size()) << kv.key;
    EXPECT_EQ(v->u, kv.value.u) << kv.key;
    EXPECT_EQ(v->str, kv.value.str) << kv.key;
    EXPECT_EQ(v->strs, kv.value.strs) << kv.key;
  }
}

std::string make_test_dir(const std::string& name) {
  const std::string dir = essaim::testing::make_temp_dir("essaim-slice-" + name);
  g_cleanup->dirs.push_back(dir);
  return dir;
}

}  // namespace essaim::testing
