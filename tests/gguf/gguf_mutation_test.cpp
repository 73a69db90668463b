// Seeded random corruption of a valid file: the reader either refuses it or returns views that lie inside
// the bytes it was given (ASan checks every byte touched), and inspect renders whatever it accepted.
#include <random>

#include "gguf/gguf_inspect.h"
#include "gguf_test_util.h"

namespace essaim {
namespace {

std::vector<uint8_t> mutation_base() {
  GgufWriter w;
  w.set_string("general.architecture", "qwen3moe");
  w.set_u32("qwen3moe.expert_count", 4);
  w.set_f64("x.f64", 0.25);
  w.set_array_string("tokenizer.ggml.tokens", {"a", "bc", "<|im_end|>"});
  w.set_array_f32("x.f32s", {1.0f, 2.0f});
  w.add_tensor("token_embd.weight", GgmlType::F32, {4, 3});
  w.add_tensor("blk.0.ffn_gate_exps.weight", GgmlType::Q8_0, {32, 2, 4});
  std::vector<std::vector<uint8_t>> data;
  for (size_t i = 0; i < w.tensor_count(); ++i) data.push_back(test::pattern_bytes(w.tensor_nbytes(i), 5));
  return test::write_gguf(w, data);
}

TEST(GgufMutation, RandomCorruptionNeverEscapesTheBuffer) {
  const std::vector<uint8_t> base = mutation_base();
  std::mt19937_64 rng(20261129);
  const uint64_t interesting[] = {0, 1, 4, 13, 63, 64, 0x7f, 0xff, uint64_t(1) << 30, uint64_t(1) << 31,
                                  uint64_t(1) << 62, uint64_t(1) << 63, ~uint64_t(0), ~uint64_t(0) - 7};
  int accepted = 0;
  int refused = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::vector<uint8_t> b = base;
    const int edits = 1 + int(rng() % 3);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % b.size();
      switch (rng() % 4) {
        case 0: b[pos] = uint8_t(rng()); break;
        case 1: b[pos] ^= uint8_t(1u << (rng() % 8)); break;
        case 2: {
          const uint64_t v = interesting[rng() % std::size(interesting)];
          const size_t width = size_t(1) << (rng() % 4);  // 1, 2, 4 or 8 bytes
          for (size_t k = 0; k < width && pos + k < b.size(); ++k) b[pos + k] = uint8_t(v >> (8 * k));
          break;
        }
        default: b.resize(pos); break;
      }
      if (b.empty()) break;
    }
    const std::vector<uint8_t> exact(b.begin(), b.end());
    Result<GgufFile> f = GgufFile::parse(exact);
    if (!f) {
      ++refused;
      ASSERT_FALSE(f.status().message().empty());
      continue;
    }
    ++accepted;
    uint64_t sum = 0;
    for (const GgufTensor& t : f->tensors()) {
      ASSERT_GE(t.data, exact.data());
      ASSERT_LE(t.file_offset + t.nbytes, exact.size());
      for (uint8_t x : t.bytes()) sum += x;
      if (gguf_is_expert_tensor(t))
        for (int64_t x = 0; x < t.ne[2]; ++x) sum += t.expert_slab(x).size();
    }
    EXPECT_GT(sum + 1, 0u);
    EXPECT_FALSE(gguf_inspect_text(*f, {}).empty());
    EXPECT_NO_THROW((void)gguf_inspect_json(*f, {}).dump());
  }
  // The mutations must actually exercise both outcomes.
  EXPECT_GT(accepted, 100);
  EXPECT_GT(refused, 100);
}

}  // namespace
}  // namespace essaim
