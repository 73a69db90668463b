// Pins the computed bits: SHA-256 of the teacher-forced logits (LogitsMode::ALL) of the tiny synth models
// of both architectures (F32 and Q4_K_M, routed top-4), and of the outputs of the worker's pure function, expert_ffn, on
// experts with the real Qwen3.5-122B shapes (3072 -> 1024 -> 3072; Q4_K gate/up, Q4_K or Q6_K down).
//
// Every other numeric test compares the engine with itself (invariance) or with a reference under a
// tolerance, so a change that moves bits but keeps them close — summing the MoE combine in another order, a
// reordered kernel reduction — passes them all. This test fails on any changed bit. The pins live in
// tests/model/bit_pins.txt; a deliberate numerics change regenerates them (ESSAIM_PRINT_PINS=1, see the
// file's header) in a commit that says why the numbers changed.
//
// Each case is computed once per instruction set this CPU supports (and under a second thread count /
// chunking), and every variant must give the pinned digest: the same pins hold under ESSAIM_ISA=scalar,
// avx2 and avx512.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "slice/model_identity.h"
#include "kernels/blocks.h"
#include "kernels/kernel_traits.h"
#include "gguf_edit.h"
#include "model_test_util.h"
#include "moe/expert_ffn.h"
#include "synth/synth.h"

namespace essaim {
namespace {

const char* const kPinsFile = ESSAIM_SOURCE_DIR "/tests/model/bit_pins.txt";

std::map<std::string, std::string> read_pins() {
  std::map<std::string, std::string> pins;
  std::ifstream f(kPinsFile);
  EXPECT_TRUE(f.good()) << "cannot read " << kPinsFile;
  std::string line;
  while (std::getline(f, line)) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string name, hex;
    s >> name >> hex;
    pins[name] = hex;
  }
  return pins;
}

const std::map<std::string, std::string>& pins() {
  static const std::map<std::string, std::string> p = read_pins();
  return p;
}

std::string digest_of(const std::vector<float>& v) {
  return digest_hex(sha256(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()), v.size() * 4)));
}

std::vector<Isa> supported_isas() {
  std::vector<Isa> out;
  for (int i = 0; i < int(Isa::COUNT); ++i)
    if (isa_supported(Isa(i))) out.push_back(Isa(i));
  return out;
}

// Restores the process-wide ISA choice whatever the test does.
struct IsaGuard {
  Isa saved = kernels_isa();
  ~IsaGuard() { (void)set_kernel_isa(saved); }
};

// Compares one digest per variant with the pin; prints the pin line when asked to regenerate.
void expect_pinned(const std::string& name, const std::vector<std::pair<std::string, std::string>>& digests) {
  ASSERT_FALSE(digests.empty());
  if (std::getenv("ESSAIM_PRINT_PINS")) std::printf("%s %s\n", name.c_str(), digests[0].second.c_str());
  for (const auto& [variant, hex] : digests)
    EXPECT_EQ(hex, digests[0].second) << name << ": " << variant << " differs from " << digests[0].first;
  const auto it = pins().find(name);
  ASSERT_NE(it, pins().end()) << "no pin '" << name << "' in " << kPinsFile << "; computed " << digests[0].second;
  EXPECT_EQ(digests[0].second, it->second)
      << name << ": the computed bits changed. If deliberate, regenerate " << kPinsFile
      << " (see its header) and say why in the commit";
}

// ---- teacher-forced logits of the tiny synth models ----------------------------------------------------

struct LogitsCase {
  SynthArch arch;
  SynthTypeMix types;
};

std::string case_name(const LogitsCase& c) {
  return "logits." + std::string(synth_arch_name(c.arch)) + "." + std::string(synth_type_mix_name(c.types));
}

class LogitsPins : public ::testing::TestWithParam<LogitsCase> {};

TEST_P(LogitsPins, TeacherForcedLogitsHaveThePinnedDigest) {
  const LogitsCase& c = GetParam();
  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/bit_pins_" + case_name(c) + ".gguf";
  Result<SynthPlan> plan = synth_plan({.arch = c.arch, .preset = SynthPreset::TINY, .types = c.types, .seed = 1});
  ASSERT_TRUE(plan.is_ok()) << plan.status().message();
  Result<SynthSummary> written = synth_write(*plan, path);
  ASSERT_TRUE(written.is_ok()) << written.status().message();
  // Top-4 of the 6 experts instead of the preset's top-2: with two slots the combine's two products are
  // added in one commutative step, so a changed slot order would not show in the bits.
  const std::string edited = test::gguf_rewrite(
      path, "bit_pins_" + case_name(c) + "_top4",
      {.set_keys = {{std::string(synth_arch_name(c.arch)) + ".expert_used_count", test::gguf_u32(4)}}});
  std::unique_ptr<Model> m = test::load_or_die(edited);
  ASSERT_EQ(m->info().n_expert_used, 4);
  ASSERT_TRUE(m);
  const std::vector<int32_t> tokens = {9, 120, 33, 7, 250, 101, 64, 18, 3, 77, 200, 45};
  IsaGuard guard;
  std::vector<std::pair<std::string, std::string>> digests;
  for (Isa isa : supported_isas()) {
    ASSERT_TRUE(set_kernel_isa(isa).is_ok());
    digests.emplace_back(std::string(isa_name(isa)) + " 2 threads",
                         digest_of(test::eval_logits(*m, tokens, {.batch = 0, .threads = 2})));
    digests.emplace_back(std::string(isa_name(isa)) + " 1 thread, chunks of 5",
                         digest_of(test::eval_logits(*m, tokens, {.batch = 5, .threads = 1})));
  }
  expect_pinned(case_name(c), digests);
  std::remove(path.c_str());
  std::remove(edited.c_str());
}

INSTANTIATE_TEST_SUITE_P(TinySynth, LogitsPins,
                         ::testing::Values(LogitsCase{SynthArch::QWEN3MOE, SynthTypeMix::F32},
                                           LogitsCase{SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M},
                                           LogitsCase{SynthArch::QWEN35MOE, SynthTypeMix::F32},
                                           LogitsCase{SynthArch::QWEN35MOE, SynthTypeMix::Q4_K_M}),
                         [](const auto& info) {
                           std::string n = case_name(info.param).substr(7);
                           for (char& ch : n)
                             if (ch == '.') ch = '_';
                           return n;
                         });

// ---- the worker's expert outputs at 122B shapes ---------------------------------------------------------

// Seeded random blocks: every bit pattern of the quants and packed scales is valid, and the f16 super-scales
// are drawn from a small positive range so that the outputs stay finite.
void fill_blocks(GgmlType type, std::vector<uint8_t>& bytes, std::mt19937& rng) {
  std::uniform_int_distribution<uint32_t> byte(0, 255);
  std::uniform_real_distribution<float> scale(2e-4f, 2e-3f);
  for (uint8_t& b : bytes) b = uint8_t(byte(rng));
  if (type == GgmlType::Q4_K) {
    auto* blocks = reinterpret_cast<BlockQ4K*>(bytes.data());
    for (size_t i = 0; i < bytes.size() / sizeof(BlockQ4K); ++i) {
      blocks[i].d = f32_to_f16(scale(rng));
      blocks[i].dmin = f32_to_f16(scale(rng));
    }
  } else {
    ASSERT_EQ(type, GgmlType::Q6_K);
    auto* blocks = reinterpret_cast<BlockQ6K*>(bytes.data());
    for (size_t i = 0; i < bytes.size() / sizeof(BlockQ6K); ++i) blocks[i].d = f32_to_f16(scale(rng) * 0.1f);
  }
}

class ExpertPins : public ::testing::TestWithParam<GgmlType> {};

TEST_P(ExpertPins, WorkerExpertOutputsHaveThePinnedDigest) {
  const GgmlType down_type = GetParam();
  constexpr int32_t kEmbd = 3072, kFf = 1024, kExperts = 3, kRows = 8, kSlots = 3, kBegin = 40;
  std::mt19937 rng(15);
  const uint64_t gu_bytes = type_traits(GgmlType::Q4_K).row_bytes(kEmbd) * kFf * kExperts;
  const uint64_t down_bytes = type_traits(down_type).row_bytes(kFf) * kEmbd * kExperts;
  std::vector<uint8_t> gate(gu_bytes), up(gu_bytes), down(down_bytes);
  fill_blocks(GgmlType::Q4_K, gate, rng);
  fill_blocks(GgmlType::Q4_K, up, rng);
  fill_blocks(down_type, down, rng);
  const ExpertLayer layer = ExpertLayer::separate({GgmlType::Q4_K, kEmbd, kFf, kExperts, gate.data()},
                                                  {GgmlType::Q4_K, kEmbd, kFf, kExperts, up.data()},
                                                  {down_type, kFf, kEmbd, kExperts, down.data()}, kBegin);
  ASSERT_TRUE(layer.validate().is_ok());

  // Activation rows as the backbone sends them (Q8_K), and ids with uneven counts per expert (so every row
  // group size of the kernels occurs) and two unrequested slots.
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f(size_t(kRows) * kEmbd);
  for (float& v : f) v = normal(rng);
  std::vector<uint8_t> act(size_t(kRows) * layer.activation_row_bytes());
  quantize_activations(GgmlType::Q4_K, f.data(), kRows, kEmbd, act.data());
  std::vector<int32_t> ids(size_t(kRows) * kSlots);
  std::uniform_int_distribution<int32_t> pick(kBegin, kBegin + kExperts - 1);
  for (int32_t& id : ids) id = pick(rng);
  ids[4] = -1;
  ids[17] = -1;

  IsaGuard guard;
  std::vector<std::pair<std::string, std::string>> digests;
  for (Isa isa : supported_isas()) {
    ASSERT_TRUE(set_kernel_isa(isa).is_ok());
    for (size_t threads : {size_t(1), size_t(2)}) {
      ThreadPool pool(threads);
      std::vector<float> out(size_t(kRows) * kSlots * kEmbd, 0.0f);  // unrequested slots stay 0
      ASSERT_TRUE(expert_ffn(layer, act.data(), kRows, kSlots, ids.data(), out.data(), &pool).is_ok());
      digests.emplace_back(std::string(isa_name(isa)) + " " + std::to_string(threads) + " threads", digest_of(out));
    }
  }
  expect_pinned(down_type == GgmlType::Q4_K ? "experts.q35-122b.gate_up_q4_k.down_q4_k"
                                            : "experts.q35-122b.gate_up_q4_k.down_q6_k",
                digests);
}

INSTANTIATE_TEST_SUITE_P(Q35_122bShapes, ExpertPins, ::testing::Values(GgmlType::Q4_K, GgmlType::Q6_K),
                         [](const auto& info) { return std::string(type_name(info.param)); });

}  // namespace
}  // namespace essaim
