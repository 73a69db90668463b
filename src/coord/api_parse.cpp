#include "coord/api_parse.h"

#include <charconv>
#include <cmath>
#include <map>
#include <tuple>

#include <nlohmann/json.hpp>

#include "coord/validate.h"

namespace essaim::coord {
namespace {

using json = nlohmann::json;

Result<json> parse_object(std::string_view body) {
  json j = json::parse(body.begin(), body.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error("the body is not valid JSON");
  if (!j.is_object()) return Status::error("the body must be a JSON object");
  return j;
}

Result<int64_t> get_int(const json& o, const char* key, int64_t lo, int64_t hi) {
  auto it = o.find(key);
  if (it == o.end()) return Status::error(std::string("'") + key + "' is missing");
  if (!it->is_number_integer()) return Status::error(std::string("'") + key + "' must be an integer");
  int64_t v = 0;
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (u > uint64_t(INT64_MAX)) return Status::error(std::string("'") + key + "' is out of range");
    v = int64_t(u);
  } else {
    v = it->get<int64_t>();
  }
  if (v < lo || v > hi) {
    return Status::error(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

Result<std::string> get_string(const json& o, const char* key, size_t max_bytes) {
  auto it = o.find(key);
  if (it == o.end()) return Status::error(std::string("'") + key + "' is missing");
  if (!it->is_string()) return Status::error(std::string("'") + key + "' must be a string");
  const std::string& s = it->get_ref<const std::string&>();
  if (s.size() > max_bytes) return Status::error(std::string("'") + key + "' is longer than " + std::to_string(max_bytes) + " bytes");
  return s;
}

Result<std::string> get_node_id(const json& o) {
  ESSAIM_ASSIGN_OR_RETURN(std::string id, get_string(o, "node_id", 64));
  if (!node_id_valid(id)) return Status::error("'node_id' must be \"n-\" followed by 16 lowercase hex digits");
  return id;
}

Result<std::vector<RangeRef>> get_ranges(const json& o, const char* key, bool with_sha) {
  auto it = o.find(key);
  if (it == o.end()) return Status::error(std::string("'") + key + "' is missing");
  if (!it->is_array()) return Status::error(std::string("'") + key + "' must be an array");
  if (it->size() > kMaxHoldings) return Status::error(std::string("'") + key + "' has more than " + std::to_string(kMaxHoldings) + " entries");
  std::vector<RangeRef> out;
  out.reserve(it->size());
  // A node holds a range once: a list repeating one is refused, not counted once, so what the answer says
  // was accepted is what the node holds (and a heartbeat cannot make the store rewrite one row 8,000 times).
  std::map<std::tuple<int64_t, int64_t, int64_t>, size_t> seen;
  for (size_t i = 0; i < it->size(); ++i) {
    const json& h = (*it)[i];
    const std::string where = std::string(key) + "[" + std::to_string(i) + "]";
    if (!h.is_object()) return Status::error(where + " must be an object");
    RangeRef r;
    Result<int64_t> layer = get_int(h, "layer", 0, kMaxLayer);
    if (!layer) return layer.status().with_context(where);
    r.layer = *layer;
    Result<int64_t> first = get_int(h, "expert_first", 0, kMaxExpert);
    if (!first) return first.status().with_context(where);
    Result<int64_t> count = get_int(h, "expert_count", 1, kMaxExpert + 1);
    if (!count) return count.status().with_context(where);
    if (!range_valid(r.layer, *first, *count)) return Status::error(where + ": the expert range is out of bounds");
    r.expert_first = *first;
    r.expert_count = *count;
    if (with_sha) {
      Result<std::string> sha = get_string(h, "sha256", 64);
      if (!sha) return sha.status().with_context(where);
      if (!is_hex(*sha, 64)) return Status::error(where + ": 'sha256' must be 64 lowercase hex digits");
      r.sha256 = *sha;
    }
    if (auto [at, fresh] = seen.try_emplace({r.layer, r.expert_first, r.expert_count}, i); !fresh) {
      return Status::error(where + " repeats " + key + "[" + std::to_string(at->second) + "] (layer " +
                           std::to_string(r.layer) + ", experts " + std::to_string(r.expert_first) + "-" +
                           std::to_string(r.expert_first + r.expert_count - 1) + "): list each range once");
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

Result<RegisterRequest> parse_register(std::string_view body) {
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body));
  RegisterRequest r;
  ESSAIM_ASSIGN_OR_RETURN(r.name, get_string(j, "name", kMaxNameBytes));
  if (!name_valid(r.name)) return Status::error("'name' must be 1 to 128 bytes without control characters");
  if (j.contains("role")) {
    ESSAIM_ASSIGN_OR_RETURN(r.role, get_string(j, "role", 16));
    if (!role_valid(r.role)) return Status::error("'role' must be \"worker\" or \"backbone\"");
  }
  return r;
}

Result<CoverageRequest> parse_coverage(std::string_view body) {
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body));
  CoverageRequest r;
  ESSAIM_ASSIGN_OR_RETURN(r.node_id, get_node_id(j));
  ESSAIM_ASSIGN_OR_RETURN(r.address, get_string(j, "address", kMaxAddressBytes));
  if (r.address.empty()) return Status::error("'address' is empty");
  for (unsigned char c : r.address) {
    if (c <= 0x20 || c >= 0x7f) return Status::error("'address' must be printable ASCII without spaces");
  }
  auto fp = j.find("fingerprint");
  if (fp == j.end() || !fp->is_object()) return Status::error("'fingerprint' must be an object");
  ESSAIM_ASSIGN_OR_RETURN(r.model_identity, get_string(*fp, "model_identity", 64));
  if (!is_hex(r.model_identity, 64)) return Status::error("'fingerprint.model_identity' must be 64 lowercase hex digits");
  ESSAIM_ASSIGN_OR_RETURN(r.protocol_version, get_int(*fp, "protocol_version", 0, 65535));
  // The worker's build reports its kernel ABI as a number (proto::BuildFingerprint); the catalogue as text.
  auto abi = fp->find("kernel_abi");
  if (abi != fp->end() && abi->is_number_integer()) {
    ESSAIM_ASSIGN_OR_RETURN(int64_t v, get_int(*fp, "kernel_abi", 0, INT32_MAX));
    r.kernel_abi = std::to_string(v);
  } else {
    ESSAIM_ASSIGN_OR_RETURN(r.kernel_abi, get_string(*fp, "kernel_abi", 64));
  }
  ESSAIM_ASSIGN_OR_RETURN(r.holdings, get_ranges(j, "holdings", true));
  ESSAIM_ASSIGN_OR_RETURN(r.capacity_bytes, get_int(j, "capacity_bytes", 0, INT64_MAX));
  auto load = j.find("load");
  if (load == j.end() || !load->is_number()) return Status::error("'load' must be a number");
  r.load = load->get<double>();
  if (!std::isfinite(r.load) || r.load < 0 || r.load > 1e6) return Status::error("'load' must be a finite number >= 0");
  if (auto leaving = j.find("leaving"); leaving != j.end()) {
    if (!leaving->is_boolean()) return Status::error("'leaving' must be true or false");
    r.leaving = leaving->get<bool>();
    if (r.leaving && !r.holdings.empty()) return Status::error("a leaving node holds nothing: 'holdings' must be empty");
  }
  return r;
}

Result<VolunteerRequest> parse_volunteer(std::string_view body) {
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body));
  VolunteerRequest r;
  ESSAIM_ASSIGN_OR_RETURN(r.node_id, get_node_id(j));
  ESSAIM_ASSIGN_OR_RETURN(r.budget_bytes, get_int(j, "budget_bytes", 0, INT64_MAX));
  if (j.contains("holding")) {
    r.has_holding = true;
    ESSAIM_ASSIGN_OR_RETURN(r.holding, get_ranges(j, "holding", false));
  }
  return r;
}

Result<std::vector<UsageLayer>> parse_usage(std::string_view body, int64_t n_experts) {
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body));
  auto layers = j.find("layers");
  if (layers == j.end() || !layers->is_array()) return Status::error("'layers' must be an array");
  if (layers->size() > size_t(kMaxLayer + 1)) return Status::error("'layers' has too many entries");
  std::vector<UsageLayer> out;
  for (size_t i = 0; i < layers->size(); ++i) {
    const json& l = (*layers)[i];
    const std::string where = "layers[" + std::to_string(i) + "]";
    if (!l.is_object()) return Status::error(where + " must be an object");
    UsageLayer u;
    Result<int64_t> layer = get_int(l, "layer", 0, kMaxLayer);
    if (!layer) return layer.status().with_context(where);
    u.layer = *layer;
    auto counts = l.find("counts");
    if (counts == l.end() || !counts->is_array()) return Status::error(where + ": 'counts' must be an array");
    if (int64_t(counts->size()) != n_experts) {
      return Status::error(where + ": 'counts' must have " + std::to_string(n_experts) + " entries (one per expert)");
    }
    u.counts.reserve(counts->size());
    for (const json& c : *counts) {
      if (!c.is_number_unsigned() && !(c.is_number_integer() && c.get<int64_t>() >= 0))
        return Status::error(where + ": every count must be a non-negative integer");
      const uint64_t v = c.get<uint64_t>();
      if (v > (uint64_t(1) << 40)) return Status::error(where + ": a count is larger than 2^40");
      u.counts.push_back(int64_t(v));
    }
    out.push_back(std::move(u));
  }
  return out;
}

Result<std::vector<WorkReport>> parse_work(std::string_view body) {
  ESSAIM_ASSIGN_OR_RETURN(json j, parse_object(body));
  auto reports = j.find("reports");
  if (reports == j.end() || !reports->is_array()) return Status::error("'reports' must be an array");
  if (reports->size() > 4096) return Status::error("'reports' has more than 4096 entries");
  std::vector<WorkReport> out;
  for (size_t i = 0; i < reports->size(); ++i) {
    const json& r = (*reports)[i];
    const std::string where = "reports[" + std::to_string(i) + "]";
    if (!r.is_object()) return Status::error(where + " must be an object");
    WorkReport w;
    Result<std::string> address = get_string(r, "address", kMaxAddressBytes);
    if (!address) return address.status().with_context(where);
    w.address = *address;
    constexpr int64_t kMaxCount = int64_t(1) << 40;  // per report: sums stay far from overflow
    for (auto [key, dst] : {std::pair{"pairs_accepted", &w.pairs_accepted}, std::pair{"audits", &w.audits},
                            std::pair{"audits_failed", &w.audits_failed}}) {
      Result<int64_t> v = get_int(r, key, 0, kMaxCount);
      if (!v) return v.status().with_context(where);
      *dst = *v;
    }
    if (w.audits_failed > w.audits) return Status::error(where + ": 'audits_failed' exceeds 'audits'");
    out.push_back(std::move(w));
  }
  return out;
}

ByteRange parse_range_header(std::string_view h, uint64_t total) {
  if (h.empty()) return {ByteRange::WHOLE, 0, 0};
  constexpr std::string_view kUnit = "bytes=";
  if (h.substr(0, kUnit.size()) != kUnit) return {ByteRange::MALFORMED, 0, 0};
  std::string_view spec = h.substr(kUnit.size());
  const size_t dash = spec.find('-');
  if (dash == std::string_view::npos || spec.find(',') != std::string_view::npos) return {ByteRange::MALFORMED, 0, 0};
  auto number = [](std::string_view s, uint64_t& v) {
    if (s.empty() || s.size() > 19) return false;
    auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
    return ec == std::errc() && p == s.data() + s.size();
  };
  const std::string_view a = spec.substr(0, dash), b = spec.substr(dash + 1);
  uint64_t first = 0, last = 0;
  if (a.empty()) {  // suffix: the last n bytes
    uint64_t n = 0;
    if (!number(b, n)) return {ByteRange::MALFORMED, 0, 0};
    if (n == 0 || total == 0) return {ByteRange::UNSATISFIABLE, 0, 0};
    return {ByteRange::PARTIAL, total - std::min(n, total), total - 1};
  }
  if (!number(a, first)) return {ByteRange::MALFORMED, 0, 0};
  if (b.empty()) {
    last = total == 0 ? 0 : total - 1;
  } else {
    if (!number(b, last)) return {ByteRange::MALFORMED, 0, 0};
    if (last < first) return {ByteRange::MALFORMED, 0, 0};
    if (total > 0) last = std::min(last, total - 1);
  }
  if (first >= total) return {ByteRange::UNSATISFIABLE, 0, 0};
  return {ByteRange::PARTIAL, first, last};
}

}  // namespace essaim::coord
