// The node's side of the coverage market (docs/market.md): typed calls for the coordinator's endpoints.
// Every answer is untrusted: each field is checked (type, range, hex digests, slice names without '/' or
// '..') and a bad one is an error naming it, never a crash.
//
//   ESSAIM_ASSIGN_OR_RETURN(MarketClient c, MarketClient::connect("http://127.0.0.1:8080", token));
//   ESSAIM_ASSIGN_OR_RETURN(Catalogue cat, c.model());
//   ESSAIM_ASSIGN_OR_RETURN(VolunteerAnswer v, c.volunteer(node_id, 256 << 20, held));
//   ESSAIM_ASSIGN_OR_RETURN(CoverageAnswer h, c.heartbeat(beat));
//   ESSAIM_ASSIGN_OR_RETURN(std::string map_json, c.expert_map());   // backbone::expert_map_parse reads it
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "net/http_client.h"

namespace essaim::node {

struct RangeRef {
  uint32_t layer = 0;
  uint32_t expert_first = 0;
  uint32_t expert_count = 0;
  bool operator==(const RangeRef&) const = default;
};

struct SliceOffer {  // one catalogue entry or one assignment
  RangeRef range;
  std::string name;    // a plain file name
  uint64_t bytes = 0;
  std::string sha256;  // 64 lowercase hex
  std::string url;     // a path on the coordinator ("/slices/NAME")
};

struct Fingerprint {
  std::string model_identity;  // 64 hex
  uint32_t protocol_version = 0;
  std::string kernel_abi;
  bool operator==(const Fingerprint&) const = default;
};

struct Catalogue {
  Fingerprint fingerprint;
  std::string architecture;
  uint32_t n_layers = 0, n_experts = 0, n_expert_used = 0;
  std::vector<SliceOffer> slices;
};

struct Holding {
  RangeRef range;
  std::string sha256;
};

struct Heartbeat {
  std::string node_id;
  std::string address;  // host:port backbones connect to
  Fingerprint fingerprint;
  std::vector<Holding> holdings;
  uint64_t capacity_bytes = 0;
  double load = 0;
  bool leaving = false;  // the last heartbeat of a node that stops (holdings must be empty)
};

struct CoverageAnswer {
  uint32_t accepted_holdings = 0;
  double heartbeat_s = 10;
  bool fingerprint_ok = false;
  bool volunteer = false;  // volunteering now would change something (an assignment, a swap or a drop)
};

// Take `take` (download, verify, serve) and only then stop serving `give_up`: the coordinator asks a node with
// no room for a needed range to move one of its better-covered ranges to it.
struct SwapOffer {
  SliceOffer take;
  RangeRef give_up;
};

struct VolunteerAnswer {
  std::vector<SliceOffer> assign;
  std::vector<RangeRef> drop;
  std::vector<SwapOffer> swap;
};

struct WorkReport {
  std::string address;
  uint64_t pairs_accepted = 0;
  uint64_t audits = 0;
  uint64_t audits_failed = 0;
};

struct LayerUsage {
  uint32_t layer = 0;
  std::vector<uint64_t> counts;  // n_experts entries
};

// Checks used on every answer (exposed for the fuzz target and the tests).
bool is_hex64(const std::string& s);
bool is_plain_slice_name(const std::string& s);
Result<Catalogue> parse_catalogue(const std::string& body);
Result<VolunteerAnswer> parse_volunteer_answer(const std::string& body);
Result<CoverageAnswer> parse_coverage_answer(const std::string& body);

// How a client reaches the coordinator beyond its URL: the `--ca-file` trusted for https:// besides the
// system store, and `--insecure-http` (plain http:// to a host that is not loopback; net::check_plain_http).
struct CoordinatorAccess {
  std::string ca_file;
  bool insecure_http = false;
};

class MarketClient {
 public:
  static Result<MarketClient> connect(const std::string& coordinator_url, std::string token,
                                      const CoordinatorAccess& access = {},
                                      std::chrono::milliseconds deadline = std::chrono::milliseconds(10'000));

  Result<Catalogue> model() const;
  Result<CoverageAnswer> heartbeat(const Heartbeat& beat) const;
  Result<VolunteerAnswer> volunteer(const std::string& node_id, uint64_t budget_bytes,
                                    const std::vector<RangeRef>& holding) const;
  Result<std::string> whoami_node_id() const;
  Result<std::string> expert_map() const;  // the JSON text, size-bounded
  Status report_usage(const std::vector<LayerUsage>& layers) const;
  Status report_work(const std::vector<WorkReport>& reports) const;

  const net::HttpUrl& url() const { return url_; }
  const std::string& token() const { return token_; }

 private:
  MarketClient(net::HttpUrl url, std::string token, std::chrono::milliseconds deadline)
      : url_(std::move(url)), token_(std::move(token)), deadline_(deadline) {}
  // A call whose 2xx body is returned; any other status is an error quoting the coordinator's message.
  Result<std::string> call(const std::string& method, const std::string& target, std::string body = {}) const;

  net::HttpUrl url_;
  std::string token_;
  std::chrono::milliseconds deadline_;
};

}  // namespace essaim::node
