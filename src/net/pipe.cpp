#include "net/pipe.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "net/wait.h"

namespace essaim::net {

namespace {

// One direction: a ring buffer with a writer end and a reader end.
struct Channel {
  explicit Channel(size_t capacity) : buf(capacity) {}
  std::vector<uint8_t> buf;
  size_t head = 0;  // next byte to read
  size_t size = 0;  // bytes buffered
  bool writer_closed = false;  // reader sees end-of-stream once drained
  bool reader_closed = false;  // writer sees CLOSED (a broken pipe)
};

// Both directions share one mutex: traffic here is test traffic, and one lock keeps close() simple.
struct Shared {
  explicit Shared(size_t capacity) : ab(capacity), ba(capacity) {}
  std::mutex mu;
  std::condition_variable cv;
  Channel ab, ba;
};

std::atomic<uint64_t> g_pipe_ids{0};

class PipeEnd : public ByteStream {
 public:
  PipeEnd(std::shared_ptr<Shared> s, Channel* in, Channel* out, uint64_t id, char side)
      : s_(std::move(s)), in_(in), out_(out), name_("pipe#" + std::to_string(id) + side) {}
  ~PipeEnd() override { close(); }

  NetResult<size_t> read_some(std::span<uint8_t> buf, Deadline deadline) override {
    if (buf.empty()) return size_t(0);
    std::unique_lock lock(s_->mu);
    auto can_read = [&] { return closed_ || in_->size > 0 || in_->writer_closed; };
    if (!wait_until_deadline(s_->cv, lock, deadline, can_read)) {
      return net_error(NetErrorKind::TIMEOUT, "no data from " + name_ + " before the deadline");
    }
    if (closed_) return net_error(NetErrorKind::CLOSED, name_ + " was closed locally");
    if (in_->size == 0) return net_error(NetErrorKind::CLOSED, "peer closed " + name_);
    size_t n = std::min(buf.size(), in_->size);
    for (size_t done = 0; done < n;) {  // at most two pieces around the ring's end
      size_t piece = std::min(n - done, in_->buf.size() - in_->head);
      std::memcpy(buf.data() + done, in_->buf.data() + in_->head, piece);
      in_->head = (in_->head + piece) % in_->buf.size();
      done += piece;
    }
    in_->size -= n;
    s_->cv.notify_all();
    return n;
  }

  NetStatus write_all(std::span<const uint8_t> bytes, Deadline deadline) override {
    std::unique_lock lock(s_->mu);
    while (!bytes.empty()) {
      auto can_write = [&] { return closed_ || out_->reader_closed || out_->size < out_->buf.size(); };
      if (!wait_until_deadline(s_->cv, lock, deadline, can_write)) {
        return net_error(NetErrorKind::TIMEOUT, "peer of " + name_ + " did not read before the deadline");
      }
      if (closed_) return net_error(NetErrorKind::CLOSED, name_ + " was closed locally");
      if (out_->reader_closed) return net_error(NetErrorKind::CLOSED, "peer closed " + name_);
      size_t cap = out_->buf.size();
      size_t n = std::min(bytes.size(), cap - out_->size);
      for (size_t done = 0; done < n;) {
        size_t tail = (out_->head + out_->size) % cap;
        size_t piece = std::min(n - done, cap - tail);
        std::memcpy(out_->buf.data() + tail, bytes.data() + done, piece);
        out_->size += piece;
        done += piece;
      }
      bytes = bytes.subspan(n);
      s_->cv.notify_all();
    }
    return {};
  }

  void close() override {
    std::lock_guard lock(s_->mu);
    if (closed_) return;
    closed_ = true;
    out_->writer_closed = true;
    in_->reader_closed = true;
    s_->cv.notify_all();
  }

  std::string peer_name() const override { return name_; }

 private:
  std::shared_ptr<Shared> s_;
  Channel* in_;
  Channel* out_;
  std::string name_;
  bool closed_ = false;  // guarded by s_->mu
};

}  // namespace

std::pair<std::unique_ptr<ByteStream>, std::unique_ptr<ByteStream>> make_pipe(size_t capacity_bytes) {
  ESSAIM_CHECK(capacity_bytes > 0);
  auto s = std::make_shared<Shared>(capacity_bytes);
  uint64_t id = g_pipe_ids.fetch_add(1);
  return {std::make_unique<PipeEnd>(s, &s->ba, &s->ab, id, 'a'), std::make_unique<PipeEnd>(s, &s->ab, &s->ba, id, 'b')};
}

std::unique_ptr<ByteStream> PipeHub::connect() {
  auto [client, server] = make_pipe(capacity_);
  std::lock_guard lock(mu_);
  if (closed_) {
    client->close();
    return std::move(client);
  }
  pending_.push_back(std::move(server));
  cv_.notify_all();
  return std::move(client);
}

NetResult<std::unique_ptr<ByteStream>> PipeHub::accept(Deadline deadline) {
  std::unique_lock lock(mu_);
  if (!wait_until_deadline(cv_, lock, deadline, [&] { return closed_ || !pending_.empty(); })) {
    return net_error(NetErrorKind::TIMEOUT, "no connection before the deadline");
  }
  if (closed_) return net_error(NetErrorKind::CLOSED, "pipe hub closed");
  std::unique_ptr<ByteStream> s = std::move(pending_.front());
  pending_.pop_front();
  return NetResult<std::unique_ptr<ByteStream>>(std::move(s));
}

void PipeHub::close() {
  std::lock_guard lock(mu_);
  closed_ = true;
  for (auto& s : pending_) s->close();
  pending_.clear();
  cv_.notify_all();
}

}  // namespace essaim::net
