#include "backbone/expert_map.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "net/tcp.h"
#include "net/websocket.h"
#include "relay/relay_client.h"

namespace essaim::backbone {
namespace {

using json = nlohmann::json;

Status check_address(const std::string& address, const std::string& where) {
  if (net::looks_like_ws_url(address)) {  // a worker behind a relay: ws[s]://HOST:PORT/node/NODE_ID
    net::NetResult<net::WsUrl> url = net::parse_ws_url(address);
    if (!url) return Status::error(where + ": " + url.error().message);
    Result<std::string> node = relay::node_id_of_url(*url);
    return node ? Status::ok() : Status::error(where + ": " + node.status().message());
  }
  net::NetResult<std::pair<std::string, uint16_t>> hp = net::parse_host_port(address);
  if (!hp) return Status::error(where + ": '" + address + "' is not HOST:PORT: " + hp.error().message);
  if (hp->second == 0) return Status::error(where + ": '" + address + "' has port 0; give the worker's port");
  return Status::ok();
}

// A JSON integer within [0, max]; nlohmann keeps unsigned, signed and float numbers apart, so 1.5, -1 and
// "3" are all refused here.
Result<uint64_t> json_uint(const json& obj, const char* key, uint64_t max, const std::string& where) {
  auto it = obj.find(key);
  if (it == obj.end()) return Status::error(where + ": missing \"" + key + "\"");
  if (!it->is_number_unsigned() && !(it->is_number_integer() && it->get<int64_t>() >= 0))
    return Status::error(where + ": \"" + key + "\" must be a non-negative integer");
  const uint64_t v = it->get<uint64_t>();
  if (v > max) return Status::error(where + ": \"" + key + "\" = " + std::to_string(v) + " is too large");
  return v;
}

Result<proto::Holding> parse_holding(const json& h, const std::string& where) {
  if (!h.is_object()) return Status::error(where + ": a holding must be an object");
  for (auto it = h.begin(); it != h.end(); ++it)
    if (it.key() != "layer" && it.key() != "expert_first" && it.key() != "expert_count")
      return Status::error(where + ": unknown key \"" + it.key() + "\"");
  ESSAIM_ASSIGN_OR_RETURN(uint64_t layer, json_uint(h, "layer", UINT32_MAX, where));
  ESSAIM_ASSIGN_OR_RETURN(uint64_t first, json_uint(h, "expert_first", UINT32_MAX, where));
  ESSAIM_ASSIGN_OR_RETURN(uint64_t count, json_uint(h, "expert_count", UINT32_MAX, where));
  if (count == 0) return Status::error(where + ": \"expert_count\" must be at least 1");
  if (first + count > (uint64_t(1) << 32)) return Status::error(where + ": the expert range passes 2^32");
  return proto::Holding{.layer = uint32_t(layer), .first_expert = uint32_t(first), .expert_count = uint32_t(count)};
}

Result<WorkerEndpoint> parse_worker(const json& w, size_t& holdings_left, const std::string& where) {
  if (!w.is_object()) return Status::error(where + ": a worker must be an object");
  WorkerEndpoint e;
  for (auto it = w.begin(); it != w.end(); ++it) {
    const std::string& key = it.key();
    if (key == "address") {
      if (!it->is_string()) return Status::error(where + ": \"address\" must be a string");
      e.address = it->get<std::string>();
    } else if (key == "label") {
      if (!it->is_string() || it->get_ref<const std::string&>().size() > proto::kMaxLabelBytes)
        return Status::error(where + ": \"label\" must be a string of at most 256 bytes");
      e.label = it->get<std::string>();
    } else if (key == "holdings") {
      if (!it->is_array()) return Status::error(where + ": \"holdings\" must be an array");
      if (it->size() > holdings_left) return Status::error(where + ": too many holdings in the map");
      holdings_left -= it->size();
      std::vector<proto::Holding> hs;
      hs.reserve(it->size());
      for (size_t i = 0; i < it->size(); ++i) {
        ESSAIM_ASSIGN_OR_RETURN(proto::Holding h, parse_holding((*it)[i], where + " holding " + std::to_string(i)));
        hs.push_back(h);
      }
      e.holdings = std::move(hs);
    } else {
      return Status::error(where + ": unknown key \"" + key + "\"");
    }
  }
  if (e.address.empty()) return Status::error(where + ": missing \"address\"");
  ESSAIM_RETURN_IF_ERROR(check_address(e.address, where));
  return e;
}

}  // namespace

Result<ExpertMap> expert_map_from_addresses(std::span<const std::string> addresses) {
  if (addresses.size() > kMaxMapWorkers) return Status::error("too many workers (at most 4096)");
  ExpertMap map;
  for (const std::string& a : addresses) {
    ESSAIM_RETURN_IF_ERROR(check_address(a, "--worker"));
    map.workers.push_back(WorkerEndpoint{.address = a, .label = {}, .holdings = std::nullopt});
  }
  return map;
}

Result<ExpertMap> expert_map_parse(std::string_view text) {
  if (text.size() > kMaxMapFileBytes) return Status::error("expert map: larger than 16 MiB");
  // No exceptions cross this function: parse errors come back as a discarded value.
  const json doc = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::error("expert map: not valid JSON");
  if (!doc.is_object()) return Status::error("expert map: the document must be a JSON object");
  for (auto it = doc.begin(); it != doc.end(); ++it) {
    const std::string& key = it.key();
    if (key == "format") {
      if (!it->is_string() || it->get_ref<const std::string&>() != "essaim-expert-map")
        return Status::error("expert map: \"format\" must be \"essaim-expert-map\"");
    } else if (key == "version") {
      if (!it->is_number_integer() || it->get<int64_t>() != 1)
        return Status::error("expert map: unsupported \"version\" (this build reads version 1)");
    } else if (key == "generation") {
      // The coordinator's map counter (GET /api/expert-map): changes with the map, not read here.
      if (!it->is_number_unsigned()) return Status::error("expert map: \"generation\" must be a non-negative integer");
    } else if (key != "workers") {
      return Status::error("expert map: unknown key \"" + key + "\"");
    }
  }
  auto workers = doc.find("workers");
  if (workers == doc.end() || !workers->is_array()) return Status::error("expert map: \"workers\" must be an array");
  if (workers->size() > kMaxMapWorkers) return Status::error("expert map: too many workers (at most 4096)");
  ExpertMap map;
  size_t holdings_left = kMaxMapHoldings;
  for (size_t i = 0; i < workers->size(); ++i) {
    ESSAIM_ASSIGN_OR_RETURN(WorkerEndpoint e,
                            parse_worker((*workers)[i], holdings_left, "expert map: worker " + std::to_string(i)));
    map.workers.push_back(std::move(e));
  }
  return map;
}

Result<ExpertMap> expert_map_load(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("expert map: cannot open " + path);
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size < 0) return Status::error("expert map: cannot read " + path);
  if (uint64_t(size) > kMaxMapFileBytes) return Status::error("expert map: " + path + " is larger than 16 MiB");
  in.seekg(0);
  std::string text(size_t(size), '\0');
  if (!in.read(text.data(), size)) return Status::error("expert map: cannot read " + path);
  Result<ExpertMap> map = expert_map_parse(text);
  if (!map) return map.status().with_context(path);
  return map;
}

std::vector<proto::Holding> routable_holdings(std::span<const proto::Holding> announced,
                                              const std::optional<std::vector<proto::Holding>>& declared,
                                              const ExpertStore& replica) {
  // Intersects [first, end) ranges of the same layer; 64-bit ends because first + count may be 2^32.
  auto clip = [](const proto::Holding& h, uint64_t first, uint64_t end) -> std::optional<proto::Holding> {
    const uint64_t lo = std::max<uint64_t>(h.first_expert, first);
    const uint64_t hi = std::min<uint64_t>(uint64_t(h.first_expert) + h.expert_count, end);
    if (lo >= hi) return std::nullopt;
    return proto::Holding{.layer = h.layer, .first_expert = uint32_t(lo), .expert_count = uint32_t(hi - lo)};
  };
  std::vector<proto::Holding> out;
  for (const proto::Holding& a : announced) {
    std::vector<proto::Holding> pieces;
    if (!declared) {
      pieces.push_back(a);
    } else {
      for (const proto::Holding& d : *declared)
        if (d.layer == a.layer)
          if (auto c = clip(a, d.first_expert, uint64_t(d.first_expert) + d.expert_count)) pieces.push_back(*c);
    }
    if (a.layer > uint32_t(INT32_MAX)) continue;
    for (const proto::Holding& p : pieces)
      for (const ExpertLayer& r : replica.ranges(int32_t(a.layer)))
        if (auto c = clip(p, uint64_t(r.expert_begin), uint64_t(r.expert_begin) + uint64_t(r.n_experts)))
          out.push_back(*c);
  }
  return out;
}

bool holdings_contain(std::span<const proto::Holding> holdings, uint32_t layer, uint32_t expert) {
  return std::any_of(holdings.begin(), holdings.end(), [&](const proto::Holding& h) {
    return h.layer == layer && expert >= h.first_expert && expert - h.first_expert < h.expert_count;
  });
}

std::string holdings_text(std::span<const proto::Holding> holdings) {
  if (holdings.empty()) return "nothing";
  std::string t;
  for (const proto::Holding& h : holdings) {
    if (!t.empty()) t += ", ";
    t += "layer " + std::to_string(h.layer) + " experts " + std::to_string(h.first_expert) + "-" +
         std::to_string(uint64_t(h.first_expert) + h.expert_count - 1);
  }
  return t;
}

}  // namespace essaim::backbone
