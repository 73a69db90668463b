// Cost of the expert protocol on each transport: round trips of decode-shaped requests (a few rows of
// Q8_K activations out, f32 expert rows back) and the throughput of 16 MiB frames, each next to the same
// bytes moved through the bare ByteStream (no encoding, no decoding) as the reference.
//
//   build/bench/net_bench [--transport tcp|pipe] [--rows 1] [--experts 2] [--n-embd 3072] [--iters 2000]
//
// Prints one JSON document: per case the median and p99 round trip in microseconds, bytes on the wire per
// round trip, and framed/bare ratios.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <thread>

#include "net/frame_connection.h"
#include "net/pipe.h"
#include "net/tcp.h"

using namespace essaim;
using namespace essaim::net;
using namespace std::chrono_literals;

namespace {

std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>> connect_pair(const std::string& transport) {
  if (transport == "pipe") return make_pipe(1 << 20);
  auto listener = TcpListener::listen("127.0.0.1", 0);
  ESSAIM_CHECK(listener.is_ok());
  auto client = tcp_connect("127.0.0.1", (*listener)->port(), deadline_in(5s));
  auto server = (*listener)->accept(deadline_in(5s));
  ESSAIM_CHECK(client.is_ok() && server.is_ok());
  return {std::move(*client), std::move(*server)};
}

struct Timing {
  double median_us = 0, p99_us = 0;
};
Timing summarize(std::vector<double> us) {
  std::sort(us.begin(), us.end());
  return {us[us.size() / 2], us[std::min(us.size() - 1, us.size() * 99 / 100)]};
}

bool read_exactly(ByteStream& s, std::span<uint8_t> buf) {
  for (size_t got = 0; got < buf.size();) {
    auto n = s.read_some(buf.subspan(got), deadline_in(10s));
    if (!n) return false;
    got += *n;
  }
  return true;
}

// Framed: an EXPERT_REQUEST out, an EXPERT_RESPONSE of the right size back, through FrameConnection.
std::vector<double> framed_round_trips(const std::string& transport, const proto::ExpertRequest& req,
                                       uint32_t n_embd, int iters) {
  auto [a, b] = connect_pair(transport);
  std::thread server([&, s = b.get()] {
    FrameConnection c(*s);
    for (;;) {
      auto m = c.receive(deadline_in(10s));
      if (!m || !std::holds_alternative<proto::ExpertRequest>(*m)) return;
      const auto& r = std::get<proto::ExpertRequest>(*m);
      proto::ExpertResponse out{.request_id = r.request_id, .n_outputs = uint32_t(r.n_pairs()), .n_embd = n_embd,
                                .outputs = std::vector<float>(r.n_pairs() * n_embd, 0.25f)};
      if (!c.send(out, deadline_in(10s))) return;
    }
  });
  FrameConnection c(std::move(a));
  std::vector<double> us;
  proto::ExpertRequest r = req;
  for (int i = 0; i < iters; ++i) {
    r.request_id = uint64_t(i) + 1;
    auto t0 = std::chrono::steady_clock::now();
    ESSAIM_CHECK(c.send(r, deadline_in(10s)).is_ok());
    auto m = c.receive(deadline_in(10s));
    ESSAIM_CHECK(m.is_ok());
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  (void)c.send(proto::Goodbye{}, deadline_in(1s));
  server.join();
  return us;
}

// Bare: the same byte counts each way through the ByteStream, no encoding or decoding.
std::vector<double> bare_round_trips(const std::string& transport, size_t out_bytes, size_t back_bytes, int iters) {
  auto [a, b] = connect_pair(transport);
  std::thread server([&, s = b.get()] {
    std::vector<uint8_t> in(out_bytes), back(back_bytes, 1);
    for (int i = 0; i < iters; ++i) {
      if (!read_exactly(*s, in) || !s->write_all(back, deadline_in(10s))) return;
    }
  });
  std::vector<uint8_t> out(out_bytes, 2), in(back_bytes);
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    ESSAIM_CHECK(a->write_all(out, deadline_in(10s)).is_ok());
    ESSAIM_CHECK(read_exactly(*a, in));
    us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  server.join();
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"expert protocol round trips and throughput"};
  std::string transport = "tcp";
  uint32_t rows = 1, experts = 2, n_embd = 3072;
  int iters = 2000;
  app.add_option("--transport", transport)->check(CLI::IsMember({"tcp", "pipe"}));
  app.add_option("--rows", rows);
  app.add_option("--experts", experts, "experts per row held by the worker");
  app.add_option("--n-embd", n_embd);
  app.add_option("--iters", iters);
  CLI11_PARSE(app, argc, argv);

  // Decode-shaped request: Q8_K rows (292 bytes per 256 values) for n_embd.
  proto::ExpertRequest req{.request_id = 1, .layer = 0, .act_type = GgmlType::Q8_K,
                           .act_row_bytes = uint64_t(n_embd) / 256 * 292, .row_expert_counts = {}, .expert_ids = {},
                           .activations = {}};
  for (uint32_t r = 0; r < rows; ++r) {
    req.row_expert_counts.push_back(experts);
    for (uint32_t e = 0; e < experts; ++e) req.expert_ids.push_back(e);
  }
  req.activations.assign(rows * req.act_row_bytes, 3);
  const size_t out_bytes = proto::kFrameHeaderBytes + proto::expert_request_payload_bytes(rows, rows * experts, req.act_row_bytes);
  const size_t back_bytes = proto::kFrameHeaderBytes + proto::expert_response_payload_bytes(rows * experts, n_embd);

  Timing framed = summarize(framed_round_trips(transport, req, n_embd, iters));
  Timing bare = summarize(bare_round_trips(transport, out_bytes, back_bytes, iters));

  // Large frames: 16 MiB responses.
  const uint32_t big_rows = 1024, big_embd = 4096;
  proto::ExpertRequest big_req = req;
  big_req.row_expert_counts = {big_rows};
  big_req.expert_ids.assign(big_rows, 0);
  big_req.activations.assign(req.act_row_bytes, 3);
  const int big_iters = std::max(4, iters / 200);
  Timing big_framed = summarize(framed_round_trips(transport, big_req, big_embd, big_iters));
  const size_t big_back = proto::kFrameHeaderBytes + proto::expert_response_payload_bytes(big_rows, big_embd);
  Timing big_bare = summarize(bare_round_trips(
      transport, proto::kFrameHeaderBytes + proto::expert_request_payload_bytes(1, big_rows, req.act_row_bytes),
      big_back, big_iters));

  nlohmann::json out = {
      {"bench", "net"},
      {"transport", transport},
      {"decode_request", {{"rows", rows}, {"experts_per_row", experts}, {"n_embd", n_embd}, {"iters", iters},
                          {"bytes_out", out_bytes}, {"bytes_back", back_bytes},
                          {"framed_median_us", framed.median_us}, {"framed_p99_us", framed.p99_us},
                          {"bare_median_us", bare.median_us}, {"bare_p99_us", bare.p99_us},
                          {"framed_over_bare", framed.median_us / bare.median_us}}},
      {"large_response", {{"bytes_back", big_back}, {"iters", big_iters},
                          {"framed_median_us", big_framed.median_us}, {"bare_median_us", big_bare.median_us},
                          {"framed_gib_per_s", big_back / big_framed.median_us * 1e6 / (1 << 30)},
                          {"bare_gib_per_s", big_back / big_bare.median_us * 1e6 / (1 << 30)},
                          {"framed_over_bare", big_framed.median_us / big_bare.median_us}}},
  };
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
