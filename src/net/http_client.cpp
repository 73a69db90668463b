// Blocking calls built from Beast's asynchronous operations, so that every step has a deadline: each
// operation is started, then the io_context runs until it completes or the time is up (then the socket is
// closed and the operation ends with an error).
#include "net/http_client.h"

#include <algorithm>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <boost/beast/ssl.hpp>
#include <cctype>
#include <limits>

#include "net/tls.h"

namespace essaim::net {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using TlsStream = beast::ssl_stream<beast::tcp_stream>;
using Clock = std::chrono::steady_clock;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// Runs `ioc` until *done or `until`; on time-out closes the stream so the pending operation ends.
bool run_until(asio::io_context& ioc, beast::tcp_stream& stream, const bool& done, Clock::time_point until) {
  while (!done) {
    const auto now = Clock::now();
    if (now >= until) {
      stream.cancel();
      beast::error_code ignored;
      stream.socket().close(ignored);
      ioc.restart();
      ioc.run_for(std::chrono::milliseconds(200));  // let the cancelled handler run
      return false;
    }
    ioc.restart();
    ioc.run_one_until(until);
  }
  return true;
}

// One call's connection: plain TCP, or TLS over TCP (then `plain` is unused and `tls` owns the socket).
struct Connection {
  asio::io_context ioc;
  beast::tcp_stream plain{ioc};
  std::shared_ptr<ssl::context> ctx;
  std::unique_ptr<TlsStream> tls;
  std::string where;
  beast::tcp_stream& lowest() { return tls ? tls->next_layer() : plain; }
  // Runs f on the stream the HTTP messages go through.
  template <class F>
  auto with_stream(F&& f) {
    return tls ? f(*tls) : f(plain);
  }
};

Status tls_handshake(Connection& c, const HttpUrl& url, Clock::time_point until) {
  auto check = std::make_shared<TlsPeerCheck>();
  if (NetStatus set = tls_client_setup(*c.tls, url.host, check); !set) return Status::error(set.error().message);
  bool done = false;
  beast::error_code ec;
  c.tls->async_handshake(ssl::stream_base::client, [&](beast::error_code e) {
    ec = e;
    done = true;
  });
  if (!run_until(c.ioc, c.lowest(), done, until)) return Status::error("TLS handshake with " + c.where + " timed out");
  if (ec && !check->failure.empty()) return Status::refusal(tls_handshake_error(c.where, ec, *check).message);
  if (ec) return Status::error(tls_handshake_error(c.where, ec, *check).message);
  return Status::ok();
}

Status connect_and_send(Connection& c, const HttpUrl& url, const HttpCall& call, Clock::time_point until) {
  c.where = url.host + ":" + std::to_string(url.port);
  if (url.tls) {
    NetResult<std::shared_ptr<ssl::context>> ctx = tls_client_context(url.ca_file);
    if (!ctx) return Status::error(ctx.error().message);
    c.ctx = *ctx;
    c.tls = std::make_unique<TlsStream>(c.ioc, *c.ctx);
  }
  tcp::resolver resolver(c.ioc);
  bool done = false;
  beast::error_code ec;
  tcp::resolver::results_type endpoints;
  resolver.async_resolve(url.host, std::to_string(url.port), [&](beast::error_code e, tcp::resolver::results_type r) {
    ec = e;
    endpoints = std::move(r);
    done = true;
  });
  c.ioc.restart();
  while (!done && Clock::now() < until) c.ioc.run_one_until(until);
  if (!done) {
    resolver.cancel();
    return Status::error("resolving " + url.host + " timed out");
  }
  if (ec) return Status::error("cannot resolve " + url.host + ": " + ec.message());
  done = false;
  c.lowest().async_connect(endpoints, [&](beast::error_code e, const tcp::endpoint&) {
    ec = e;
    done = true;
  });
  if (!run_until(c.ioc, c.lowest(), done, until)) return Status::error("connecting to " + c.where + " timed out");
  if (ec) return Status::error("cannot connect to " + c.where + ": " + ec.message());
  if (c.tls) ESSAIM_RETURN_IF_ERROR(tls_handshake(c, url, until));

  http::request<http::string_body> req(http::string_to_verb(call.method), url.base_path + call.target, 11);
  req.set(http::field::host, c.where);
  req.set(http::field::connection, "close");
  req.set(http::field::user_agent, "essaim");
  if (!call.bearer.empty()) req.set(http::field::authorization, "Bearer " + call.bearer);
  for (const auto& [k, v] : call.headers) req.set(k, v);
  if (!call.body.empty()) {
    req.set(http::field::content_type, "application/json");
    req.body() = call.body;
  }
  req.prepare_payload();
  done = false;
  c.with_stream([&](auto& stream) {
    http::async_write(stream, req, [&](beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
  });
  if (!run_until(c.ioc, c.lowest(), done, until)) return Status::error("sending to " + c.where + " timed out");
  if (ec) return Status::error("sending to " + c.where + ": " + ec.message());
  return Status::ok();
}

template <class Fields>
void copy_headers(const Fields& fields, HttpAnswer& a) {
  for (const auto& f : fields) a.headers.emplace_back(lower(std::string_view(f.name_string().data(), f.name_string().size())),
                                                      std::string(f.value()));
}

}  // namespace

std::optional<std::string> HttpAnswer::header(std::string_view name) const {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return std::nullopt;
}

std::string HttpUrl::text() const {
  const std::string h = host.find(':') != std::string::npos ? "[" + host + "]" : host;
  return std::string(tls ? "https://" : "http://") + h + ":" + std::to_string(port) + base_path;
}

Result<HttpUrl> parse_http_url(std::string_view text) {
  const std::string quoted = "URL '" + std::string(text) + "'";
  HttpUrl url;
  std::string_view rest;
  if (text.starts_with("https://")) {
    url.tls = true, url.port = 443, rest = text.substr(8);
  } else if (text.starts_with("http://")) {
    rest = text.substr(7);
  } else {
    return Status::error(quoted + " must start with http:// or https://");
  }
  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (authority.empty() || authority.find('@') != std::string_view::npos || path.find_first_of("?#") != std::string_view::npos) {
    return Status::error(quoted + ": expected http[s]://host[:port][/prefix]");
  }
  std::string_view port_text;
  if (authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return Status::error(quoted + ": unclosed [");
    url.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return Status::error(quoted + ": junk after ]");
      port_text = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    url.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (url.host.empty()) return Status::error(quoted + " has no host");
  if (!port_text.empty() || authority.back() == ':') {
    uint32_t port = 0;
    if (port_text.empty() || port_text.size() > 5) return Status::error(quoted + ": bad port");
    for (char ch : port_text) {
      if (ch < '0' || ch > '9') return Status::error(quoted + ": bad port");
      port = port * 10 + uint32_t(ch - '0');
    }
    if (port == 0 || port > 65535) return Status::error(quoted + ": port out of range");
    url.port = uint16_t(port);
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  url.base_path = std::string(path);
  return url;
}

Status check_plain_http(const HttpUrl& url, bool insecure_http, std::string_view flag) {
  if (url.tls || insecure_http) return Status::ok();
  beast::error_code ec;
  const asio::ip::address a = asio::ip::make_address(url.host, ec);
  if (url.host == "localhost" || (!ec && a.is_loopback())) return Status::ok();
  return Status::error(std::string(flag) + " " + url.text() + ": plain http:// to a host that is not loopback sends tokens "
                       "in clear text; use https:// (or --insecure-http on a private network)");
}

Result<HttpAnswer> http_call(const HttpUrl& url, const HttpCall& call) {
  const auto until = Clock::now() + call.deadline;
  Connection c;
  ESSAIM_RETURN_IF_ERROR(connect_and_send(c, url, call, until));
  beast::flat_buffer buffer;
  http::response_parser<http::string_body> parser;
  parser.header_limit(64 << 10);
  parser.body_limit(call.max_body_bytes);
  bool done = false;
  beast::error_code ec;
  // Header first: this Boost's parser does not apply body_limit to a response's Content-Length, so the
  // announced length is checked here before the body is read into memory.
  c.with_stream([&](auto& stream) {
    http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
  });
  bool in_time = run_until(c.ioc, c.lowest(), done, until);
  if (in_time && !ec) {
    if (parser.content_length() && *parser.content_length() > call.max_body_bytes) ec = http::error::body_limit;
    if (!ec && !parser.is_done()) {
      done = false;
      c.with_stream([&](auto& stream) {
        http::async_read(stream, buffer, parser, [&](beast::error_code e, size_t) {
          ec = e;
          done = true;
        });
      });
      in_time = run_until(c.ioc, c.lowest(), done, until);
    }
  }
  if (!in_time) {
    return Status::error(call.method + " " + call.target + " at " + c.where + ": no answer within " +
                         std::to_string(call.deadline.count()) + " ms");
  }
  if (ec == http::error::body_limit) {
    return Status::error(call.method + " " + call.target + " at " + c.where + ": answer larger than " +
                         std::to_string(call.max_body_bytes) + " bytes");
  }
  if (ec) return Status::error(call.method + " " + call.target + " at " + c.where + ": " + ec.message());
  HttpAnswer a;
  a.status = int(parser.get().result_int());
  copy_headers(parser.get().base(), a);
  a.body = std::move(parser.get().body());
  return a;
}

Status http_stream(const HttpUrl& url, const HttpCall& call, const std::function<Status(const HttpAnswer&)>& on_head,
                   const std::function<Status(std::span<const char>)>& on_bytes) {
  const std::string what = call.method + " " + call.target + " at " + url.host + ":" + std::to_string(url.port);
  Connection c;
  ESSAIM_RETURN_IF_ERROR(connect_and_send(c, url, call, Clock::now() + call.deadline));
  beast::flat_buffer buffer;
  http::response_parser<http::buffer_body> parser;
  parser.header_limit(64 << 10);
  // The caller bounds the body (it knows the expected length). Not boost::none: Boost 1.74 compares the
  // Content-Length with the optional limit, and any length is "greater" than an empty optional.
  parser.body_limit(std::numeric_limits<std::uint64_t>::max());
  bool done = false;
  beast::error_code ec;
  c.with_stream([&](auto& stream) {
    http::async_read_header(stream, buffer, parser, [&](beast::error_code e, size_t) {
      ec = e;
      done = true;
    });
  });
  if (!run_until(c.ioc, c.lowest(), done, Clock::now() + call.deadline)) return Status::error(what + ": no answer in time");
  if (ec) return Status::error(what + ": " + ec.message());
  {
    HttpAnswer head;
    head.status = int(parser.get().result_int());
    copy_headers(parser.get().base(), head);
    ESSAIM_RETURN_IF_ERROR(on_head(head));
  }
  std::vector<char> chunk(1 << 20);
  while (!parser.is_done()) {
    parser.get().body().data = chunk.data();
    parser.get().body().size = chunk.size();
    done = false;
    c.with_stream([&](auto& stream) {
      http::async_read_some(stream, buffer, parser, [&](beast::error_code e, size_t) {
        ec = e;
        done = true;
      });
    });
    const bool in_time = run_until(c.ioc, c.lowest(), done, Clock::now() + call.read_timeout);
    const size_t got = chunk.size() - parser.get().body().size;
    if (got > 0) ESSAIM_RETURN_IF_ERROR(on_bytes(std::span<const char>(chunk.data(), got)));
    if (!in_time) return Status::error(what + ": no data for " + std::to_string(call.read_timeout.count()) + " ms");
    if (ec == http::error::need_buffer) continue;
    if (ec == http::error::partial_message || ec == http::error::end_of_stream || ec == ssl::error::stream_truncated) {
      return Status::error(what + ": the connection closed before the body was complete");
    }
    if (ec) return Status::error(what + ": " + ec.message());
  }
  return Status::ok();
}

}  // namespace essaim::net
