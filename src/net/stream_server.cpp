#include "net/stream_server.h"

#include <cstdio>
#include <exception>

namespace essaim::net {

StreamServer::StreamServer(std::unique_ptr<Acceptor> acceptor, Handler handler, ServerOptions options)
    : acceptor_(std::move(acceptor)), handler_(std::move(handler)), options_(options) {
  ESSAIM_CHECK(acceptor_ && handler_);
  accept_thread_ = std::thread([this] { accept_loop(); });
}

StreamServer::~StreamServer() { stop(); }

void StreamServer::reap_finished() {
  for (auto it = connections_.begin(); it != connections_.end();) {
    if ((*it)->done) {
      (*it)->thread.join();
      it = connections_.erase(it);
    } else {
      ++it;
    }
  }
}

void StreamServer::accept_loop() {
  while (!stopping_) {
    // A bounded wait, so that finished threads are joined even when no connection comes after them.
    NetResult<std::unique_ptr<ByteStream>> s = acceptor_->accept(deadline_in(std::chrono::seconds(1)));
    if (!s) {
      if (s.error().kind == NetErrorKind::CLOSED) return;
      if (s.error().kind == NetErrorKind::TIMEOUT) {
        std::lock_guard lock(mu_);
        reap_finished();
        continue;
      }
      // Out of file descriptors and the like: back off briefly rather than spin, and keep serving.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    std::lock_guard lock(mu_);
    reap_finished();
    if (stopping_ || connections_.size() >= options_.max_connections) {
      if (!stopping_ && options_.on_refused) options_.on_refused(**s);
      (*s)->close();
      ++stats_.refused_over_limit;
      continue;
    }
    ++stats_.accepted;
    auto conn = std::make_unique<Connection>();
    conn->stream = std::move(*s);
    Connection* c = conn.get();
    connections_.push_back(std::move(conn));
    c->thread = std::thread([this, c] {
      try {
        handler_(*c->stream);
      } catch (const std::exception& e) {
        // Exceptions do not cross module seams (STYLE.md): one connection's failure ends that connection.
        std::fprintf(stderr, "essaim: connection %s: handler failed: %s\n", c->stream->peer_name().c_str(), e.what());
        std::lock_guard lock(mu_);
        ++stats_.handler_exceptions;
      }
      // Destroyed here, not at the next reap: a peer that is gone must not keep a file descriptor open
      // until another connection happens to arrive (connection churn would pile them up).
      std::unique_ptr<ByteStream> finished;
      {
        std::lock_guard lock(mu_);
        finished = std::move(c->stream);
        c->done = true;
      }
      finished->close();
      finished.reset();
    });
  }
}

void StreamServer::stop() {
  if (stopping_.exchange(true)) return;
  acceptor_->close();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Connection>> all;
  {
    std::lock_guard lock(mu_);
    for (auto& c : connections_)
      if (c->stream) c->stream->close();  // wakes handlers blocked in read or write
    all.swap(connections_);
  }
  for (auto& c : all) c->thread.join();
}

StreamServer::Stats StreamServer::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.active = 0;
  for (const auto& c : connections_) s.active += c->done ? 0 : 1;
  return s;
}

}  // namespace essaim::net
