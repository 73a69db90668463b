// Helpers shared by the net tests: connected stream pairs over each transport, and a small frame server
// (the "echo" peer) that answers the way a worker would, out of order, from several threads.
#pragma once

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "net/frame_connection.h"
#include "net/pipe.h"
#include "net/tcp.h"

namespace essaim::net::testing {

using namespace std::chrono_literals;

enum class Transport { PIPE, TCP };
inline std::string transport_name(const ::testing::TestParamInfo<Transport>& p) {
  return p.param == Transport::PIPE ? "Pipe" : "Tcp";
}

struct StreamPair {
  std::unique_ptr<ByteStream> a, b;
};

inline StreamPair connected_pair(Transport t, size_t pipe_capacity = kDefaultPipeCapacity) {
  if (t == Transport::PIPE) {
    auto [a, b] = make_pipe(pipe_capacity);
    return {std::move(a), std::move(b)};
  }
  auto listener = TcpListener::listen("127.0.0.1", 0);
  EXPECT_TRUE(listener) << listener.error().message;
  auto client = tcp_connect("127.0.0.1", (*listener)->port(), deadline_in(5s));
  EXPECT_TRUE(client) << client.error().message;
  auto server = (*listener)->accept(deadline_in(5s));
  EXPECT_TRUE(server) << server.error().message;
  return {std::move(*client), std::move(*server)};
}

// Serves one connection until the peer leaves, is idle for `idle`, or breaks the protocol:
//   PING -> PONG (same nonce); EXPERT_REQUEST -> EXPERT_RESPONSE with one 1-float row per pair holding the
//   expert id; EXPERT_RESPONSE -> echoed unchanged; GOODBYE -> return; an undecodable message -> ERROR
//   MALFORMED. Answers are produced by `threads` responder threads after a short seeded random delay, so
//   they leave out of order and several threads send on the connection at once.
inline void serve_echo(ByteStream& stream, std::chrono::milliseconds idle = 2000ms, int threads = 4,
                       ConnectionOptions options = {}) {
  FrameConnection c(stream, options);
  const size_t kQueueLimit = 8;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<proto::Message> queue;
  bool done = false, failed = false;
  std::vector<std::thread> responders;
  for (int t = 0; t < threads; ++t) {
    responders.emplace_back([&, t] {
      std::mt19937 rng(100 + t);
      for (;;) {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return done || !queue.empty(); });
        if (queue.empty()) return;
        proto::Message m = std::move(queue.front());
        queue.pop_front();
        cv.notify_all();  // room for the reader
        lock.unlock();
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 300));
        proto::Message answer = m;
        if (auto* ping = std::get_if<proto::Ping>(&m)) answer = proto::Pong{ping->nonce};
        if (auto* req = std::get_if<proto::ExpertRequest>(&m)) {
          proto::ExpertResponse r{.request_id = req->request_id, .n_outputs = uint32_t(req->n_pairs()),
                                  .n_embd = 1, .outputs = {}};
          for (uint32_t id : req->expert_ids) r.outputs.push_back(float(id));
          answer = r;
        }
        if (!c.send(answer, deadline_in(5s))) {
          std::lock_guard relock(mu);
          failed = true;
          cv.notify_all();
          return;
        }
      }
    });
  }
  for (;;) {
    NetResult<proto::Message> m = c.receive(deadline_in(idle));
    if (!m) {
      // A framing error ends reading but not writing: tell the peer why before hanging up.
      if (m.error().kind == NetErrorKind::PROTOCOL) {
        (void)c.send(proto::ExpertError{proto::kNoRequestId, proto::ErrorCode::MALFORMED, m.error().message},
                     deadline_in(1s));
        if (!c.broken()) continue;
      }
      break;
    }
    if (std::holds_alternative<proto::Goodbye>(*m)) break;
    // A bounded queue: a client that does not read its answers stops being read from, so its backlog
    // stays in its own socket buffers instead of growing here.
    std::unique_lock lock(mu);
    cv.wait(lock, [&] { return queue.size() < kQueueLimit || failed; });
    if (failed) break;
    queue.push_back(std::move(*m));
    cv.notify_all();
  }
  {
    std::lock_guard lock(mu);
    done = true;
    cv.notify_all();
  }
  for (auto& t : responders) t.join();
}

}  // namespace essaim::net::testing
