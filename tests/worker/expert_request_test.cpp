// check_expert_request / compute_expert_request without a connection: the order of the checks (the first
// failing one names the problem), and exact results for CSR shapes the backbone produces.
#include "worker/expert_request.h"

#include <gtest/gtest.h>

#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

using proto::ErrorCode;

struct Fixture {
  const TestModel& m = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  uint32_t layer = m.moe.layers.front().layer;
  WorkerState state = [&] {
    Result<WorkerState> s = WorkerState::open({m.slice(layer, 1, 2, 3)});  // experts 2-4
    EXPECT_TRUE(s.is_ok()) << s.status().message();
    return std::move(*s);
  }();
  proto::ExpertRequest request(uint64_t id, uint32_t rows = 4) {
    std::mt19937_64 rng(id);
    return random_request(m, {.layer = layer, .first = 2, .count = 3}, rng,
                          {.n_rows = rows, .max_k = 3, .min_k = 1, .request_id = id});
  }
};

std::optional<ErrorCode> check(const Fixture& f, const proto::ExpertRequest& r, uint64_t limit = 1 << 20) {
  std::optional<proto::ExpertError> e = check_expert_request(f.state.store(), r, limit);
  if (e) {
    EXPECT_EQ(e->request_id, r.request_id);
  }
  return e ? std::optional(e->code) : std::nullopt;
}

TEST(ExpertRequest, ChecksInOrder) {
  Fixture f;
  proto::ExpertRequest r = f.request(1);
  EXPECT_EQ(check(f, r), std::nullopt);

  proto::ExpertRequest all_wrong = r;  // every check fails: the first one is reported
  all_wrong.layer = 1000;
  all_wrong.act_type = GgmlType::Q8_0;
  all_wrong.expert_ids[0] = 0;
  EXPECT_EQ(check(f, all_wrong), ErrorCode::WRONG_LAYER);
  all_wrong.layer = f.layer;
  EXPECT_EQ(check(f, all_wrong), ErrorCode::BAD_ENCODING);
  all_wrong.act_type = r.act_type;
  all_wrong.act_row_bytes += 292;
  EXPECT_EQ(check(f, all_wrong), ErrorCode::BAD_SHAPE);
  all_wrong.act_row_bytes = r.act_row_bytes;
  EXPECT_EQ(check(f, all_wrong), ErrorCode::UNKNOWN_EXPERT);  // expert 0 is not in 2-4
  all_wrong.expert_ids[0] = 5;
  EXPECT_EQ(check(f, all_wrong), ErrorCode::UNKNOWN_EXPERT);
  all_wrong.expert_ids[0] = 0x8000'0000u;  // beyond int32: never wraps into a held id
  EXPECT_EQ(check(f, all_wrong), ErrorCode::UNKNOWN_EXPERT);

  proto::ExpertRequest layer_wrap = r;
  layer_wrap.layer = 0x8000'0000u | f.layer;
  EXPECT_EQ(check(f, layer_wrap), ErrorCode::WRONG_LAYER);

  // F32 rows are accepted at their own size only.
  proto::ExpertRequest f32 = r;
  f32.act_type = GgmlType::F32;
  EXPECT_EQ(check(f, f32), ErrorCode::BAD_SHAPE);
  f32.act_row_bytes = uint64_t(f.m.n_embd()) * 4;
  EXPECT_EQ(check(f, f32), std::nullopt);

  const uint64_t response = proto::expert_response_payload_bytes(r.n_pairs(), f.m.n_embd());
  EXPECT_EQ(check(f, r, response), std::nullopt);
  EXPECT_EQ(check(f, r, response - 1), ErrorCode::BAD_SHAPE);

  proto::ExpertRequest zero = r;
  zero.request_id = proto::kNoRequestId;
  EXPECT_EQ(check(f, zero), ErrorCode::MALFORMED);
}

TEST(ExpertRequest, ComputeMatchesTheBackboneForEveryShape) {
  Fixture f;
  for (uint32_t rows : {1u, 2u, 7u, 33u}) {
    proto::ExpertRequest r = f.request(rows, rows);
    Result<proto::ExpertResponse> got = compute_expert_request(f.state.store(), r, nullptr);
    ASSERT_TRUE(got.is_ok()) << got.status().message();
    EXPECT_EQ(got->n_outputs, r.n_pairs());
    expect_bits_equal(got->outputs, reference_outputs(f.m, r), "rows " + std::to_string(rows));
  }
  // Rows with no expert at all (CSR count 0) produce no output and shift nothing.
  proto::ExpertRequest r = f.request(5, 3);
  r.expert_ids.erase(r.expert_ids.begin() + r.row_expert_counts[0],
                     r.expert_ids.begin() + r.row_expert_counts[0] + r.row_expert_counts[1]);
  r.row_expert_counts[1] = 0;
  ThreadPool pool(3);
  Result<proto::ExpertResponse> got = compute_expert_request(f.state.store(), r, &pool);
  ASSERT_TRUE(got.is_ok()) << got.status().message();
  expect_bits_equal(got->outputs, reference_outputs(f.m, r), "a row without experts");
  // No pairs at all: an empty response.
  proto::ExpertRequest empty = r;
  empty.row_expert_counts.assign(r.n_rows(), 0);
  empty.expert_ids.clear();
  got = compute_expert_request(f.state.store(), empty, nullptr);
  ASSERT_TRUE(got.is_ok());
  EXPECT_EQ(got->n_outputs, 0u);
  EXPECT_TRUE(got->outputs.empty());
}

TEST(ExpertRequest, StateRefusesMixedModelsAndOverlaps) {
  const TestModel& a = TestModel::get({.types = SynthTypeMix::Q4_K_M});
  const uint32_t layer = a.moe.layers.front().layer;
  const TestModel& f32 = TestModel::get({.types = SynthTypeMix::F32});
  Result<WorkerState> mixed = WorkerState::open({a.slice(layer, 1, 0, 2), f32.slice(layer, 1, 2, 2)});
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().message().find("one worker serves one model"), std::string::npos) << mixed.status().message();
  Result<WorkerState> overlap = WorkerState::open({a.slice(layer, 1, 0, 3), a.slice(layer, 1, 2, 2)});
  ASSERT_FALSE(overlap.is_ok());
  EXPECT_NE(overlap.status().message().find("overlaps"), std::string::npos) << overlap.status().message();
  EXPECT_FALSE(WorkerState::open({}).is_ok());
  EXPECT_FALSE(WorkerState::open({a.path}).is_ok());  // a full model is not a slice
}

}  // namespace
}  // namespace essaim::worker::testing
