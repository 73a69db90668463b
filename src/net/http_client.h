// The one blocking HTTP/1.1 client of essaim, on Boost.Beast: the node's market calls and slice downloads,
// the backbone's map and hot-expert fetches, the relay's token check. http:// or https:// (TLS through
// net/tls.h: the system trust store plus `ca_file`, the host name checked), one connection per call,
// a deadline on every call and on every read, and a bound on the response it accepts. Whatever comes back
// is untrusted: callers validate it.
//
//   ESSAIM_ASSIGN_OR_RETURN(HttpUrl url, parse_http_url("https://coord.example.org"));
//   url.ca_file = "ca.pem";                                            // optional, besides the system store
//   HttpCall call{.method = "GET", .target = "/api/model", .bearer = token};
//   ESSAIM_ASSIGN_OR_RETURN(HttpAnswer a, http_call(url, call));      // a.status, a.body (<= max_body_bytes)
//
//   http_stream(url, call, on_head, on_bytes);    // bodies too large to hold (slices): handed over in chunks
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace essaim::net {

struct HttpUrl {
  bool tls = false;       // https://
  std::string host;
  uint16_t port = 80;
  std::string base_path;  // "" or "/prefix" (no trailing '/'): prepended to every call's target
  std::string ca_file;    // https: a PEM CA file trusted besides the system store (not part of the text)
  std::string text() const;  // "http[s]://host:port[/prefix]"
};

// "http[s]://host[:port][/prefix]" (default ports 80 and 443); host may be [v6]. Anything else (another
// scheme, user info, a query) is an error.
Result<HttpUrl> parse_http_url(std::string_view text);

// Plain http:// carries tokens in clear text: allowed to a loopback host (127.0.0.0/8, ::1, localhost),
// refused for any other unless `insecure_http` (the `--insecure-http` flags). https:// always passes.
Status check_plain_http(const HttpUrl& url, bool insecure_http, std::string_view flag);

struct HttpCall {
  std::string method = "GET";
  std::string target = "/";               // path (+ query), after the URL's base_path
  std::string bearer;                     // sent as "Authorization: Bearer ..." when not empty
  std::string body;                       // sent with Content-Type: application/json when not empty
  std::vector<std::pair<std::string, std::string>> headers;  // extra (Range, ...)
  std::chrono::milliseconds deadline{10'000};     // connect + request + whole response (http_call)
  std::chrono::milliseconds read_timeout{15'000}; // http_stream: longest silence between chunks
  uint64_t max_body_bytes = 4u << 20;             // http_call: larger answers are refused
};

struct HttpAnswer {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  // The value of a header (name lower-case), or nullopt.
  std::optional<std::string> header(std::string_view name) const;
};

// One request, the whole answer in memory (at most max_body_bytes).
Result<HttpAnswer> http_call(const HttpUrl& url, const HttpCall& call);

// One request whose body is streamed: on_head sees the status and headers (its answer's body is empty)
// and may refuse (an error stops the transfer); on_bytes gets the body in chunks. Returns an error for a
// connection lost, a silence longer than read_timeout, or a body shorter than its Content-Length —
// after on_bytes has seen what did arrive (a download keeps it and resumes).
Status http_stream(const HttpUrl& url, const HttpCall& call, const std::function<Status(const HttpAnswer&)>& on_head,
                   const std::function<Status(std::span<const char>)>& on_bytes);

}  // namespace essaim::net
