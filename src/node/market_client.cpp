#include "node/market_client.h"

#include <cmath>
#include <nlohmann/json.hpp>

namespace essaim::node {
namespace {

using nlohmann::json;

constexpr uint32_t kMaxIndex = 1u << 20;  // layers / experts: far above any real model, small enough to be safe

Result<json> parse_object(const std::string& body, const char* what) {
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::error(std::string(what) + ": the answer is not a JSON object");
  return j;
}

Result<uint64_t> get_uint(const json& j, const char* key, uint64_t max, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_number_unsigned()) {
    if (it != j.end() && it->is_number_integer() && it->get<int64_t>() >= 0) {
      const uint64_t v = uint64_t(it->get<int64_t>());
      if (v <= max) return v;
    }
    return Status::error(where + ": '" + key + "' must be an unsigned integer");
  }
  const uint64_t v = it->get<uint64_t>();
  if (v > max) return Status::error(where + ": '" + key + "' = " + std::to_string(v) + " is out of range");
  return v;
}

Result<std::string> get_string(const json& j, const char* key, size_t max_len, const std::string& where) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) return Status::error(where + ": '" + key + "' must be a string");
  std::string s = it->get<std::string>();
  if (s.size() > max_len) return Status::error(where + ": '" + key + "' is longer than " + std::to_string(max_len));
  return s;
}

Result<RangeRef> get_range(const json& j, const std::string& where) {
  if (!j.is_object()) return Status::error(where + ": expected an object");
  RangeRef r;
  ESSAIM_ASSIGN_OR_RETURN(uint64_t layer, get_uint(j, "layer", kMaxIndex, where));
  ESSAIM_ASSIGN_OR_RETURN(uint64_t first, get_uint(j, "expert_first", kMaxIndex, where));
  ESSAIM_ASSIGN_OR_RETURN(uint64_t count, get_uint(j, "expert_count", kMaxIndex, where));
  if (count == 0) return Status::error(where + ": 'expert_count' must be at least 1");
  r.layer = uint32_t(layer);
  r.expert_first = uint32_t(first);
  r.expert_count = uint32_t(count);
  return r;
}

Result<SliceOffer> get_offer(const json& j, const std::string& where) {
  SliceOffer o;
  ESSAIM_ASSIGN_OR_RETURN(o.range, get_range(j, where));
  ESSAIM_ASSIGN_OR_RETURN(o.name, get_string(j, "name", 255, where));
  if (!is_plain_slice_name(o.name)) return Status::error(where + ": slice name '" + o.name + "' is not a plain file name");
  ESSAIM_ASSIGN_OR_RETURN(o.bytes, get_uint(j, "bytes", uint64_t(1) << 44, where));
  ESSAIM_ASSIGN_OR_RETURN(o.sha256, get_string(j, "sha256", 64, where));
  if (!is_hex64(o.sha256)) return Status::error(where + ": 'sha256' must be 64 lowercase hex digits");
  auto url = j.find("url");
  if (url == j.end()) {
    o.url = "/slices/" + o.name;
  } else {
    ESSAIM_ASSIGN_OR_RETURN(o.url, get_string(j, "url", 1024, where));
    if (o.url.empty() || o.url.front() != '/' || o.url.find("..") != std::string::npos ||
        o.url.find_first_of(" \r\n\t?#") != std::string::npos) {
      return Status::error(where + ": 'url' must be a plain path on the coordinator");
    }
  }
  return o;
}

Result<std::vector<json>> get_array(const json& j, const char* key, size_t max, const std::string& where,
                                    bool optional = false) {
  auto it = j.find(key);
  if (it == j.end() && optional) return std::vector<json>{};
  if (it == j.end() || !it->is_array()) return Status::error(where + ": '" + key + "' must be an array");
  if (it->size() > max) return Status::error(where + ": '" + key + "' has more than " + std::to_string(max) + " entries");
  return std::vector<json>(it->begin(), it->end());
}

json range_json(const RangeRef& r) {
  return {{"layer", r.layer}, {"expert_first", r.expert_first}, {"expert_count", r.expert_count}};
}

json fingerprint_json(const Fingerprint& f) {
  return {{"model_identity", f.model_identity}, {"protocol_version", f.protocol_version}, {"kernel_abi", f.kernel_abi}};
}

}  // namespace

bool is_hex64(const std::string& s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

bool is_plain_slice_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || s == "." || s == ".." || s.find("..") != std::string::npos) return false;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '-' || c == '_';
    if (!ok) return false;
  }
  return s.front() != '.';
}

Result<Catalogue> parse_catalogue(const std::string& body) {
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body, "GET /api/model"));
  const std::string where = "GET /api/model";
  Catalogue c;
  ESSAIM_ASSIGN_OR_RETURN(c.fingerprint.model_identity, get_string(j, "model_identity", 64, where));
  if (!is_hex64(c.fingerprint.model_identity)) return Status::error(where + ": 'model_identity' must be 64 lowercase hex digits");
  ESSAIM_ASSIGN_OR_RETURN(uint64_t pv, get_uint(j, "protocol_version", 1u << 16, where));
  c.fingerprint.protocol_version = uint32_t(pv);
  ESSAIM_ASSIGN_OR_RETURN(c.fingerprint.kernel_abi, get_string(j, "kernel_abi", 256, where));
  ESSAIM_ASSIGN_OR_RETURN(c.architecture, get_string(j, "architecture", 64, where));
  ESSAIM_ASSIGN_OR_RETURN(uint64_t nl, get_uint(j, "n_layers", kMaxIndex, where));
  ESSAIM_ASSIGN_OR_RETURN(uint64_t ne, get_uint(j, "n_experts", kMaxIndex, where));
  ESSAIM_ASSIGN_OR_RETURN(uint64_t nu, get_uint(j, "n_expert_used", kMaxIndex, where));
  c.n_layers = uint32_t(nl);
  c.n_experts = uint32_t(ne);
  c.n_expert_used = uint32_t(nu);
  ESSAIM_ASSIGN_OR_RETURN(std::vector<json> slices, get_array(j, "slices", 1u << 20, where));
  for (size_t i = 0; i < slices.size(); ++i) {
    ESSAIM_ASSIGN_OR_RETURN(SliceOffer o, get_offer(slices[i], where + " slices[" + std::to_string(i) + "]"));
    c.slices.push_back(std::move(o));
  }
  return c;
}

Result<VolunteerAnswer> parse_volunteer_answer(const std::string& body) {
  const std::string where = "POST /api/expert-volunteer";
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body, where.c_str()));
  VolunteerAnswer v;
  ESSAIM_ASSIGN_OR_RETURN(std::vector<json> assign, get_array(j, "assign", 1u << 16, where));
  for (size_t i = 0; i < assign.size(); ++i) {
    ESSAIM_ASSIGN_OR_RETURN(SliceOffer o, get_offer(assign[i], where + " assign[" + std::to_string(i) + "]"));
    v.assign.push_back(std::move(o));
  }
  ESSAIM_ASSIGN_OR_RETURN(std::vector<json> drop, get_array(j, "drop", 1u << 16, where, /*optional=*/true));
  for (size_t i = 0; i < drop.size(); ++i) {
    ESSAIM_ASSIGN_OR_RETURN(RangeRef r, get_range(drop[i], where + " drop[" + std::to_string(i) + "]"));
    v.drop.push_back(r);
  }
  ESSAIM_ASSIGN_OR_RETURN(std::vector<json> swap, get_array(j, "swap", 16, where, /*optional=*/true));
  for (size_t i = 0; i < swap.size(); ++i) {
    const std::string at = where + " swap[" + std::to_string(i) + "]";
    if (!swap[i].is_object() || !swap[i].contains("take") || !swap[i].contains("give_up")) {
      return Status::error(at + ": must be an object with 'take' and 'give_up'");
    }
    ESSAIM_ASSIGN_OR_RETURN(SliceOffer take, get_offer(swap[i]["take"], at + ".take"));
    ESSAIM_ASSIGN_OR_RETURN(RangeRef give_up, get_range(swap[i]["give_up"], at + ".give_up"));
    if (take.range == give_up) return Status::error(at + ": gives up the range it takes");
    v.swap.push_back({std::move(take), give_up});
  }
  return v;
}

Result<CoverageAnswer> parse_coverage_answer(const std::string& body) {
  const std::string where = "POST /api/expert-coverage";
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body, where.c_str()));
  CoverageAnswer a;
  ESSAIM_ASSIGN_OR_RETURN(uint64_t n, get_uint(j, "accepted_holdings", 1u << 20, where));
  a.accepted_holdings = uint32_t(n);
  auto hb = j.find("heartbeat_s");
  if (hb == j.end() || !hb->is_number() || !std::isfinite(hb->get<double>()) || hb->get<double>() < 0.05 ||
      hb->get<double>() > 3600) {
    return Status::error(where + ": 'heartbeat_s' must be a number of seconds in [0.05, 3600]");
  }
  a.heartbeat_s = hb->get<double>();
  auto ok = j.find("fingerprint_ok");
  if (ok == j.end() || !ok->is_boolean()) return Status::error(where + ": 'fingerprint_ok' must be true or false");
  a.fingerprint_ok = ok->get<bool>();
  if (auto v = j.find("volunteer"); v != j.end()) {  // optional: a coordinator before issue 41 does not send it
    if (!v->is_boolean()) return Status::error(where + ": 'volunteer' must be true or false");
    a.volunteer = v->get<bool>();
  }
  return a;
}

Result<MarketClient> MarketClient::connect(const std::string& coordinator_url, std::string token,
                                           const CoordinatorAccess& access, std::chrono::milliseconds deadline) {
  ESSAIM_ASSIGN_OR_RETURN(net::HttpUrl url, net::parse_http_url(coordinator_url));
  ESSAIM_RETURN_IF_ERROR(net::check_plain_http(url, access.insecure_http, "--coordinator"));
  url.ca_file = access.ca_file;
  if (token.empty() || token.find_first_of("\r\n ") != std::string::npos) {
    return Status::error("the coordinator token must be one non-empty word");
  }
  return MarketClient(std::move(url), std::move(token), deadline);
}

Result<std::string> MarketClient::call(const std::string& method, const std::string& target, std::string body) const {
  net::HttpCall c{.method = method, .target = target, .bearer = token_, .body = std::move(body), .headers = {},
                  .deadline = deadline_, .read_timeout = deadline_, .max_body_bytes = 8u << 20};
  ESSAIM_ASSIGN_OR_RETURN(net::HttpAnswer a, net::http_call(url_, c));
  if (a.status < 200 || a.status > 299) {
    std::string message;
    json j = json::parse(a.body, nullptr, false);
    if (!j.is_discarded() && j.is_object() && j.contains("error") && j["error"].is_object() &&
        j["error"].contains("message") && j["error"]["message"].is_string()) {
      message = j["error"]["message"].get<std::string>().substr(0, 300);
    }
    std::string text = method + " " + target + ": the coordinator answered " + std::to_string(a.status) +
                       (message.empty() ? "" : " (" + message + ")") + (a.status == 401 ? "; check --token" : "");
    // A 4xx other than a timeout or a rate limit is the coordinator refusing this request: asking again is no use.
    const bool refused = a.status >= 400 && a.status < 500 && a.status != 408 && a.status != 429;
    return refused ? Status::refusal(std::move(text)) : Status::error(std::move(text));
  }
  return std::move(a.body);
}

Result<Catalogue> MarketClient::model() const {
  ESSAIM_ASSIGN_OR_RETURN(std::string body, call("GET", "/api/model"));
  return parse_catalogue(body);
}

Result<CoverageAnswer> MarketClient::heartbeat(const Heartbeat& beat) const {
  json holdings = json::array();
  for (const Holding& h : beat.holdings) {
    json r = range_json(h.range);
    r["sha256"] = h.sha256;
    holdings.push_back(std::move(r));
  }
  json body = {{"node_id", beat.node_id}, {"address", beat.address}, {"fingerprint", fingerprint_json(beat.fingerprint)},
               {"holdings", std::move(holdings)}, {"capacity_bytes", beat.capacity_bytes}, {"load", beat.load}};
  if (beat.leaving) body["leaving"] = true;
  ESSAIM_ASSIGN_OR_RETURN(std::string answer, call("POST", "/api/expert-coverage", body.dump()));
  return parse_coverage_answer(answer);
}

Result<VolunteerAnswer> MarketClient::volunteer(const std::string& node_id, uint64_t budget_bytes,
                                                const std::vector<RangeRef>& holding) const {
  json held = json::array();
  for (const RangeRef& r : holding) held.push_back(range_json(r));
  json body = {{"node_id", node_id}, {"budget_bytes", budget_bytes}, {"holding", std::move(held)}};
  ESSAIM_ASSIGN_OR_RETURN(std::string answer, call("POST", "/api/expert-volunteer", body.dump()));
  return parse_volunteer_answer(answer);
}

Result<std::string> MarketClient::whoami_node_id() const {
  ESSAIM_ASSIGN_OR_RETURN(std::string body, call("GET", "/api/whoami"));
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body, "GET /api/whoami"));
  ESSAIM_ASSIGN_OR_RETURN(std::string id, get_string(j, "node_id", 128, "GET /api/whoami"));
  if (id.empty()) return Status::error("GET /api/whoami: empty node_id");
  return id;
}

Result<std::string> MarketClient::expert_map() const { return call("GET", "/api/expert-map"); }

Status MarketClient::report_usage(const std::vector<LayerUsage>& layers) const {
  json arr = json::array();
  for (const LayerUsage& l : layers) arr.push_back({{"layer", l.layer}, {"counts", l.counts}});
  return call("POST", "/api/expert-usage", json{{"layers", std::move(arr)}}.dump()).status();
}

Status MarketClient::report_work(const std::vector<WorkReport>& reports) const {
  json arr = json::array();
  for (const WorkReport& r : reports) {
    arr.push_back({{"address", r.address}, {"pairs_accepted", r.pairs_accepted}, {"audits", r.audits},
                   {"audits_failed", r.audits_failed}});
  }
  return call("POST", "/api/work", json{{"reports", std::move(arr)}}.dump()).status();
}

}  // namespace essaim::node
