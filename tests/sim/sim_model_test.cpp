// essaim-sim's inputs: the scenario parser (defaults, hostile documents refused with the field's name), the
// model's shape (Q4_K_M expert bytes by layer, the catalogue), wire bytes equal to the protocol encoder's,
// the routing model's skew carried from the measured picks, the cost model's interpolation, the report's
// statistics.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <nlohmann/json.hpp>
#include <set>

#include "proto/messages.h"
#include "sim/cost_model.h"
#include "sim/model_shape.h"
#include "sim/routing_model.h"
#include "sim/scenario.h"
#include "sim/sim_data.h"
#include "sim/sim_report.h"
#include "synth/synth.h"
#include "temp_dir.h"

namespace essaim::sim {
namespace {

TEST(SimScenario, DefaultsAndOverrides) {
  Result<Scenario> s = parse_scenario("{}");
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->workers, 100);
  ASSERT_EQ(s->classes.size(), 3u);
  EXPECT_EQ(s->classes[0].name, "phone");
  EXPECT_TRUE(s->heartbeat_while_downloading);  // as worker/joined_worker.cpp does
  EXPECT_EQ(s->slice_server_mbps, 10'000);
  s = parse_scenario(R"({"workers": 7, "hot_cache_mb": 64, "slice_server_mbps": 0, "classes": [{"name": "box", "budget_mb": 512}]})");
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->workers, 7);
  EXPECT_EQ(s->hot_cache_bytes, 64 << 20);
  EXPECT_EQ(s->slice_server_mbps, 0);
  ASSERT_EQ(s->classes.size(), 1u);
  EXPECT_EQ(s->classes[0].budget_bytes, 512 << 20);
  // The report's copy of the scenario reads back the same.
  Result<Scenario> again = parse_scenario(scenario_json(*s));
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(scenario_json(*again), scenario_json(*s));
}

TEST(SimScenario, HostileDocumentsAreRefusedByName) {
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"[", "not valid JSON"},
      {"[1]", "must be a JSON object"},
      {R"({"wokers": 3})", "unknown field \"wokers\""},
      {R"({"workers": 0})", "scenario.workers"},
      {R"({"workers": 1.5})", "must be an integer"},
      {R"({"workers": 99999999999999999999})", "scenario.workers"},
      {R"({"hours": -1})", "scenario.hours"},
      {R"({"seed": -1})", "scenario.seed"},
      {R"({"slice_server_mbps": -5})", "scenario.slice_server_mbps"},
      {R"({"hedge": 1})", "must be true or false"},
      {R"({"classes": []})", "scenario.classes"},
      {R"({"classes": [{"speed": 0}]})", "[0].speed"},
      {R"({"classes": [{"name": ""}]})", "[0].name"},
      {R"({"classes": [{"share": 0}]})", "shares add up to 0"},
      {R"({"classes": [5]})", "[0] must be a JSON object"},
  };
  for (const auto& [doc, why] : bad) {
    Result<Scenario> s = parse_scenario(doc);
    ASSERT_FALSE(s) << doc;
    EXPECT_NE(s.status().message().find(why), std::string::npos) << doc << ": " << s.status().message();
  }
}

TEST(SimScenario, AOneMachineRunIsDescribed) {
  Result<Scenario> s = parse_scenario(R"({"model_file": "m.gguf", "routing": "uniform", "fixed_placement": true,
      "shared_host_cores": 2, "expert_cost": {"points": [{"down_type": "q6_k", "rows_per_expert": 1,
      "seconds_per_expert": 0.001}]}})");
  ASSERT_TRUE(s) << s.status().message();
  EXPECT_EQ(s->model_file, "m.gguf");
  EXPECT_TRUE(s->uniform_routing);
  EXPECT_TRUE(s->fixed_placement);
  EXPECT_EQ(s->shared_host_cores, 2);
  Result<CostModel> cost = CostModel::from_json(s->expert_cost_json);
  ASSERT_TRUE(cost) << cost.status().message();
  EXPECT_DOUBLE_EQ(cost->expert_seconds(2, GgmlType::Q6_K), 0.002);
  Result<Scenario> again = parse_scenario(scenario_json(*s));
  ASSERT_TRUE(again) << again.status().message();
  EXPECT_EQ(scenario_json(*again), scenario_json(*s));
  const Result<Scenario> plain = parse_scenario("{}");
  EXPECT_TRUE(plain->model_file.empty() && !plain->uniform_routing && !plain->fixed_placement);
  EXPECT_EQ(plain->shared_host_cores, 0);
  for (const auto& [doc, why] : std::vector<std::pair<std::string, std::string>>{
           {R"({"routing": "zipf"})", "scenario.routing"},
           {R"({"model_file": 3})", "scenario.model_file"},
           {R"({"shared_host_cores": -1})", "scenario.shared_host_cores"},
           {R"({"fixed_placement": "yes"})", "scenario.fixed_placement"},
           {R"({"expert_cost": {"points": []}})", "scenario.expert_cost"},
           {R"({"expert_cost": {"points": [{"down_type": "Q9_K", "rows_per_expert": 1, "seconds_per_expert": 1}]}})",
            "scenario.expert_cost"}}) {
    Result<Scenario> bad = parse_scenario(doc);
    ASSERT_FALSE(bad) << doc;
    EXPECT_NE(bad.status().message().find(why), std::string::npos) << doc << ": " << bad.status().message();
  }
}

TEST(SimModel, ShapeOfAGgufFileAndTheHarnessPlacement) {
  const std::string dir = essaim::testing::make_temp_dir("essaim-sim-shape");
  const std::string path = dir + "/tiny.gguf";
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::TINY, .layers = 3,
                                       .types = SynthTypeMix::Q4_K_M, .seed = 1});
  ASSERT_TRUE(plan) << plan.status().message();
  ASSERT_TRUE(synth_write(*plan, path));
  Result<ModelShape> m = model_shape_from_gguf(path);
  ASSERT_TRUE(m) << m.status().message();
  EXPECT_EQ(m->n_layers, 3);
  EXPECT_EQ(m->n_experts, 6);
  EXPECT_EQ(m->k, 2);
  EXPECT_EQ(m->n_embd, 256);
  EXPECT_EQ(m->act_type, GgmlType::Q8_K);
  ASSERT_EQ(m->expert_bytes.size(), 3u);
  ASSERT_EQ(m->down_type.size(), 3u);
  for (int64_t b : m->expert_bytes) EXPECT_GT(b, 0);
  // 6 experts on 4 workers as bench/support/worker_processes.cpp cuts them: 1, 2, 1, 2 of every layer.
  std::vector<std::vector<size_t>> held;
  const coord::Catalogue cat = range_catalogue(*m, 4, held);
  ASSERT_EQ(held.size(), 4u);
  ASSERT_EQ(cat.slices.size(), 12u);
  const std::vector<int64_t> counts = {1, 2, 1, 2};
  for (size_t p = 0; p < 4; ++p) {
    ASSERT_EQ(held[p].size(), 3u);
    for (size_t s : held[p]) {
      EXPECT_EQ(cat.slices[s].expert_count, counts[p]);
      EXPECT_EQ(cat.slices[s].bytes, counts[p] * m->expert_bytes[size_t(cat.slices[s].layer)]);
    }
  }
  // More workers than experts: the empty ranges hold nothing.
  const coord::Catalogue wide = range_catalogue(*m, 8, held);
  EXPECT_EQ(wide.slices.size(), 18u);
  EXPECT_TRUE(held[0].empty());
  Result<ModelShape> missing = model_shape_from_gguf(dir + "/absent.gguf");
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.status().message().find("absent.gguf"), std::string::npos) << missing.status().message();
  std::filesystem::remove_all(dir);
}

TEST(SimModel, UniformRoutingPicksEveryExpertAlike) {
  Result<RoutingModel> r = RoutingModel::uniform(2, 64, 8);
  ASSERT_TRUE(r) << r.status().message();
  for (double x : r->shares(1)) EXPECT_DOUBLE_EQ(x, 1.0 / 64);
  std::mt19937_64 rng(5);
  std::vector<int32_t> ids;
  std::vector<int> picks(64, 0);
  for (int t = 0; t < 4000; ++t) {
    r->draw(0, rng, ids);
    ASSERT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), 8u);
    for (int32_t e : ids) ++picks[size_t(e)];
  }
  // 500 expected picks each; a skewed draw would leave some far off.
  EXPECT_GT(*std::min_element(picks.begin(), picks.end()), 400);
  EXPECT_LT(*std::max_element(picks.begin(), picks.end()), 600);
  EXPECT_FALSE(RoutingModel::uniform(2, 4, 8));
}

TEST(SimModel, Qwen122bExpertBytesFollowTheQ4KMRule) {
  const ModelShape m = qwen35_122b();
  ASSERT_EQ(m.expert_bytes.size(), 48u);
  // gate + up: 1024 rows of 3072 Q4_K (12 blocks x 144 bytes); down: 3072 rows of 1024 (4 blocks) Q4_K or Q6_K.
  const int64_t q4 = 2 * 1024 * 12 * 144 + 3072 * 4 * 144, q6 = 2 * 1024 * 12 * 144 + 3072 * 4 * 210;
  std::set<int64_t> seen(m.expert_bytes.begin(), m.expert_bytes.end());
  EXPECT_EQ(seen, (std::set<int64_t>{q4, q6}));
  EXPECT_EQ(m.expert_bytes[0], q6);  // use_more_bits: the first eighth of the layers
  const coord::Catalogue c = slice_catalogue(m, 32);
  ASSERT_EQ(c.slices.size(), 48u * 8u);
  EXPECT_EQ(c.slices[0].bytes, 32 * q6);
  EXPECT_EQ(slice_catalogue(m, 100).slices.size(), 48u * 3u);  // 100 + 100 + 56
}

TEST(SimModel, WireBytesAreTheEncodersFrames) {
  const ModelShape m = qwen35_122b();
  for (auto [rows, pairs] : {std::pair<uint64_t, uint64_t>{1, 1}, {16, 40}, {3, 3}}) {
    proto::ExpertRequest r{.act_type = GgmlType::Q8_K, .act_row_bytes = 3504};
    r.row_expert_counts.assign(rows, 0);
    for (uint64_t p = 0; p < pairs; ++p) ++r.row_expert_counts[p % rows];
    r.expert_ids.assign(pairs, 7);
    r.activations.assign(rows * 3504, 1);
    EXPECT_EQ(m.request_bytes(rows, pairs), proto::encode_message(r).size());
    EXPECT_EQ(m.request_bytes(rows, pairs), m.request_bytes(rows, pairs));  // memoised alike
  }
  EXPECT_EQ(m.response_bytes(10, false) - m.response_bytes(10, true), 10u * 3072u * 2u);
}

TEST(SimModel, RoutingCarriesTheMeasuredSkew) {
  Result<RoutingModel> r = RoutingModel::from_json(router_stats_json(), 48, 256, 8, 1);
  ASSERT_TRUE(r) << r.status().message();
  const nlohmann::json measured = nlohmann::json::parse(router_stats_json());
  // Layer 47 takes the last measured layer (the most skewed): the share of its top eighth of the experts
  // (4 of 32 measured, 32 of 256 here) carries over (+-0.02).
  std::vector<double> src = measured["layers"].back()["picks"].get<std::vector<double>>();
  std::sort(src.begin(), src.end(), std::greater<>());
  const double src_total = std::accumulate(src.begin(), src.end(), 0.0);
  const double src_top = (src[0] + src[1] + src[2] + src[3]) / src_total;
  std::vector<double> s = r->shares(47);
  EXPECT_NEAR(std::accumulate(s.begin(), s.end(), 0.0), 1.0, 1e-9);
  std::sort(s.begin(), s.end(), std::greater<>());
  EXPECT_NEAR(std::accumulate(s.begin(), s.begin() + 32, 0.0), src_top, 0.02);
  EXPECT_GT(s.front(), 1.5 / 256);  // skewed, not uniform
  std::mt19937_64 rng(3);
  std::vector<int32_t> ids;
  std::set<int32_t> all;
  for (int t = 0; t < 100; ++t) {
    r->draw(5, rng, ids);
    ASSERT_EQ(ids.size(), 8u);
    EXPECT_EQ(std::set<int32_t>(ids.begin(), ids.end()).size(), 8u);
    all.insert(ids.begin(), ids.end());
  }
  EXPECT_GT(all.size(), 150u);  // the draws vary
  EXPECT_FALSE(RoutingModel::from_json("{\"layers\": []}", 48, 256, 8, 1));
  EXPECT_FALSE(RoutingModel::from_json("{\"layers\": [{\"picks\": [0, 0]}]}", 48, 256, 8, 1));
}

TEST(SimModel, CostModelInterpolatesTheCalibration) {
  Result<CostModel> c = CostModel::from_json(expert_cost_json());
  ASSERT_TRUE(c) << c.status().message();
  const double one = c->expert_seconds(1, GgmlType::Q4_K), eight = c->expert_seconds(8, GgmlType::Q4_K);
  const double four = c->expert_seconds(4, GgmlType::Q4_K), big = c->expert_seconds(640, GgmlType::Q4_K);
  EXPECT_GT(one, 1e-5);
  EXPECT_LT(one, 1e-2);
  EXPECT_GT(four, one);
  EXPECT_LT(four, eight);
  EXPECT_NEAR(big, c->expert_seconds(64, GgmlType::Q4_K) * 10, 1e-12);  // compute-bound beyond the last point
  EXPECT_FALSE(CostModel::from_json(R"({"points": [{"down_type": "Q4_K", "rows_per_expert": 1, "seconds_per_expert": -1}]})"));
}

TEST(SimReport, GiniAndQuantiles) {
  EXPECT_DOUBLE_EQ(gini({1, 1, 1, 1}), 0);
  EXPECT_NEAR(gini({0, 0, 0, 8}), 0.75, 1e-12);
  EXPECT_DOUBLE_EQ(gini({}), 0);
  EXPECT_DOUBLE_EQ(quantile({5, 1, 3}, 0.5), 3);
  EXPECT_DOUBLE_EQ(quantile({5, 1, 3}, 0.99), 5);
}

}  // namespace
}  // namespace essaim::sim
