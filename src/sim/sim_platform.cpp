// The simulated platform: a star (every node's access links meet in the middle, the internet's core, with
// no bottleneck of its own): each node has an uplink and a downlink with its own bandwidth, and latency
// half its round trip, so a backbone-worker round trip is the sum of both nodes' round trips.
#include <cmath>

#include "sim/sim_world.h"

namespace essaim::sim {

namespace {

sg4::Host* add_host(sg4::NetZone* zone, const std::string& name, double speed, double up_mbps, double down_mbps,
                    double rtt_ms) {
  sg4::Host* h = zone->create_host(name, speed * kCoreFlops);
  const double latency = rtt_ms / 2 / 1000;
  sg4::Link* up = zone->create_link(name + "-up", up_mbps * 1e6 / 8)->set_latency(latency);
  sg4::Link* down = zone->create_link(name + "-down", down_mbps * 1e6 / 8)->set_latency(latency);
  zone->add_route(h->get_netpoint(), nullptr, nullptr, nullptr, {sg4::LinkInRoute(up)}, false);
  zone->add_route(nullptr, h->get_netpoint(), nullptr, nullptr, {sg4::LinkInRoute(down)}, false);
  return h;
}

double lognormal(std::mt19937_64& rng, double median, double sigma) {
  return sigma <= 0 ? median : median * std::exp(sigma * std::normal_distribution<double>(0, 1)(rng));
}

}  // namespace

void build_platform(World& w, std::mt19937_64& rng) {
  sg4::NetZone* zone = sg4::create_star_zone("swarm");
  const Scenario& s = w.sc;
  if (s.slice_server_mbps > 0) {
    w.slice_server = add_host(zone, "slices", 1, s.slice_server_mbps, s.slice_server_mbps, 2);
  } else {
    // No link of its own: a download shares only the worker's downlink (and no flow joins all downloads
    // into one max-min system, which is what costs time with thousands of them).
    w.slice_server = zone->create_host("slices", kCoreFlops);
    zone->add_route(w.slice_server->get_netpoint(), nullptr, nullptr, nullptr, {}, false);
    zone->add_route(nullptr, w.slice_server->get_netpoint(), nullptr, nullptr, {}, false);
  }
  if (s.shared_host_cores > 0) {
    // Not on the network: actors stay on their own hosts (their links) and run their compute here.
    w.shared_cpu = zone->create_host("machine", kCoreFlops)->set_core_count(int(s.shared_host_cores));
  }
  for (int64_t b = 0; b < s.backbones; ++b) {
    const std::string name = "backbone-" + std::to_string(b);
    w.backbones.push_back(add_host(zone, name, s.backbone_speed, s.backbone_mbps, s.backbone_mbps, s.backbone_rtt_ms));
    w.backbone_inbox.push_back(sg4::Mailbox::by_name(name));
  }
  double shares = 0;
  for (const DeviceClass& c : s.classes) shares += c.share;
  std::uniform_real_distribution<double> u(0, shares);
  for (int64_t i = 0; i < s.workers; ++i) {
    double x = u(rng);
    size_t cls = 0;
    while (cls + 1 < s.classes.size() && x >= s.classes[cls].share) x -= s.classes[cls++].share;
    const DeviceClass& c = s.classes[cls];
    char id[24];
    std::snprintf(id, sizeof id, "n-%016llx", static_cast<unsigned long long>(i + 1));
    WorkerNode n;
    n.id = id;
    n.device_class = cls;
    n.budget_bytes = c.budget_bytes;
    n.host = add_host(zone, n.id, c.speed, lognormal(rng, c.uplink_mbps, c.bandwidth_sigma),
                      lognormal(rng, c.downlink_mbps, c.bandwidth_sigma), lognormal(rng, c.rtt_ms, c.rtt_sigma));
    n.inbox = sg4::Mailbox::by_name(n.id);
    w.worker_index.emplace(n.id, w.workers.size());
    w.workers.push_back(std::move(n));
  }
  zone->seal();
}

}  // namespace essaim::sim
