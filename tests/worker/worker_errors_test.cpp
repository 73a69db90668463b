// Hostile and unlucky peers (label sanitize: run under ASan/UBSan too): typed errors keep the connection,
// framing errors close it with ERROR MALFORMED, handshakes with the wrong model, version, fingerprint or
// role are refused with the reason, a full worker answers OVERLOADED, mutated frames never crash it.
#include <gtest/gtest.h>

#include <set>
#include <thread>

#include "proto/frame.h"
#include "worker_test_util.h"

namespace essaim::worker::testing {
namespace {

using namespace std::chrono_literals;
using proto::ErrorCode;

const TestModel& model() { return TestModel::get({.types = SynthTypeMix::Q4_K_M}); }
uint32_t layer0() { return model().moe.layers.front().layer; }
std::string slice_012() { return model().slice(layer0(), 1, 0, 3); }  // experts 0-2 of the first MoE layer

proto::ExpertRequest valid_request(uint64_t id, uint32_t rows = 3) {
  std::mt19937_64 rng(id);
  return random_request(model(), {.layer = layer0(), .first = 0, .count = 3}, rng,
                        {.n_rows = rows, .max_k = 2, .min_k = 1, .request_id = id});
}

// Waits until pred(stats) holds (the server thread counts after it answers).
template <typename Pred>
bool eventually(Worker& w, Pred pred) {
  for (int i = 0; i < 500; ++i) {
    if (pred(w.stats())) return true;
    std::this_thread::sleep_for(10ms);
  }
  return false;
}

void expect_error(net::FrameConnection& c, uint64_t id, ErrorCode code) {
  proto::Message m = receive_message(c);
  const auto* e = std::get_if<proto::ExpertError>(&m);
  ASSERT_NE(e, nullptr) << "got " << proto::frame_type_name(proto::message_frame_type(m));
  EXPECT_EQ(e->request_id, id);
  EXPECT_EQ(e->code, code) << e->message;
  EXPECT_FALSE(e->message.empty());
}

// After a close the peer reads end-of-stream (possibly after frames already in flight).
void expect_closed(net::FrameConnection& c) {
  for (int i = 0; i < 8; ++i) {
    net::NetResult<proto::Message> m = c.receive(net::deadline_in(5s));
    if (!m) {
      EXPECT_EQ(m.error().kind, net::NetErrorKind::CLOSED) << m.error().message;
      return;
    }
  }
  ADD_FAILURE() << "the worker kept the connection open";
}

TEST(WorkerErrors, TypedErrorsKeepTheConnectionUp) {
  ServedWorker w({slice_012()});
  std::unique_ptr<net::FrameConnection> c = w.connect();
  auto send = [&](const proto::ExpertRequest& r) { ASSERT_TRUE(c->send(r, net::deadline_in(5s)).is_ok()); };

  proto::ExpertRequest wrong_layer = valid_request(11);
  wrong_layer.layer = 77;
  send(wrong_layer);
  expect_error(*c, 11, ErrorCode::WRONG_LAYER);

  proto::ExpertRequest unknown = valid_request(12);
  unknown.expert_ids.back() = 4;  // held: 0-2
  send(unknown);
  expect_error(*c, 12, ErrorCode::UNKNOWN_EXPERT);

  proto::ExpertRequest bad_shape = valid_request(13);  // two Q8_K blocks per row for n_embd = one block
  bad_shape.act_row_bytes *= 2;
  bad_shape.activations.resize(bad_shape.activations.size() * 2);
  send(bad_shape);
  expect_error(*c, 13, ErrorCode::BAD_SHAPE);

  proto::ExpertRequest bad_encoding = valid_request(14);  // Q8_0 rows for Q4_K experts (which take Q8_K)
  bad_encoding.act_type = GgmlType::Q8_0;
  bad_encoding.act_row_bytes = type_traits(GgmlType::Q8_0).row_bytes(model().n_embd());
  bad_encoding.activations.assign(bad_encoding.n_rows() * bad_encoding.act_row_bytes, 0);
  send(bad_encoding);
  expect_error(*c, 14, ErrorCode::BAD_ENCODING);

  send(valid_request(proto::kNoRequestId));
  expect_error(*c, proto::kNoRequestId, ErrorCode::MALFORMED);

  // A frame whose message does not decode (counts that do not add up): the framing is intact.
  std::vector<uint8_t> frame = proto::encode_message(valid_request(15));
  frame[proto::kFrameHeaderBytes + 16] ^= 0x01;  // n_pairs
  ASSERT_TRUE(c->send_raw(frame, net::deadline_in(5s)).is_ok());
  expect_error(*c, proto::kNoRequestId, ErrorCode::MALFORMED);

  ASSERT_TRUE(c->send(proto::Ping{0xfeed}, net::deadline_in(5s)).is_ok());
  proto::Message pong = receive_message(*c);
  ASSERT_TRUE(std::holds_alternative<proto::Pong>(pong));
  EXPECT_EQ(std::get<proto::Pong>(pong).nonce, 0xfeedu);

  // Still serving, exactly.
  proto::ExpertRequest ok = valid_request(16);
  std::vector<proto::ExpertResponse> got = exchange_all(*c, {ok});
  expect_bits_equal(got.at(0).outputs, reference_outputs(model(), ok));

  const WorkerStats s = stats_after(w.worker(), 1);
  for (ErrorCode e : {ErrorCode::WRONG_LAYER, ErrorCode::UNKNOWN_EXPERT, ErrorCode::BAD_SHAPE, ErrorCode::BAD_ENCODING})
    EXPECT_EQ(s.error_count(e), 1u) << proto::error_code_name(e);
  EXPECT_EQ(s.error_count(ErrorCode::MALFORMED), 2u);
  EXPECT_EQ(s.closed_on_protocol_error, 0u);
}

TEST(WorkerErrors, ResponseOverThePeersLimitIsBadShape) {
  ServedWorker w({slice_012()});
  std::unique_ptr<net::FrameConnection> c = w.connect(proto::kMinMaxPayloadBytes);  // 64 KiB
  // 64 rows x 2 experts x 256 floats = 128 KiB of outputs.
  std::mt19937_64 rng(5);
  proto::ExpertRequest big = random_request(model(), {.layer = layer0(), .first = 0, .count = 3}, rng,
                                            {.n_rows = 64, .max_k = 2, .min_k = 2, .request_id = 21});
  ASSERT_GT(proto::expert_response_payload_bytes(big.n_pairs(), model().n_embd()), proto::kMinMaxPayloadBytes);
  ASSERT_TRUE(c->send(big, net::deadline_in(5s)).is_ok());
  expect_error(*c, 21, ErrorCode::BAD_SHAPE);
  proto::ExpertRequest small = valid_request(22);
  expect_bits_equal(exchange_all(*c, {small}).at(0).outputs, reference_outputs(model(), small));
}

struct Garbage {
  const char* name;
  std::vector<uint8_t> bytes;
};

TEST(WorkerErrors, FramingErrorsAnswerMalformedThenClose) {
  ServedWorker w({slice_012()});
  std::vector<uint8_t> huge;  // a declared length with its high bits set
  proto::append_frame_header(proto::FrameType::EXPERT_REQUEST, 0xF000'0000'0000'0001ull, huge);
  std::vector<uint8_t> over;  // just over the worker's limit
  proto::append_frame_header(proto::FrameType::EXPERT_REQUEST, kWorkerDefaultMaxPayloadBytes + 1, over);
  const std::vector<Garbage> cases = {
      {"http", {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1', '\r', '\n'}},
      {"type zero", {0, 0, 0, 0, 0, 0, 0, 0, 0}},
      {"high-bit length", huge},
      {"over the limit", over},
  };
  for (const Garbage& g : cases) {
    SCOPED_TRACE(g.name);
    std::unique_ptr<net::FrameConnection> c = w.connect();
    ASSERT_TRUE(c->send_raw(g.bytes, net::deadline_in(5s)).is_ok());
    expect_error(*c, proto::kNoRequestId, ErrorCode::MALFORMED);
    expect_closed(*c);
  }
  EXPECT_TRUE(eventually(w.worker(), [&](const WorkerStats& s) { return s.closed_on_protocol_error == cases.size(); }));
  // The worker lives on.
  std::unique_ptr<net::FrameConnection> c = w.connect();
  proto::ExpertRequest ok = valid_request(31);
  expect_bits_equal(exchange_all(*c, {ok}).at(0).outputs, reference_outputs(model(), ok));
}

TEST(WorkerErrors, TruncatedFrameAndUnexpectedMessages) {
  ServedWorker w({slice_012()});
  {
    std::unique_ptr<net::FrameConnection> c = w.connect();
    std::vector<uint8_t> frame = proto::encode_message(valid_request(41));
    frame.resize(frame.size() / 2);
    ASSERT_TRUE(c->send_raw(frame, net::deadline_in(5s)).is_ok());
    c->close();  // the stream ends inside a frame
  }
  EXPECT_TRUE(eventually(w.worker(), [](const WorkerStats& s) { return s.closed_on_protocol_error == 1; }));
  {
    std::unique_ptr<net::FrameConnection> c = w.connect();
    ASSERT_TRUE(c->send(backbone_hello(w.state().model()), net::deadline_in(5s)).is_ok());  // a second HELLO
    expect_error(*c, proto::kNoRequestId, ErrorCode::UNEXPECTED);
    expect_closed(*c);
  }
  {
    std::unique_ptr<net::FrameConnection> c = w.connect();
    ASSERT_TRUE(c->send(proto::Goodbye{"done"}, net::deadline_in(5s)).is_ok());
    expect_closed(*c);
  }
  {
    // A request instead of a HELLO: the worker's own HELLO, then REFUSE BAD_HELLO.
    std::unique_ptr<net::FrameConnection> c = w.connect_raw();
    ASSERT_TRUE(c->send(valid_request(42), net::deadline_in(5s)).is_ok());
    EXPECT_TRUE(std::holds_alternative<proto::Hello>(receive_message(*c)));
    proto::Message m = receive_message(*c);
    ASSERT_TRUE(std::holds_alternative<proto::Refuse>(m));
    EXPECT_EQ(std::get<proto::Refuse>(m).reason, proto::RefuseReason::BAD_HELLO);
  }
  EXPECT_TRUE(eventually(w.worker(), [](const WorkerStats& s) {
    return s.closed_on_protocol_error == 2 && s.handshakes_refused[size_t(proto::RefuseReason::BAD_HELLO)] == 1;
  }));
}

TEST(WorkerErrors, HandshakeRefusesWrongModelVersionFingerprintAndRole) {
  ServedWorker w({slice_012()});
  struct Refusal {
    const char* name;
    void (*mutate)(proto::Hello&);
    proto::RefuseReason reason;
  };
  const Refusal cases[] = {
      {"model", [](proto::Hello& h) { h.model[0] ^= 0xff; }, proto::RefuseReason::MODEL},
      {"version", [](proto::Hello& h) { h.version = proto::kProtocolVersion + 1; }, proto::RefuseReason::VERSION},
      {"kernel abi", [](proto::Hello& h) { h.fingerprint.kernel_abi += 1; }, proto::RefuseReason::FINGERPRINT},
      {"role", [](proto::Hello& h) { h.role = proto::Role::WORKER; }, proto::RefuseReason::ROLE},
  };
  for (const Refusal& r : cases) {
    SCOPED_TRACE(r.name);
    std::unique_ptr<net::FrameConnection> c = w.connect_raw();
    proto::Hello mine = backbone_hello(w.state().model());
    r.mutate(mine);
    // Sent raw, so that the worker's check (not this side's) is what refuses.
    ASSERT_TRUE(c->send(mine, net::deadline_in(5s)).is_ok());
    EXPECT_TRUE(std::holds_alternative<proto::Hello>(receive_message(*c)));
    (void)c->send(proto::HelloAck{}, net::deadline_in(5s));  // the worker may have hung up already
    proto::Message m = receive_message(*c);
    ASSERT_TRUE(std::holds_alternative<proto::Refuse>(m));
    EXPECT_EQ(std::get<proto::Refuse>(m).reason, r.reason) << std::get<proto::Refuse>(m).message;
    EXPECT_TRUE(eventually(w.worker(), [&](const WorkerStats& s) { return s.handshakes_refused[size_t(r.reason)] == 1; }));
  }
  EXPECT_EQ(w.worker().stats().handshakes_ok, 0u);
  // The same exchange with nothing wrong is accepted.
  std::unique_ptr<net::FrameConnection> c = w.connect();
  EXPECT_TRUE(eventually(w.worker(), [](const WorkerStats& s) { return s.handshakes_ok == 1; }));
}

// A client that does not read: its responses fill the pipe, its requests stay in flight, and requests over
// the limit are answered OVERLOADED at once instead of queueing.
TEST(WorkerErrors, OverLimitRequestsAreOverloaded) {
  ServedWorker w({slice_012()}, {.max_in_flight = 2}, /*pipe_capacity=*/4096);
  std::unique_ptr<net::FrameConnection> c = w.connect();
  // Four requests, nothing read: the first answer (>= 8 KiB) blocks in the 4 KiB pipe, so two requests stay
  // in flight and the next two are refused. (Two refusals also fit the control backlog of two, so the
  // worker's reader takes all four before this side reads anything: the outcome does not depend on timing.)
  std::vector<proto::ExpertRequest> reqs;
  for (uint64_t i = 0; i < 4; ++i) reqs.push_back(valid_request(50 + i, /*rows=*/8));
  for (const auto& r : reqs) ASSERT_TRUE(c->send(r, net::deadline_in(10s)).is_ok());
  EXPECT_TRUE(eventually(w.worker(), [](const WorkerStats& s) { return s.error_count(ErrorCode::OVERLOADED) == 2; }));
  std::set<uint64_t> answered, overloaded;
  for (size_t i = 0; i < reqs.size(); ++i) {
    proto::Message m = receive_message(*c);
    if (const auto* r = std::get_if<proto::ExpertResponse>(&m)) {
      answered.insert(r->request_id);
      expect_bits_equal(r->outputs, reference_outputs(model(), reqs.at(r->request_id - 50)));
    } else if (const auto* e = std::get_if<proto::ExpertError>(&m)) {
      EXPECT_EQ(e->code, ErrorCode::OVERLOADED) << e->message;
      overloaded.insert(e->request_id);
    }
  }
  EXPECT_EQ(answered, (std::set<uint64_t>{50, 51}));
  EXPECT_EQ(overloaded, (std::set<uint64_t>{52, 53}));
  // Once the backlog is read, the connection serves again.
  proto::ExpertRequest ok = valid_request(60);
  expect_bits_equal(exchange_all(*c, {ok}).at(0).outputs, reference_outputs(model(), ok));
}

// One client never reads its answers, another stopped in the middle of a frame: a third is served at full
// speed, exactly, while the first one's answers stay stuck behind its own full pipe.
TEST(WorkerErrors, StalledClientsDoNotStallAnother) {
  ServedWorker w({slice_012()}, {.threads = 1, .lanes = 1}, /*pipe_capacity=*/8192);
  std::unique_ptr<net::FrameConnection> never_reads = w.connect();
  for (uint64_t i = 0; i < 8; ++i)  // >= 16 KiB of answers each, twice the pipe
    ASSERT_TRUE(never_reads->send(valid_request(80 + i, /*rows=*/16), net::deadline_in(5s)).is_ok());
  std::unique_ptr<net::FrameConnection> half_frame = w.connect();
  std::vector<uint8_t> frame = proto::encode_message(valid_request(90));
  ASSERT_TRUE(half_frame->send_raw(std::span(frame).first(frame.size() / 2), net::deadline_in(5s)).is_ok());

  std::unique_ptr<net::FrameConnection> c = w.connect();
  const auto t0 = std::chrono::steady_clock::now();
  for (uint64_t round = 0; round < 4; ++round) {  // windows of 5: within the in-flight limit
    std::vector<proto::ExpertRequest> reqs;
    for (uint64_t i = 0; i < 5; ++i) reqs.push_back(valid_request(100 + 5 * round + i));
    std::vector<proto::ExpertResponse> got = exchange_all(*c, reqs);
    for (size_t i = 0; i < reqs.size(); ++i) expect_bits_equal(got.at(i).outputs, reference_outputs(model(), reqs[i]));
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 10s);
  // Every answer written went to the reading client; none of the stalled one's got through.
  EXPECT_EQ(stats_after(w.worker(), 20).error_count(ErrorCode::OVERLOADED), 0u);
}

// Mutated frames on one connection after another: every outcome is an answer, an ERROR or a close.
TEST(WorkerErrors, MutatedFramesNeverCrashTheWorker) {
  ServedWorker w({slice_012()}, {.idle_timeout = std::chrono::milliseconds(2000)});
  std::mt19937_64 rng(99);
  const std::vector<uint8_t> base = proto::encode_message(valid_request(70));
  std::unique_ptr<net::FrameConnection> c = w.connect();
  int reconnects = 0;
  for (int i = 0; i < 150; ++i) {
    std::vector<uint8_t> f = base;
    const int flips = 1 + int(rng() % 4);
    for (int k = 0; k < flips; ++k) {
      // Mostly the header and the request's counts, where a flip changes meaning rather than values.
      const size_t at = rng() % 2 ? rng() % std::min<size_t>(f.size(), 64) : rng() % f.size();
      f[at] = uint8_t(rng());
    }
    if (rng() % 8 == 0) f.resize(rng() % f.size());
    if (!c->send_raw(f, net::deadline_in(2s)) || c->broken()) {
      c = w.connect();
      ++reconnects;
      continue;
    }
    // Drain whatever comes back quickly; a frame cut short simply waits for more bytes.
    for (;;) {
      net::NetResult<proto::Message> m = c->receive(net::deadline_in(20ms));
      if (m) continue;
      if (m.error().kind != net::NetErrorKind::TIMEOUT) {
        c = w.connect();
        ++reconnects;
      }
      break;
    }
  }
  c = w.connect();
  proto::ExpertRequest ok = valid_request(71);
  expect_bits_equal(exchange_all(*c, {ok}).at(0).outputs, reference_outputs(model(), ok));
  EXPECT_GT(reconnects, 0);  // some mutations broke the framing
  EXPECT_GT(w.worker().stats().error_count(ErrorCode::MALFORMED), 0u);
}

}  // namespace
}  // namespace essaim::worker::testing
