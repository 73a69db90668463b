#include "sim/scenario.h"

#include "sim/cost_model.h"

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

namespace essaim::sim {

using json = nlohmann::json;

std::vector<DeviceClass> default_classes() {
  // Stated, not measured: a mid-range phone (4 GB, NEON at about half a desktop core), a laptop (a few cores
  // free), a GPU box (a consumer GPU at ~30 cores' worth of Q4_K expert throughput). Online times: phones
  // come and go over hours, laptops over a working day, GPU boxes stay.
  return {
      {.name = "phone", .share = 0.6, .budget_bytes = 1536ll << 20, .speed = 0.5, .uplink_mbps = 10,
       .downlink_mbps = 40, .rtt_ms = 40, .online_hours = 3, .offline_hours = 3, .kill_share = 0.6},
      {.name = "laptop", .share = 0.35, .budget_bytes = 6144ll << 20, .speed = 2, .uplink_mbps = 20,
       .downlink_mbps = 100, .rtt_ms = 20, .online_hours = 8, .offline_hours = 8, .kill_share = 0.3},
      {.name = "gpu", .share = 0.05, .budget_bytes = 20480ll << 20, .speed = 30, .uplink_mbps = 100,
       .downlink_mbps = 500, .rtt_ms = 10, .online_hours = 0, .offline_hours = 1, .kill_share = 0},
  };
}

namespace {

// One field of an object: its name and how to read it (an error names the field).
using Reader = std::function<Status(const json&)>;

Reader number(double& out, double lo, double hi) {
  return [&out, lo, hi](const json& v) -> Status {
    if (!v.is_number()) return Status::error("must be a number");
    const double x = v.get<double>();
    if (!std::isfinite(x) || x < lo || x > hi)
      return Status::error("must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out = x;
    return Status::ok();
  };
}
Reader integer(int64_t& out, int64_t lo, int64_t hi) {
  return [&out, lo, hi](const json& v) -> Status {
    if (!v.is_number_integer()) return Status::error("must be an integer");
    const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX) ? INT64_MAX : v.get<int64_t>();
    if (x < lo || x > hi) return Status::error("must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    out = x;
    return Status::ok();
  };
}
Reader boolean(bool& out) {
  return [&out](const json& v) -> Status {
    if (!v.is_boolean()) return Status::error("must be true or false");
    out = v.get<bool>();
    return Status::ok();
  };
}

Status read_object(const json& o, const std::map<std::string, Reader>& fields, const std::string& where) {
  if (!o.is_object()) return Status::error(where + " must be a JSON object");
  for (const auto& [key, value] : o.items()) {
    auto it = fields.find(key);
    if (it == fields.end()) return Status::error(where + ": unknown field \"" + key + "\"");
    if (Status st = it->second(value); !st) return Status::error(where + "." + key + ": " + st.message());
  }
  return Status::ok();
}

Status read_class(const json& o, DeviceClass& c, const std::string& where) {
  c = {};
  double budget_mb = double(c.budget_bytes >> 20);
  const std::map<std::string, Reader> fields = {
      {"name", [&c](const json& v) -> Status {
         if (!v.is_string() || v.get<std::string>().empty() || v.get<std::string>().size() > 32)
           return Status::error("must be a string of 1 to 32 characters");
         c.name = v.get<std::string>();
         return Status::ok();
       }},
      {"share", number(c.share, 0, 1)},
      {"budget_mb", number(budget_mb, 1, 1 << 24)},
      {"speed", number(c.speed, 1e-3, 1e4)},
      {"uplink_mbps", number(c.uplink_mbps, 0.01, 1e6)},
      {"downlink_mbps", number(c.downlink_mbps, 0.01, 1e6)},
      {"bandwidth_sigma", number(c.bandwidth_sigma, 0, 3)},
      {"rtt_ms", number(c.rtt_ms, 0, 10000)},
      {"rtt_sigma", number(c.rtt_sigma, 0, 3)},
      {"online_hours", number(c.online_hours, 0, 1e4)},
      {"offline_hours", number(c.offline_hours, 1e-3, 1e4)},
      {"kill_share", number(c.kill_share, 0, 1)},
  };
  ESSAIM_RETURN_IF_ERROR(read_object(o, fields, where));
  c.budget_bytes = int64_t(budget_mb * double(1 << 20));
  return Status::ok();
}

std::map<std::string, Reader> scenario_fields(Scenario& s, double& hot_cache_mb) {
  return {
      {"workers", integer(s.workers, 1, 1'000'000)},
      {"backbones", integer(s.backbones, 1, 1024)},
      {"hours", number(s.hours, 1e-4, 24 * 365)},
      {"seed", [&s](const json& v) -> Status {
         if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<int64_t>() >= 0))
           return Status::error("must be a non-negative integer");
         s.seed = v.get<uint64_t>();
         return Status::ok();
       }},
      {"replicas", integer(s.replicas, 1, 1000)},
      {"experts_per_slice", integer(s.experts_per_slice, 1, 256)},
      {"heartbeat_s", integer(s.heartbeat_s, 1, 3600)},
      {"sequences", integer(s.sequences, 1, 4096)},
      {"probe_steps", integer(s.probe_steps, 1, 1'000'000)},
      {"probe_every_s", number(s.probe_every_s, 0, 1e6)},
      {"warmup_s", number(s.warmup_s, 0, 1e6)},
      {"backbone_layer_ms", number(s.backbone_layer_ms, 0, 1e4)},
      {"backbone_row_us", number(s.backbone_row_us, 0, 1e6)},
      {"backbone_mbps", number(s.backbone_mbps, 0.01, 1e7)},
      {"backbone_rtt_ms", number(s.backbone_rtt_ms, 0, 1e4)},
      {"backbone_speed", number(s.backbone_speed, 1e-3, 1e5)},
      {"backbone_copy", boolean(s.backbone_copy)},
      {"slice_server_mbps", number(s.slice_server_mbps, 0, 1e9)},
      {"hot_cache_mb", number(hot_cache_mb, 0, 1 << 24)},
      {"bf16_wire", boolean(s.bf16_wire)},
      {"deadline_ms", number(s.deadline_ms, 1, 1e6)},
      {"hedge", boolean(s.hedge)},
      {"nearest", boolean(s.nearest)},
      {"audit", boolean(s.audit)},
      {"map_refresh_s", number(s.map_refresh_s, 0.01, 1e5)},
      {"heartbeat_while_downloading", boolean(s.heartbeat_while_downloading)},
      {"idle_pool", boolean(s.idle_pool)},
      {"diurnal", boolean(s.diurnal)},
      {"coverage_every_s", number(s.coverage_every_s, 1, 1e6)},
      {"model_file", [&s](const json& v) -> Status {
         if (!v.is_string() || v.get<std::string>().size() > 4096) return Status::error("must be a path of at most 4096 characters");
         s.model_file = v.get<std::string>();
         return Status::ok();
       }},
      {"expert_cost", [&s](const json& v) -> Status {
         ESSAIM_RETURN_IF_ERROR(CostModel::from_json(v.dump()).status());
         s.expert_cost_json = v.dump();
         return Status::ok();
       }},
      {"routing", [&s](const json& v) -> Status {
         if (!v.is_string() || (v.get<std::string>() != "measured" && v.get<std::string>() != "uniform"))
           return Status::error("must be \"measured\" or \"uniform\"");
         s.uniform_routing = v.get<std::string>() == "uniform";
         return Status::ok();
       }},
      {"fixed_placement", boolean(s.fixed_placement)},
      {"shared_host_cores", integer(s.shared_host_cores, 0, 1024)},
  };
}

}  // namespace

Result<Scenario> parse_scenario(std::string_view json_text) {
  const json doc = json::parse(json_text.begin(), json_text.end(), nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) return Status::error("the scenario is not valid JSON");
  if (!doc.is_object()) return Status::error("the scenario must be a JSON object");
  Scenario s;
  double hot_cache_mb = 0;
  std::map<std::string, Reader> fields = scenario_fields(s, hot_cache_mb);
  fields["classes"] = [&s](const json& v) -> Status {
    if (!v.is_array() || v.empty() || v.size() > 16) return Status::error("must be an array of 1 to 16 classes");
    s.classes.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) ESSAIM_RETURN_IF_ERROR(read_class(v[i], s.classes[i], "[" + std::to_string(i) + "]"));
    return Status::ok();
  };
  ESSAIM_RETURN_IF_ERROR(read_object(doc, fields, "scenario"));
  s.hot_cache_bytes = int64_t(hot_cache_mb * double(1 << 20));
  if (s.classes.empty()) s.classes = default_classes();
  double shares = 0;
  for (const DeviceClass& c : s.classes) shares += c.share;
  if (shares <= 0) return Status::error("scenario.classes: the shares add up to 0");
  return s;
}

std::string scenario_json(const Scenario& s) {
  json classes = json::array();
  for (const DeviceClass& c : s.classes) {
    classes.push_back({{"name", c.name}, {"share", c.share}, {"budget_mb", double(c.budget_bytes) / double(1 << 20)},
                       {"speed", c.speed}, {"uplink_mbps", c.uplink_mbps}, {"downlink_mbps", c.downlink_mbps},
                       {"bandwidth_sigma", c.bandwidth_sigma}, {"rtt_ms", c.rtt_ms}, {"rtt_sigma", c.rtt_sigma},
                       {"online_hours", c.online_hours}, {"offline_hours", c.offline_hours},
                       {"kill_share", c.kill_share}});
  }
  const json j = {{"workers", s.workers}, {"backbones", s.backbones}, {"hours", s.hours}, {"seed", s.seed},
                  {"replicas", s.replicas}, {"experts_per_slice", s.experts_per_slice},
                  {"heartbeat_s", s.heartbeat_s}, {"sequences", s.sequences}, {"probe_steps", s.probe_steps},
                  {"probe_every_s", s.probe_every_s}, {"warmup_s", s.warmup_s},
                  {"backbone_layer_ms", s.backbone_layer_ms}, {"backbone_row_us", s.backbone_row_us},
                  {"backbone_mbps", s.backbone_mbps}, {"backbone_rtt_ms", s.backbone_rtt_ms},
                  {"backbone_speed", s.backbone_speed}, {"backbone_copy", s.backbone_copy},
                  {"slice_server_mbps", s.slice_server_mbps},
                  {"hot_cache_mb", double(s.hot_cache_bytes) / double(1 << 20)}, {"bf16_wire", s.bf16_wire},
                  {"deadline_ms", s.deadline_ms}, {"hedge", s.hedge}, {"nearest", s.nearest}, {"audit", s.audit},
                  {"map_refresh_s", s.map_refresh_s},
                  {"heartbeat_while_downloading", s.heartbeat_while_downloading}, {"idle_pool", s.idle_pool},
                  {"diurnal", s.diurnal},
                  {"coverage_every_s", s.coverage_every_s}, {"classes", classes},
                  {"model_file", s.model_file}, {"routing", s.uniform_routing ? "uniform" : "measured"},
                  {"fixed_placement", s.fixed_placement}, {"shared_host_cores", s.shared_host_cores}};
  json out = j;
  if (!s.expert_cost_json.empty()) out["expert_cost"] = json::parse(s.expert_cost_json);
  return out.dump();
}

}  // namespace essaim::sim
