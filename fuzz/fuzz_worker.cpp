// libFuzzer target for the expert worker: whatever a backbone that passed the handshake sends, a live
// worker (serve_connection over an in-memory pipe, serving a slice of a tiny synth model) answers with
// responses, ERRORs or a close — never a crash, a hang, a leak or an unbounded allocation.
//
//   build-fuzz/fuzz/fuzz_worker -max_total_time=60 build-fuzz/corpus/fuzz_worker
//
// Input layout: byte 0 = 0 mod 4 = the rest is the raw byte stream after the handshake (framing, decoding);
// byte 0 odd = the rest describes well-framed EXPERT_REQUESTs whose fields come from the input (layer,
// activation type, row size, per-row counts, expert ids, activation bytes), so that the worker's own
// checks and the expert FFN are reached on almost every input rather than only after a lucky header;
// byte 0 = 2 mod 4 = the rest is sent *instead of* a handshake (an unauthenticated peer: a HELLO of any
// size or version, garbage), and the worker must refuse or close within its handshake deadline.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <thread>

#include "slice/gguf_slice.h"
#include "net/frame_connection.h"
#include "net/pipe.h"
#include "synth/synth.h"
#include "worker/worker.h"

namespace {

using namespace essaim;
using namespace std::chrono_literals;

struct Fixture {
  std::unique_ptr<worker::WorkerState> state;
  std::unique_ptr<worker::Worker> worker;
  uint32_t layer = 0;
  uint64_t n_embd = 0;
};

void die(const Status& s) {
  std::fprintf(stderr, "fuzz_worker setup: %s\n", s.message().c_str());
  std::abort();
}

// A tiny Q4_K_M qwen3moe, cut to experts 0-2 of its first MoE layer (written once, to a temp dir).
Fixture make_fixture() {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("essaim-fuzz-worker-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::string model = (dir / "model.gguf").string(), slice = (dir / "slice.gguf").string();
  Result<SynthPlan> plan = synth_plan({.types = SynthTypeMix::Q4_K_M, .threads = 1});
  if (!plan) die(plan.status());
  if (Result<SynthSummary> w = synth_write(*plan, model); !w) die(w.status());
  Result<GgufFile> src = GgufFile::open(model);
  if (!src) die(src.status());
  Result<MoeLayout> moe = moe_layout(*src);
  if (!moe) die(moe.status());
  const uint32_t layer = moe->layers.front().layer;
  Result<OutFile> f = expert_slice_file(*src, *moe, {.layer_first = layer, .layer_count = 1, .expert_first = 0,
                                                     .expert_count = 3});
  if (!f) die(f.status());
  if (Result<WrittenFile> w = write_out_file(*f, slice, false); !w) die(w.status());
  Result<worker::WorkerState> state = worker::WorkerState::open({slice});
  if (!state) die(state.status());
  std::filesystem::remove_all(dir);  // the mapping keeps the slice's bytes
  Fixture fx;
  fx.layer = layer;
  fx.n_embd = moe->n_embd;
  fx.state = std::make_unique<worker::WorkerState>(std::move(*state));
  fx.worker = std::make_unique<worker::Worker>(
      *fx.state, worker::WorkerOptions{.threads = 1, .max_in_flight = 4, .handshake_timeout = 200ms, .idle_timeout = 200ms});
  return fx;
}

Fixture& fixture() {
  static Fixture f = make_fixture();
  return f;
}

// Reads input bytes as little fields; past the end, zeros.
struct Bytes {
  std::span<const uint8_t> in;
  size_t pos = 0;
  uint32_t u8() { return pos < in.size() ? in[pos++] : 0; }
  uint32_t u16() { return u8() | u8() << 8; }
};

// Appends up to four requests to `out`; returns how many.
int structured_stream(std::span<const uint8_t> in, const Fixture& fx, std::vector<uint8_t>& out) {
  Bytes b{in};
  int n = 0;
  for (uint64_t id = 1; b.pos < in.size() && id <= 4; ++id, ++n) {
    proto::ExpertRequest r;
    r.request_id = b.u8() == 0 ? 0 : id;
    const uint32_t layer_pick = b.u8();
    r.layer = layer_pick < 200 ? fx.layer : layer_pick;
    const uint32_t type_pick = b.u8() % 4;  // mostly the kernel form
    r.act_type = type_pick < 2 ? GgmlType::Q8_K : type_pick == 2 ? GgmlType::F32 : GgmlType::Q8_0;
    const uint64_t natural = r.act_type == GgmlType::F32 ? fx.n_embd * 4 : type_traits(r.act_type).row_bytes(fx.n_embd);
    r.act_row_bytes = b.u8() < 240 ? natural : type_traits(r.act_type).type_size * (1 + b.u8() % 3);
    const uint32_t n_rows = b.u8() % 9;
    for (uint32_t row = 0; row < n_rows; ++row) {
      const uint32_t k = b.u8() % 4;
      r.row_expert_counts.push_back(k);
      for (uint32_t j = 0; j < k; ++j) r.expert_ids.push_back(b.u8() % 5);  // held: 0-2
    }
    r.activations.resize(n_rows * r.act_row_bytes);
    for (uint8_t& v : r.activations) v = uint8_t(b.u8());
    proto::append_message_frame(r, out);
  }
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  Fixture& fx = fixture();
  const std::span<const uint8_t> rest(data + 1, size - 1);
  std::vector<uint8_t> stream;
  int expected = 0;  // answers to wait for, so that the requests are computed before the close
  if (data[0] % 2) expected = structured_stream(rest, fx, stream);
  else stream.assign(rest.begin(), rest.end());

  auto [client_end, server_end] = net::make_pipe(1 << 20);
  std::thread server([&, s = server_end.get()] { fx.worker->serve_connection(*s); });
  net::FrameConnection c(std::move(client_end));
  if (data[0] % 4 == 2) {
    (void)c.send_raw(rest, net::deadline_in(5s));
    while (c.receive(net::deadline_in(5s))) {
    }  // the worker's HELLO, then a REFUSE or an ERROR, then the close
    c.close();
    server.join();
    return 0;
  }
  proto::Hello hello{.role = proto::Role::BACKBONE, .fingerprint = worker::build_fingerprint(),
                     .model = fx.state->model(), .label = "fuzz", .holdings = {}};
  if (net::NetResult<proto::Hello> peer = net::handshake(c, hello, net::deadline_in(5s)); peer) {
    // Answers are read while the input goes out, so the worker never blocks on a full pipe.
    std::atomic<int> answered{0};
    std::thread reader([&] {
      while (c.receive(net::deadline_in(5s))) ++answered;
    });
    (void)c.send_raw(stream, net::deadline_in(5s));
    for (int i = 0; i < 2000 && answered.load() < expected; ++i) std::this_thread::sleep_for(1ms);
    (void)c.send(proto::Goodbye{"fuzz input done"}, net::deadline_in(1s));
    c.close();  // a frame left incomplete by the input would otherwise wait for the idle timeout
    reader.join();
  }
  server.join();
  return 0;
}
