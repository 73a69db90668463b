// Parsers for the market API's request bodies and the Range header (docs/market.md). Input is hostile:
// every field is type- and range-checked, sizes are bounded before anything is allocated from them, and
// every failure is an error value whose message names the field. Pure: no I/O (fuzz/fuzz_coord_api.cpp).
//
//   ESSAIM_ASSIGN_OR_RETURN(CoverageRequest hb, parse_coverage(req.body));
//   ByteRange r = parse_range_header("bytes=0-1023", file_size);   // r.kind == ByteRange::PARTIAL
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace essaim::coord {

struct RangeRef {
  int64_t layer = 0, expert_first = 0, expert_count = 0;
  std::string sha256;  // empty when the request does not carry one
};

struct CoverageRequest {
  std::string node_id, address;
  std::string model_identity, kernel_abi;
  int64_t protocol_version = 0;
  std::vector<RangeRef> holdings;
  int64_t capacity_bytes = 0;
  double load = 0;
  bool leaving = false;  // the node is stopping: its holdings are forgotten at once (no 3 missed heartbeats)
};

struct VolunteerRequest {
  std::string node_id;
  int64_t budget_bytes = 0;
  bool has_holding = false;
  std::vector<RangeRef> holding;
};

struct UsageLayer {
  int64_t layer = 0;
  std::vector<int64_t> counts;
};

struct WorkReport {
  std::string address;
  int64_t pairs_accepted = 0, audits = 0, audits_failed = 0;
};

// POST /api/nodes: {"name": ..., "role": "worker" (default) | "backbone"}. A worker heartbeats and volunteers;
// a backbone reports work. Neither may do the other's part, so no worker's claim is ever credited.
struct RegisterRequest {
  std::string name;
  std::string role = "worker";
};
Result<RegisterRequest> parse_register(std::string_view body);
Result<CoverageRequest> parse_coverage(std::string_view body);
Result<VolunteerRequest> parse_volunteer(std::string_view body);
// n_experts: every layer's counts must have exactly this many entries.
Result<std::vector<UsageLayer>> parse_usage(std::string_view body, int64_t n_experts);
Result<std::vector<WorkReport>> parse_work(std::string_view body);

struct ByteRange {
  enum Kind { WHOLE, PARTIAL, UNSATISFIABLE, MALFORMED } kind = WHOLE;
  uint64_t first = 0, last = 0;  // inclusive, for PARTIAL
};
// "" → WHOLE; "bytes=a-b" / "bytes=a-" / "bytes=-n" (one range only) → PARTIAL or UNSATISFIABLE;
// anything else (several ranges, other units, garbage, b < a) → MALFORMED.
ByteRange parse_range_header(std::string_view header, uint64_t total);

}  // namespace essaim::coord
