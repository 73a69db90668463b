#include "serve_test_util.h"

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <algorithm>
#include <thread>

#include "backbone_test_util.h"

namespace essaim::serve::testing {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

const std::string& tiny_model_path() {
  static const std::string path = backbone::testing::SwarmModel::get({}).path;
  return path;
}

Status DelayedExecutor::compute(const ExpertBatch& batch, std::span<float> out) {
  std::this_thread::sleep_for(delay_);
  return local_.compute(batch, out);
}

std::unique_ptr<Server> start_server(const TestServerOptions& o) {
  ServerOptions s;
  s.model_path = tiny_model_path();
  s.host = "127.0.0.1";
  s.port = 0;
  s.parallel = o.parallel;
  s.queue_capacity = o.queue_capacity;
  s.n_ctx = o.n_ctx;
  s.batch_tokens = o.batch_tokens;
  s.threads = 1;
  s.limits.api_key = o.api_key;
  s.limits.max_body_bytes = o.max_body_bytes;
  s.limits.max_connections = o.max_connections;
  s.limits.read_deadline = o.read_deadline;
  s.limits.max_unauthenticated_per_address = o.max_unauthenticated_per_address;
  s.limits.max_per_address = o.max_per_address;
  s.executor = o.executor;
  if (!s.executor.make && o.delay_per_layer_call.count() > 0) {
    const auto delay = o.delay_per_layer_call;
    s.executor.make = [delay](const Model& m, ThreadPool* pool) -> Result<std::unique_ptr<ExpertExecutor>> {
      return std::unique_ptr<ExpertExecutor>(std::make_unique<DelayedExecutor>(m.expert_store(), pool, delay));
    };
  }
  Result<std::unique_ptr<Server>> server = Server::start(std::move(s));
  EXPECT_TRUE(server.is_ok()) << server.status().message();
  if (!server) return nullptr;
  const Status ready = (*server)->wait_ready(60s);
  EXPECT_TRUE(ready.is_ok()) << ready.message();
  return std::move(server).value();
}

namespace {

// Runs the io_context until the operations started complete or the deadline passes (then the stream's own
// expiry has closed the socket and the handlers ran with a timeout error).
void run_bounded(asio::io_context& ioc, std::chrono::milliseconds timeout) {
  ioc.restart();
  ioc.run_for(timeout + 1s);
}

}  // namespace

HttpResult http_call(uint16_t port, const std::string& method, const std::string& target, const std::string& body,
                     const std::map<std::string, std::string>& headers, std::chrono::milliseconds timeout) {
  HttpResult result;
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.expires_after(timeout);
  http::request<http::string_body> req(http::string_to_verb(method), target, 11);
  req.set(http::field::host, "127.0.0.1");
  req.set(http::field::connection, "close");
  for (const auto& [k, v] : headers) req.set(k, v);
  if (!body.empty() || method == "POST") {
    req.set(http::field::content_type, "application/json");
    req.body() = body;
    req.prepare_payload();
  }
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.body_limit(64 << 20);
  beast::error_code final_ec;
  stream.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), [&](beast::error_code ec) {
    if (ec) {
      final_ec = ec;
      return;
    }
    http::async_write(stream, req, [&](beast::error_code wec, size_t) {
      // A server refusing a large body may answer (and half-close) before reading it all: read the answer anyway.
      (void)wec;
      http::async_read(stream, buffer, parser, [&](beast::error_code rec, size_t) { final_ec = rec; });
    });
  });
  run_bounded(ioc, timeout);
  if (!parser.is_header_done()) {
    result.error = final_ec ? final_ec.message() : "no answer";
    return result;
  }
  const auto& res = parser.get();
  result.status = int(res.result_int());
  for (const auto& f : res) {
    std::string name(f.name_string());
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return char(std::tolower(c)); });
    result.headers[name] = std::string(f.value());
  }
  result.body = res.body();
  if (final_ec && final_ec != http::error::end_of_stream) result.error = final_ec.message();
  return result;
}

std::string raw_exchange(uint16_t port, const std::string& bytes, std::chrono::milliseconds timeout) {
  asio::io_context ioc;
  beast::tcp_stream stream(ioc);
  stream.expires_after(timeout);
  std::string received;
  std::array<char, 4096> buf;
  std::function<void()> read_more = [&] {
    stream.async_read_some(asio::buffer(buf), [&](beast::error_code ec, size_t n) {
      received.append(buf.data(), n);
      if (!ec) read_more();
    });
  };
  stream.async_connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), [&](beast::error_code ec) {
    if (ec) return;
    asio::async_write(stream, asio::buffer(bytes), [&](beast::error_code, size_t) {});
    read_more();
  });
  run_bounded(ioc, timeout);
  return received;
}

std::vector<std::string> sse_events(const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string block = body.substr(pos, end - pos);
    if (block.rfind("data: ", 0) == 0) events.push_back(block.substr(6));
    pos = end + 2;
  }
  return events;
}

void expect_error_object(const HttpResult& r, int status, const std::string& code) {
  EXPECT_EQ(r.status, status) << r.body << r.error;
  const json j = json::parse(r.body, nullptr, false);
  ASSERT_TRUE(j.is_object()) << r.body;
  ASSERT_TRUE(j.contains("error") && j["error"].is_object()) << r.body;
  const json& e = j["error"];
  ASSERT_TRUE(e.contains("message") && e["message"].is_string()) << r.body;
  EXPECT_FALSE(e["message"].get<std::string>().empty());
  ASSERT_TRUE(e.contains("type") && e["type"].is_string()) << r.body;
  ASSERT_TRUE(e.contains("code")) << r.body;
  if (!code.empty()) {
    EXPECT_EQ(e["code"], code) << r.body;
  }
  EXPECT_EQ(r.headers.count("content-type") ? r.headers.at("content-type") : "", "application/json");
}

bool wait_until(const std::function<bool()>& condition, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (condition()) return true;
    std::this_thread::sleep_for(10ms);
  }
  return condition();
}

struct OpenStream::Impl {
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  std::string received;
};

OpenStream::OpenStream(uint16_t port, const std::string& target, const std::string& body)
    : impl_(std::make_unique<Impl>()) {
  impl_->stream.expires_after(20s);
  beast::error_code ec;
  impl_->stream.socket().connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port), ec);
  if (ec) return;
  const std::string req = "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
  asio::write(impl_->stream.socket(), asio::buffer(req), ec);
}

OpenStream::~OpenStream() { close(); }

bool OpenStream::read_events(size_t n, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  auto count = [&] {
    size_t c = 0;
    for (size_t p = impl_->received.find("data: "); p != std::string::npos; p = impl_->received.find("data: ", p + 1)) ++c;
    return c;
  };
  std::array<char, 4096> buf;
  while (count() < n && std::chrono::steady_clock::now() < end) {
    bool done = false, failed = false;
    impl_->stream.expires_at(end);
    impl_->stream.async_read_some(asio::buffer(buf), [&](beast::error_code ec, size_t got) {
      if (ec) failed = true;
      impl_->received.append(buf.data(), got);
      done = true;
    });
    impl_->ioc.restart();
    impl_->ioc.run_until(end + 1s);
    if (!done || failed) break;
  }
  if (status_ == 0 && impl_->received.rfind("HTTP/1.1 ", 0) == 0) status_ = std::atoi(impl_->received.c_str() + 9);
  return count() >= n;
}

void OpenStream::close() {
  beast::error_code ignored;
  impl_->stream.socket().close(ignored);
}

}  // namespace essaim::serve::testing
