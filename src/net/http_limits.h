// What the HTTP listener admits, in one place: size limits, deadlines, the connection cap and the API key
// check. Connections also go through the admission layer every listener shares (net::Admission, as the
// expert worker's): per-address and pre-authentication caps, where a flood of connections that never send
// a valid request evicts its own oldest members instead of locking real clients out. A connection counts
// as authenticated once a request's head carries valid credentials (the listener's authorizer says so:
// net/http_server.h); a connection only ever refused (401/403) or only asking public pages stays
// unauthenticated, hence evictable. Values and the status each refusal gets: docs/serve.md "Limits".
//
//   HttpLimits limits;                       // defaults below
//   if (!api_key_ok(limits.api_key, req[http::field::authorization])) reply 401
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace essaim::net {

struct HttpLimits {
  size_t max_body_bytes = 1 << 20;         // 413 beyond
  // 431 beyond: the request line and headers, and apart the trailer of a chunked body (also counted in the
  // body limit). At most kMaxHeaderBytesCeiling: Beast cannot hold a field over 64 KiB.
  size_t max_header_bytes = 16 << 10;
  // Authenticated connections at most (503 past it); sockets in all: this plus max_unauthenticated.
  int32_t max_connections = 256;
  // Authenticated connections of one source address (503 past it), so that one host cannot hold every slot.
  size_t max_per_address = 128;
  std::chrono::milliseconds read_deadline{30'000};   // a whole request (headers + body), else the connection closes
  std::chrono::milliseconds write_deadline{30'000};  // each write to the client, else the client is dropped
  std::chrono::milliseconds idle_deadline{60'000};   // between keep-alive requests
  std::string api_key;                     // empty: no key needed
  // Connections that have not yet sent a complete request with a valid key: capped per source address and
  // in all; past a cap the oldest such connection is evicted (503, closed). Authenticated connections are
  // capped by max_connections. HTTP clients open a connection per concurrent request (64 at once from one
  // host is a normal load test), and a request takes a moment to arrive on a busy server, so the caps are
  // wider than the expert worker's (16 / 64), whose peers are a few backbones.
  size_t max_unauthenticated = 128;
  size_t max_unauthenticated_per_address = 64;  // and never more than max_per_address
};

inline constexpr size_t kMaxHeaderBytesCeiling = 60 << 10;

// True when no key is configured, or `authorization` is "Bearer <key>" (compared in constant time).
bool api_key_ok(std::string_view configured, std::string_view authorization);

}  // namespace essaim::net
