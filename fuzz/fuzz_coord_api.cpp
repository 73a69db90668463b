// libFuzzer target for the coordinator's request parsers (coord/api_parse.h): the first byte picks the
// parser (register, coverage, volunteer, usage, work, Range header), the rest is the body. Each must return
// a value or an error, never crash; accepted values must satisfy what the handlers rely on (valid ids,
// digests and ranges; a Range inside the file).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "coord/api_parse.h"
#include "coord/validate.h"

namespace {
void require(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim::coord;
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 6) {
    case 0:
      if (auto r = parse_register(body)) require(name_valid(r->name) && role_valid(r->role));
      break;
    case 1:
      if (auto r = parse_coverage(body)) {
        require(node_id_valid(r->node_id) && is_hex(r->model_identity, 64));
        for (const RangeRef& h : r->holdings) require(range_valid(h.layer, h.expert_first, h.expert_count) && is_hex(h.sha256, 64));
        require(!r->leaving || r->holdings.empty());  // a leaving node holds nothing
      }
      break;
    case 2:
      if (auto r = parse_volunteer(body)) {
        require(node_id_valid(r->node_id) && r->budget_bytes >= 0);
        for (const RangeRef& h : r->holding) require(range_valid(h.layer, h.expert_first, h.expert_count));
      }
      break;
    case 3:
      if (auto r = parse_usage(body, 8)) {
        for (const UsageLayer& l : *r) require(l.counts.size() == 8);
      }
      break;
    case 4:
      if (auto r = parse_work(body)) {
        for (const WorkReport& w : *r) require(w.audits_failed <= w.audits && w.pairs_accepted >= 0);
      }
      break;
    default: {
      const uint64_t total = size % 4096;
      const ByteRange r = parse_range_header(body, total);
      if (r.kind == ByteRange::PARTIAL) require(r.first <= r.last && r.last < total);
    }
  }
  return 0;
}
