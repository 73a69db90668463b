// The speed library behind `essaim bench`: the tests run it on the tiny synth model and check what a
// user reads off its rows (names, counts, positive rates, spread), and that bad options are errors.
// No timing threshold: speed targets belong to benchmarks, not tests.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>

#include "speed/memory_bandwidth.h"
#include "speed/model_speed.h"
#include "synth/synth.h"
#include "temp_dir.h"

namespace essaim {
namespace {

// ctest runs the tests of this binary as parallel processes: each writes its own copy and renames it into
// place, so a process never maps a file another one is still writing (that was a SIGBUS).
std::unique_ptr<Model> tiny_model() {
  const std::string path = std::string(ESSAIM_BINARY_DIR) + "/speed_test_tiny.gguf";
  const std::string part = essaim::testing::make_temp_file_beside(path);
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::TINY,
                                       .types = SynthTypeMix::Q4_K_M, .seed = 1});
  EXPECT_TRUE(plan.is_ok());
  EXPECT_TRUE(synth_write(*plan, part).is_ok());
  EXPECT_EQ(std::rename(part.c_str(), path.c_str()), 0) << path;
  Result<std::unique_ptr<Model>> m = load_model(path);
  EXPECT_TRUE(m.is_ok()) << m.status().message();
  return m ? std::move(*m) : nullptr;
}

TEST(ModelSpeed, ReportsOneRowPerTestWithEveryRepetition) {
  std::unique_ptr<Model> m = tiny_model();
  ASSERT_TRUE(m);
  ThreadPool pool(2);
  LocalExpertExecutor experts(m->expert_store(), &pool);
  touch_model_pages(*m);
  Result<std::vector<SpeedResult>> rows = measure_model_speed(*m, experts, &pool, {.n_prompt = 16, .n_gen = 5, .reps = 3});
  ASSERT_TRUE(rows.is_ok()) << rows.status().message();
  ASSERT_EQ(rows->size(), 2u);
  EXPECT_EQ((*rows)[0].name, "pp16");
  EXPECT_EQ((*rows)[0].n_prompt, 16);
  EXPECT_EQ((*rows)[1].name, "tg5");
  EXPECT_EQ((*rows)[1].n_gen, 5);
  for (const SpeedResult& r : *rows) {
    EXPECT_EQ(r.seconds.size(), 3u);
    EXPECT_GT(r.avg_ts, 0);
    EXPECT_GT(r.median_ts, 0);
    EXPECT_GE(r.stddev_ts, 0);
  }
  // Generation only, one repetition: no pp row, no spread.
  rows = measure_model_speed(*m, experts, &pool, {.n_prompt = 0, .n_gen = 2, .reps = 1});
  ASSERT_TRUE(rows.is_ok());
  ASSERT_EQ(rows->size(), 1u);
  EXPECT_EQ((*rows)[0].name, "tg2");
  EXPECT_EQ((*rows)[0].stddev_ts, 0);
}

TEST(ModelSpeed, BadOptionsAreErrors) {
  std::unique_ptr<Model> m = tiny_model();
  ASSERT_TRUE(m);
  LocalExpertExecutor experts(m->expert_store(), nullptr);
  EXPECT_FALSE(measure_model_speed(*m, experts, nullptr, {.reps = 0}).is_ok());
  EXPECT_FALSE(measure_model_speed(*m, experts, nullptr, {.n_prompt = -1}).is_ok());
}

TEST(MemoryBandwidth, MeasuresReadAndCopy) {
  ThreadPool pool(2);
  const Bandwidth bw = measure_bandwidth({.bytes = 16 << 20, .reps = 2, .copy = true}, &pool);
  EXPECT_EQ(bw.threads, 2u);
  EXPECT_GE(bw.buffer_bytes, 16 << 20);
  EXPECT_GT(bw.read_gb_per_s, 0);
  EXPECT_GT(bw.copy_gb_per_s, 0);
  EXPECT_EQ(measure_bandwidth({.bytes = 16 << 20, .reps = 1, .copy = false}, nullptr).copy_gb_per_s, 0);
}

}  // namespace
}  // namespace essaim
