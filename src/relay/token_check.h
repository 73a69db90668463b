// Who a relay token belongs to: behind one interface, a token file (`essaim relay --tokens FILE`, lines
// `NODE_ID TOKEN`) or the market coordinator anywhere (`--coordinator https://HOST`, through
// `GET /api/whoami` on net's HTTP client: TLS verified against the system store plus `--ca-file`).
//
//   Result<std::unique_ptr<TokenChecker>> c = FileTokenChecker::load("tokens.txt");
//   TokenVerdict v = (*c)->check(token);   // v.node_id once accepted; v.reason when not
//
// Fail closed: a checker that cannot reach its source refuses (UNAVAILABLE), it never lets a token in.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "core/status.h"
#include "net/http_client.h"

namespace essaim::relay {

struct TokenVerdict {
  enum class Kind : uint8_t { ACCEPTED, REFUSED, UNAVAILABLE };
  Kind kind = Kind::REFUSED;
  std::string node_id;  // ACCEPTED
  std::string reason;   // otherwise: for the close frame and the log
  bool ok() const { return kind == Kind::ACCEPTED; }
};

class TokenChecker {
 public:
  virtual ~TokenChecker() = default;
  // Thread-safe; may block (a coordinator round trip), never longer than its own timeout.
  virtual TokenVerdict check(const std::string& token) = 0;
};

class FileTokenChecker : public TokenChecker {
 public:
  // Lines "NODE_ID TOKEN" (spaces or tabs between); '#' starts a comment; blank lines skipped. A
  // malformed line, a repeated token or a repeated node id is an error naming the line.
  static Result<std::unique_ptr<FileTokenChecker>> load(const std::string& path);
  static Result<std::unique_ptr<FileTokenChecker>> parse(const std::string& text);
  TokenVerdict check(const std::string& token) override;

 private:
  std::map<std::string, std::string> node_by_token_;
};

// The coordinator's answer to GET /api/whoami with "Authorization: Bearer TOKEN": 200 {"node_id": ...}
// accepts, 401/403 refuses, anything else (unreachable, 5xx, bad JSON, a certificate that does not verify)
// is UNAVAILABLE. Answers are cached for `cache_ttl` (accepted and refused alike): a revoked token is refused
// at most that long after revocation, and a coordinator down for longer than that fails closed (every
// token refused until it answers again). https:// anywhere; plain http:// to loopback only, unless
// `insecure_http`.
class CoordinatorTokenChecker : public TokenChecker {
 public:
  struct Options {
    std::string ca_file;         // trusted besides the system store (https)
    bool insecure_http = false;  // plain http:// to a host that is not loopback
    std::chrono::milliseconds cache_ttl{5000};
    std::chrono::milliseconds timeout{3000};
  };
  static Result<std::unique_ptr<CoordinatorTokenChecker>> create(const std::string& url, const Options& options);
  TokenVerdict check(const std::string& token) override;

 private:
  TokenVerdict ask(const std::string& token);
  net::HttpUrl url_;
  Options options_;
  std::mutex mu_;
  struct Cached {
    TokenVerdict verdict;
    std::chrono::steady_clock::time_point at;
  };
  std::map<std::string, Cached> cache_;  // guarded by mu_
};

}  // namespace essaim::relay
