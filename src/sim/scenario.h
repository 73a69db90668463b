// What essaim-sim simulates (docs/scale.md): the swarm's size and device classes, the market's rules, the
// traffic and what the backbones do. A scenario is a JSON document (--scenario FILE); every field has a
// default, and the command line's --workers/--backbones/--hours/--seed override the file.
//
//   Result<Scenario> s = parse_scenario(R"({"workers": 300, "classes": [{"name": "phone", ...}]})");
//
// Untrusted input: unknown keys, wrong types and values out of range are refused with the field's name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace essaim::sim {

// One kind of device. Bandwidths and round trips are drawn per node from log-normal distributions around
// the medians; online and offline times from exponential distributions around the means.
struct DeviceClass {
  std::string name = "phone";
  double share = 1;                  // of the workers (normalised over the classes)
  int64_t budget_bytes = 1536ll << 20;  // what the node gives the market for experts
  double speed = 0.5;                // expert compute relative to one core of the calibrating machine
  double uplink_mbps = 10, downlink_mbps = 40;
  double bandwidth_sigma = 0.5;      // log-normal sigma of both bandwidths
  double rtt_ms = 40;                // round trip to the backbones' data centre, median
  double rtt_sigma = 0.4;
  double online_hours = 0;           // mean time online before leaving; 0: never leaves
  double offline_hours = 1;          // mean time away before coming back
  double kill_share = 0.5;           // of departures that are kill -9 (the rest leave gracefully)
};

struct Scenario {
  int64_t workers = 100;
  int64_t backbones = 1;
  double hours = 1;
  uint64_t seed = 1;
  // The market (coordinator).
  int64_t replicas = 2;            // wanted holders per range
  int64_t experts_per_slice = 32;  // `essaim slice --plan N`
  int64_t heartbeat_s = 10;
  // Traffic: every backbone decodes `sequences` sequences together, `probe_steps` steps every
  // `probe_every_s` seconds (bursts keep a 24-hour run affordable; 0 = back to back).
  int64_t sequences = 16;
  int64_t probe_steps = 4;
  double probe_every_s = 300;
  double warmup_s = 120;           // traffic starts after this (workers join, download, heartbeat)
  // The backbone: its dense path per layer and step, its link, its own expert compute (fallbacks, hot
  // cache) relative to one calibrating core, whether it holds every expert (the replica of last resort).
  double backbone_layer_ms = 0.5;
  double backbone_row_us = 20;
  double backbone_mbps = 1000;
  double backbone_rtt_ms = 2;
  double backbone_speed = 16;
  bool backbone_copy = true;
  // The slice server's link, shared by every download (0: no link of its own, as slices on a CDN: each
  // download is limited by the worker's downlink only).
  double slice_server_mbps = 10'000;
  int64_t hot_cache_bytes = 0;     // 0: no hot-expert cache
  bool bf16_wire = false;
  // Dispatch rules, as the backbone's flags.
  double deadline_ms = 2000;
  bool hedge = true;
  bool nearest = true;             // ReplicaPolicy::NEAREST (else FIRST)
  bool audit = true;               // adaptive audits
  double map_refresh_s = 1;
  // True: the worker heartbeats from its own thread while a volunteer round downloads (worker/joined_worker.cpp
  // does). False: the worker as it was, heartbeating from the thread that downloads, so a download longer
  // than 3 heartbeats made the node stale at the coordinator (docs/scale.md reproduces that finding).
  bool heartbeat_while_downloading = true;
  // Idle workers wait in the pool (sim_world.h IdlePool) rather than heartbeating to be told nothing: the
  // same run, cheaper (false: every idle worker polls; sim_run_test compares the two).
  bool idle_pool = true;
  bool diurnal = false;            // phones away more at night (offline times scaled by the hour)
  double coverage_every_s = 300;
  std::vector<DeviceClass> classes;  // empty: phone / laptop / GPU box (default_classes)
  // A small configuration that one machine also runs for real (the timing validation, docs/scale.md):
  // the model of a GGUF file instead of Qwen3.5-122B-A10B (its MoE layers, experts, top-k, widths and
  // expert bytes; opened when the run starts), expert costs measured for that model (an object as
  // data/expert_cost.json; empty: the compiled-in one), router picks drawn uniformly (a synth model's random
  // router) instead of the trained model's statistics, the bench harness's fixed placement (worker w holds
  // experts [w·X/N, (w+1)·X/N) of every layer from the start; no market rounds, no churn), and every
  // backbone's and worker's compute on one host of `shared_host_cores` cores, where a class's `speed` and
  // `backbone_speed` do not apply (0: each node computes on its own host).
  std::string model_file;
  std::string expert_cost_json;
  bool uniform_routing = false;
  bool fixed_placement = false;
  int64_t shared_host_cores = 0;
};

std::vector<DeviceClass> default_classes();
Result<Scenario> parse_scenario(std::string_view json_text);
// The scenario as JSON (every field, defaults filled in): the report carries it.
std::string scenario_json(const Scenario& s);

}  // namespace essaim::sim
