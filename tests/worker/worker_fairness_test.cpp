// Many backbones, one worker (docs/worker.md, "Concurrency and memory"): a backbone that floods a worker —
// its in-flight window always full, and a burst beyond it — cannot starve another backbone on the same
// worker. The worker takes tasks round-robin between connections (ComputePool), bounds each connection's
// queue (max_in_flight) and answers the excess OVERLOADED, counting every refusal.
//
// What is measured is the order in which the worker's one lane computes requests (an executor that records
// each call and passes it on to the real LocalExpertExecutor, taking a few milliseconds a call so that
// queues build up): once a request of the quiet backbone is queued, at most two of the flooding one's run
// before it (round robin: the flooder's next turn), where one FIFO queue would run the flooder's whole
// window of 16 first — checked as the median over the quiet requests, with none waiting a whole window.
// The quiet backbone's answers are exact and never refused; the flooder's refusals are exactly the
// worker's OVERLOADED count.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <string>
#include <thread>

#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;

const TestModel& model() { return TestModel::get({.types = SynthTypeMix::Q4_K_M}); }
uint32_t layer0() { return model().moe.layers.front().layer; }

// Passes every call to the real executor, after recording which backbone it came from (the flooder asks
// only for expert 0, the quiet one only for expert 1) and holding the lane a little.
class RecordingExecutor final : public ExpertExecutor {
 public:
  explicit RecordingExecutor(const ExpertStore& store) : inner_(store, nullptr) {}
  Status compute(const ExpertBatch& b, std::span<float> out) override {
    {
      std::lock_guard lock(mu_);
      order_.push_back({std::chrono::steady_clock::now(), b.ids.empty() ? -1 : b.ids[0]});
    }
    std::this_thread::sleep_for(3ms);
    return inner_.compute(b, out);
  }
  struct Call {
    std::chrono::steady_clock::time_point start;
    int32_t expert;
  };
  std::vector<Call> order() const {
    std::lock_guard lock(mu_);
    return order_;
  }

 private:
  LocalExpertExecutor inner_;
  mutable std::mutex mu_;
  std::vector<Call> order_;
};

proto::ExpertRequest request_for(uint32_t expert, uint64_t id) {
  std::mt19937_64 rng(id);
  return random_request(model(), {.layer = layer0(), .first = expert, .count = 1}, rng,
                        {.n_rows = 2, .max_k = 1, .min_k = 1, .request_id = id});
}

TEST(WorkerFairness, AFloodingBackboneCannotStarveAnother) {
  constexpr size_t kWindow = 16;  // the worker's max_in_flight per connection
  constexpr size_t kBurst = 8;    // sent beyond the window at the start: refused
  constexpr int kQuietRequests = 12;
  RecordingExecutor recorder(model().full);
  ServedWorker w({model().slice(layer0(), 1, 0, 3)},
                 {.threads = 1, .lanes = 1, .max_in_flight = kWindow, .executor = &recorder});
  std::unique_ptr<net::FrameConnection> flood = w.connect();
  std::unique_ptr<net::FrameConnection> quiet = w.connect();

  // The flooder: window + burst at once, then one more for every answer, until the quiet backbone is done.
  std::atomic<bool> quiet_done{false};
  std::atomic<uint64_t> refused{0}, answered{0};
  std::thread flooder([&] {
    uint64_t next_id = 1;
    for (size_t i = 0; i < kWindow + kBurst; ++i)
      ASSERT_TRUE(flood->send(request_for(0, next_id++), net::deadline_in(5s)).is_ok());
    size_t outstanding = kWindow + kBurst;
    while (outstanding > 0) {
      net::NetResult<proto::Message> m = flood->receive(net::deadline_in(10s));
      ASSERT_TRUE(m) << m.error().message;
      --outstanding;
      if (const auto* e = std::get_if<proto::ExpertError>(&*m)) {
        EXPECT_EQ(e->code, ErrorCode::OVERLOADED) << e->message;
        ++refused;
      } else {
        ASSERT_TRUE(std::holds_alternative<proto::ExpertResponse>(*m));
        ++answered;
      }
      if (!quiet_done.load()) {
        ASSERT_TRUE(flood->send(request_for(0, next_id++), net::deadline_in(5s)).is_ok());
        ++outstanding;
      }
    }
  });

  // The quiet backbone: one request at a time, once the flooder's window is full.
  for (int i = 0; i < 200 && recorder.order().size() < 2; ++i) std::this_thread::sleep_for(5ms);
  std::vector<std::chrono::steady_clock::time_point> sent_at;
  for (int i = 0; i < kQuietRequests; ++i) {
    const proto::ExpertRequest r = request_for(1, 1000 + uint64_t(i));
    sent_at.push_back(std::chrono::steady_clock::now());
    const std::vector<proto::ExpertResponse> got = exchange_all(*quiet, {r});
    ASSERT_EQ(got.size(), 1u);
    expect_bits_equal(got[0].outputs, reference_outputs(model(), r), "quiet request " + std::to_string(i));
  }
  quiet_done = true;
  flooder.join();

  // For each quiet request: how many of the flooder's requests started computing after it was sent and
  // before it started. Round robin: the flooder's next turn only (2 allows for the send racing the lane's
  // pick); one FIFO queue: the flooder's whole window, 16, for every quiet request. Measured from the
  // send, so a worker thread that lost its CPU before reading the request (a loaded CI machine) adds
  // calls the queue order is not to blame for: the median must be round robin's, and no request may wait
  // a whole window.
  const std::vector<RecordingExecutor::Call> order = recorder.order();
  size_t quiet_seen = 0, flood_calls = 0;
  std::vector<size_t> aheads;
  for (size_t i = 0; i < order.size(); ++i) {
    if (order[i].expert != 1) {
      ++flood_calls;
      continue;
    }
    ASSERT_LT(quiet_seen, sent_at.size());
    size_t ahead = 0;
    for (size_t j = 0; j < i; ++j) ahead += order[j].expert == 0 && order[j].start >= sent_at[quiet_seen] ? 1 : 0;
    aheads.push_back(ahead);
    ++quiet_seen;
  }
  EXPECT_EQ(quiet_seen, size_t(kQuietRequests));
  EXPECT_GT(flood_calls, 2 * size_t(kQuietRequests));  // the flooder kept the lane busy all along
  ASSERT_FALSE(aheads.empty());
  std::vector<size_t> sorted = aheads;
  std::sort(sorted.begin(), sorted.end());
  std::string all;
  for (size_t a : aheads) all += std::to_string(a) + " ";
  EXPECT_LE(sorted[sorted.size() / 2], 2u) << "flood calls ahead of each quiet request: " << all;
  EXPECT_LT(sorted.back(), kWindow) << "flood calls ahead of each quiet request: " << all;
  EXPECT_GT(refused.load(), 0u);
  EXPECT_GT(answered.load(), uint64_t(kQuietRequests));  // the flooder was served all along, too
  const WorkerStats s = stats_after(w.worker(), answered.load() + uint64_t(kQuietRequests));
  EXPECT_EQ(s.error_count(ErrorCode::OVERLOADED), refused.load());
}

}  // namespace
}  // namespace essaim::worker::testing
