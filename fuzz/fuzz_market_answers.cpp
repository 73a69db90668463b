// libFuzzer target for the market client's parsers of untrusted coordinator answers: any bytes as the body
// of GET /api/model (first byte % 4 == 0), POST /api/expert-volunteer (1), POST /api/expert-coverage (2), or
// as a coordinator URL (3). Each must return a value or an error, never crash; an accepted answer must hold
// what the downloader relies on (plain slice names, 64-hex digests, paths on the coordinator, counts >= 1).
#include <cstdint>
#include <cstdlib>
#include <string>

#include "node/market_client.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

void check_offer(const essaim::node::SliceOffer& o) {
  require(essaim::node::is_plain_slice_name(o.name));
  require(essaim::node::is_hex64(o.sha256));
  require(!o.url.empty() && o.url.front() == '/' && o.url.find("..") == std::string::npos);
  require(o.range.expert_count >= 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim::node;
  if (size == 0) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (data[0] % 4) {
    case 0:
      if (auto c = parse_catalogue(body)) {
        require(is_hex64(c->fingerprint.model_identity));
        for (const SliceOffer& o : c->slices) check_offer(o);
      }
      break;
    case 1:
      if (auto v = parse_volunteer_answer(body)) {
        for (const SliceOffer& o : v->assign) check_offer(o);
        for (const RangeRef& r : v->drop) require(r.expert_count >= 1);
        for (const SwapOffer& s : v->swap) {
          check_offer(s.take);
          require(s.give_up.expert_count >= 1 && !(s.give_up == s.take.range));
        }
      }
      break;
    case 2:
      if (auto a = parse_coverage_answer(body)) require(a->heartbeat_s >= 0.05 && a->heartbeat_s <= 3600);
      break;
    default:
      if (auto u = essaim::net::parse_http_url(body)) require(!u->host.empty() && u->port != 0);
      break;
  }
  return 0;
}
