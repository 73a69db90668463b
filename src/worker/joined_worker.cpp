#include "worker/joined_worker.h"

#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "slice/expert_slice.h"
#include "slice/model_identity.h"
#include "node/market_client.h"
#include "node/slice_download.h"
#include "net/stream_server.h"
#include "net/tcp.h"
#include "relay/relay_client.h"
#include "worker/relay_serving.h"
#include "worker/worker_state.h"

namespace essaim::worker {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kLeavingDeadline{2000};

struct Held {
  node::SliceOffer offer;
  std::string path;
};

// Heartbeats from a thread of its own for as long as it lives, every `interval_s` (read afresh each time).
// A volunteer round downloads slices, one of 170 MB takes half a minute on a phone's link, and a node
// silent for 3 intervals is stale at the coordinator: its holdings and reservations would stop counting and
// its slices would be assigned again elsewhere (docs/scale.md measured a swarm that never settled so).
class HeartbeatsMeanwhile {
 public:
  HeartbeatsMeanwhile(std::function<void()> beat, const std::atomic<double>& interval_s)
      : thread_([this, beat = std::move(beat), &interval_s] {
          std::unique_lock lock(mu_);
          while (!cv_.wait_for(lock, std::chrono::duration<double>(interval_s.load()), [&] { return done_; })) {
            lock.unlock();
            beat();
            lock.lock();
          }
        }) {}
  ~HeartbeatsMeanwhile() {
    {
      std::lock_guard lock(mu_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  HeartbeatsMeanwhile(const HeartbeatsMeanwhile&) = delete;
  HeartbeatsMeanwhile& operator=(const HeartbeatsMeanwhile&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;  // guarded by mu_
  std::thread thread_;
};

// One served set: the state and the worker that serves it. Connections hold a shared_ptr for as long as
// they are served, so a replaced set lives on until its last connection closes.
// Heartbeats announce the current set's slices: a slice downloaded but not yet served is not announced
// (a backbone dialling on the strength of the map would find the worker without it).
struct ServedSet {
  ServedSet(WorkerState s, std::vector<Held> h) : state(std::move(s)), held(std::move(h)) {}
  WorkerState state;
  std::vector<Held> held;
  std::unique_ptr<Worker> worker;
};

class Joiner {
 public:
  explicit Joiner(const JoinConfig& c) : c_(c) {}

  void log(const std::string& line) const {
    if (!c_.quiet) std::fprintf(stderr, "essaim worker: %s\n", line.c_str());
  }

  // GET /api/whoami + /api/model, retried for a while: the coordinator may still be starting.
  Status introduce() {
    ESSAIM_ASSIGN_OR_RETURN(node::MarketClient client, node::MarketClient::connect(c_.coordinator, c_.token, c_.access));
    client_.emplace(std::move(client));
    Status last = Status::ok();
    for (int attempt = 0; attempt < 30; ++attempt) {
      if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
      Result<std::string> id = client_->whoami_node_id();
      if (!id) {
        last = id.status();
        if (last.permanent()) return last;  // a wrong token stays wrong, and so does a certificate
        continue;
      }
      Result<node::Catalogue> cat = client_->model();
      if (!cat) {
        last = cat.status();
        continue;
      }
      node_id_ = *id;
      catalogue_ = std::move(*cat);
      fingerprint_ = {.model_identity = catalogue_.fingerprint.model_identity,
                      .protocol_version = proto::kProtocolVersion,
                      .kernel_abi = std::to_string(build_fingerprint().kernel_abi)};
      return Status::ok();
    }
    return last;
  }

  // A slice file is served only if its bytes hash to the catalogue's SHA-256, it opens as a slice of the
  // catalogue's model and its per-expert digests match.
  Status verify_slice(const Held& h) const {
    ESSAIM_ASSIGN_OR_RETURN(std::string sha, node::file_sha256_hex(h.path));
    if (sha != h.offer.sha256) return Status::error("SHA-256 " + sha + " is not the catalogue's");
    ESSAIM_ASSIGN_OR_RETURN(ExpertSlice slice, ExpertSlice::open(h.path));
    ESSAIM_RETURN_IF_ERROR(slice.verify_digests());
    Result<WorkerState> alone = WorkerState::open({h.path});
    if (!alone) return alone.status();
    if (digest_hex(alone->model()) != catalogue_.fingerprint.model_identity) {
      return Status::error("cut from model " + digest_hex(alone->model()) + ", not the catalogue's");
    }
    return Status::ok();
  }

  void scan_data_dir() {
    std::error_code ec;
    fs::create_directories(c_.data_dir, ec);
    for (const node::SliceOffer& o : catalogue_.slices) {
      const fs::path p = fs::path(c_.data_dir) / o.name;
      if (!fs::exists(p, ec)) continue;
      Held h{o, p.string()};
      if (Status st = verify_slice(h); !st) {
        log("removing " + o.name + ": " + st.message());
        fs::remove(p, ec);
        continue;
      }
      if (held_bytes() + o.bytes > c_.budget_bytes) {
        log("not serving " + o.name + " (over --budget-mb); kept on disk");
        continue;
      }
      held_.push_back(std::move(h));
      log("re-verified " + o.name);
    }
  }

  uint64_t held_bytes() const {
    uint64_t n = 0;
    for (const Held& h : held_) n += h.offer.bytes;
    return n;
  }

  // Builds the served set from held_ and makes it current; connections already open keep theirs.
  Status rebuild() {
    std::shared_ptr<ServedSet> next;
    if (!held_.empty()) {
      std::vector<std::string> paths;
      for (const Held& h : held_) paths.push_back(h.path);
      ESSAIM_ASSIGN_OR_RETURN(WorkerState state, WorkerState::open(paths));
      next = std::make_shared<ServedSet>(std::move(state), held_);
      next->worker = std::make_unique<Worker>(next->state, c_.worker);
    }
    std::lock_guard lock(served_mu_);
    served_ = std::move(next);
    return Status::ok();
  }

  std::shared_ptr<ServedSet> current() const {
    std::lock_guard lock(served_mu_);
    return served_;
  }

  void serve(net::ByteStream& s) const {
    std::shared_ptr<ServedSet> set = current();
    if (!set) return s.close();  // nothing to serve yet: the backbone retries later
    set->worker->serve_connection(s);
  }

  void refuse(net::ByteStream& s) const {
    if (std::shared_ptr<ServedSet> set = current()) return set->worker->refuse_over_capacity(s);
    s.close();
  }

  double load() {
    std::shared_ptr<ServedSet> set = current();
    const auto now = Clock::now();
    if (!set) return 0;
    const uint64_t ns = set->worker->stats().compute_ns;
    double l = 0;
    if (set.get() == load_set_ && now > load_at_) {
      const double wall = std::chrono::duration<double, std::nano>(now - load_at_).count();
      const double lanes = double(std::max<size_t>(1, c_.worker.lanes));
      l = std::clamp(double(ns - std::min(ns, load_ns_)) / (wall * lanes), 0.0, 1.0);
    }
    load_set_ = set.get();
    load_ns_ = ns;
    load_at_ = now;
    return l;
  }

  // Returns whether the coordinator says volunteering now would change something for this node. A leaving
  // heartbeat holds nothing: the coordinator forgets this node's ranges at once.
  bool heartbeat(bool leaving = false) {
    std::lock_guard lock(market_mu_);
    node::Heartbeat beat{.node_id = node_id_, .address = address_, .fingerprint = fingerprint_, .holdings = {},
                           .capacity_bytes = c_.budget_bytes, .load = load(), .leaving = leaving};
    if (std::shared_ptr<ServedSet> set = current(); set && !leaving) {
      for (const Held& h : set->held) beat.holdings.push_back({h.offer.range, h.offer.sha256});
    }
    // The leaving heartbeat must not hold up a stop for long when the coordinator is unreachable.
    Result<node::MarketClient> quick = leaving ? node::MarketClient::connect(c_.coordinator, c_.token, c_.access, kLeavingDeadline)
                                                 : Result<node::MarketClient>(Status::error("not leaving"));
    Result<node::CoverageAnswer> a = quick ? quick->heartbeat(beat) : client_->heartbeat(beat);
    if (!a) {
      log("heartbeat: " + a.status().message());
      return false;
    }
    heartbeat_s_ = a->heartbeat_s;
    if (!a->fingerprint_ok && !warned_fingerprint_) {
      log("the coordinator says this build's fingerprint does not match the model's: no work will be assigned");
      warned_fingerprint_ = true;
    }
    return a->volunteer;
  }

  bool has_room() const {
    const uint64_t used = held_bytes();
    for (const node::SliceOffer& o : catalogue_.slices) {
      const bool held = std::any_of(held_.begin(), held_.end(), [&](const Held& h) { return h.offer.name == o.name; });
      if (!held && used + o.bytes <= c_.budget_bytes) return true;
    }
    return false;
  }

  bool holds(const node::RangeRef& r) const {
    return std::any_of(held_.begin(), held_.end(), [&](const Held& h) { return h.offer.range == r; });
  }

  void forget(const node::RangeRef& r, const std::string& why) {
    auto it = std::find_if(held_.begin(), held_.end(), [&](const Held& h) { return h.offer.range == r; });
    if (it == held_.end()) return;
    log("dropping " + it->offer.name + " (" + why + ")");
    std::error_code ec;
    fs::remove(it->path, ec);
    held_.erase(it);
  }

  // Downloads and verifies one offered slice into held_ if the result stays within `budget_bytes`. False when
  // it is already held, over the budget, not the catalogue's, or fails (logged).
  bool take(const node::SliceOffer& o, uint64_t budget_bytes) {
    const bool held = std::any_of(held_.begin(), held_.end(), [&](const Held& h) {
      return h.offer.name == o.name || h.offer.range == o.range;
    });
    if (held || held_bytes() + o.bytes > budget_bytes) return false;
    // The assignment must be a catalogue entry: a volunteer answer names nothing the catalogue lacks.
    const bool listed = std::any_of(catalogue_.slices.begin(), catalogue_.slices.end(), [&](const node::SliceOffer& c) {
      return c.name == o.name && c.sha256 == o.sha256 && c.bytes == o.bytes && c.range == o.range;
    });
    if (!listed) {
      log("ignoring assignment " + o.name + ": not in the catalogue as given");
      return false;
    }
    const auto t0 = Clock::now();
    Result<node::DownloadReport> r = node::download_slice(client_->url(), c_.token, o, c_.data_dir);
    if (!r) {
      log(r.status().message());
      return false;
    }
    Held h{o, r->path};
    if (Status st = verify_slice(h); !st) {
      log("refusing " + o.name + ": " + st.message());
      std::error_code ec;
      fs::remove(h.path, ec);
      return false;
    }
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    log("downloaded " + o.name + " (" + std::to_string(r->bytes_fetched) + " bytes in " + std::to_string(s) + " s)");
    held_.push_back(std::move(h));
    return true;
  }

  // Take first, serve both and say so, then give the old range up: its holders never dip for this move.
  // Meanwhile this node holds up to one slice over its budget.
  bool swap(const node::SwapOffer& s) {
    auto old = std::find_if(held_.begin(), held_.end(), [&](const Held& h) { return h.offer.range == s.give_up; });
    if (old == held_.end()) return false;
    if (!take(s.take, c_.budget_bytes + old->offer.bytes)) return false;
    if (Status st = rebuild(); !st) log("cannot serve the new set: " + st.message());
    heartbeat();
    forget(s.give_up, "swapped for " + s.take.name + ", a range with fewer holders");
    return true;
  }

  // One volunteer round: drops, downloads what fits, then swaps. Returns whether the held set changed.
  bool volunteer_round(const std::atomic<bool>& stop) {
    std::vector<node::RangeRef> holding;
    for (const Held& h : held_) holding.push_back(h.offer.range);
    Result<node::VolunteerAnswer> v = [&] {
      std::lock_guard lock(market_mu_);
      return client_->volunteer(node_id_, c_.budget_bytes, holding);
    }();
    if (!v) {
      log("volunteer: " + v.status().message());
      return false;
    }
    bool changed = false;
    for (const node::RangeRef& d : v->drop) {
      if (!holds(d)) continue;
      forget(d, "no longer scarce");
      changed = true;
    }
    for (const node::SliceOffer& o : v->assign) {
      if (stop) break;
      changed |= take(o, c_.budget_bytes);
    }
    for (const node::SwapOffer& s : v->swap) {
      if (stop) break;
      changed |= swap(s);
    }
    return changed;
  }

  // The port backbones dial, or the relay they reach this node through; sets address_ (what heartbeats
  // say) and prints "listening on ..." (tests and scripts wait for it). Null: the reason was printed.
  std::unique_ptr<net::Acceptor> open_acceptor() {
    if (!c_.relay.empty()) return open_relay();
    net::NetResult<std::pair<std::string, uint16_t>> where = net::parse_host_port(c_.listen);
    if (!where) {
      std::fprintf(stderr, "essaim worker: --listen %s: %s\n", c_.listen.c_str(), where.error().message.c_str());
      return nullptr;
    }
    auto listener = net::TcpListener::listen(where->first, where->second);
    if (!listener) {
      std::fprintf(stderr, "essaim worker: cannot listen on %s: %s\n", c_.listen.c_str(), listener.error().message.c_str());
      return nullptr;
    }
    const uint16_t port = (*listener)->port();
    address_ = !c_.advertise.empty() ? c_.advertise
                                     : (where->first.find(':') != std::string::npos ? "[" + where->first + "]" : where->first) +
                                           ":" + std::to_string(port);
    std::printf("listening on %s:%u\n", where->first.c_str(), unsigned(port));
    std::fflush(stdout);
    return std::move(*listener);
  }

  // Registered at the relay under this node's token; the build it announces is the catalogue's model with
  // this build's protocol and kernels (what backbones of the same model present).
  std::unique_ptr<net::Acceptor> open_relay() {
    std::optional<Sha256Digest> model = digest_from_hex(catalogue_.fingerprint.model_identity);
    if (!model) {
      std::fprintf(stderr, "essaim worker: the catalogue's model identity is not 64 hex digits\n");
      return nullptr;
    }
    RelayConfig rc{.relay = c_.relay, .token = c_.token,
                   .build = {.model = *model, .protocol_version = proto::kProtocolVersion,
                             .kernel_abi = build_fingerprint().kernel_abi},
                   .ca_file = c_.relay_ca_file, .idle_connections = c_.relay_idle,
                   .log = [this](const std::string& line) { log(line); }};
    Result<RelayServing> serving = serve_through_relay(rc, refusal_);
    if (!serving) {
      std::fprintf(stderr, "essaim worker: %s\n", serving.status().message().c_str());
      return nullptr;
    }
    relay_ = serving->acceptor.get();
    address_ = serving->where + "/node/" + node_id_;
    std::printf("listening on %s\n", serving->where.c_str());
    std::fflush(stdout);
    return std::move(serving->acceptor);
  }

  // Behind a relay that cannot be reached, this node is away: its heartbeat holds nothing (as a leaving
  // one), so its ranges go scarce at once and backbones stop dialling it, until it is registered again.
  bool away() const { return relay_ != nullptr && !relay_->reachable(); }

  // Heartbeats, and volunteers when there is something to gain, until `stop`.
  void market_loop(const std::atomic<bool>& stop, std::mutex& mu, std::condition_variable& cv) {
    int rounds = 0;
    bool volunteer_now = true, was_away = false;
    while (!stop) {
      const bool now_away = away();
      if (now_away != was_away) log(now_away ? "the relay is unreachable: marked away at the coordinator" : "registered at the relay again");
      was_away = now_away;
      const bool told = heartbeat(/*leaving=*/now_away);
      if (!now_away && (volunteer_now || told || has_room() || rounds % 5 == 4)) {
        // After a change, at once again: the new holdings are heartbeaten, and volunteering with them
        // replaces this node's pending reservation (which counts as a holder for other volunteers). While
        // the rounds download, heartbeats go on from another thread.
        HeartbeatsMeanwhile meanwhile([this] { heartbeat(); }, heartbeat_s_);
        for (int again = 0; again < 4 && volunteer_round(stop); ++again) {
          if (Status st = rebuild(); !st) log("cannot serve the new set: " + st.message());
          log("serving " + std::to_string(held_.size()) + " slice(s), " + std::to_string(held_bytes()) + " bytes");
          heartbeat();
        }
        volunteer_now = false;
      }
      ++rounds;
      std::unique_lock lock(mu);
      // Away, the relay is watched more often than the coordinator's interval: the way back is quick.
      const double wait_s = now_away ? std::min(heartbeat_s_.load(), 0.5) : heartbeat_s_.load();
      cv.wait_for(lock, std::chrono::duration<double>(wait_s), [&] { return stop.load(); });
    }
  }

  int run(sigset_t stop_signals) {
    if (Status st = introduce(); !st) {
      std::fprintf(stderr, "essaim worker: --coordinator %s: %s\n", c_.coordinator.c_str(), st.message().c_str());
      return 1;
    }
    log("node " + node_id_ + ", model " + catalogue_.fingerprint.model_identity + " (" + catalogue_.architecture + "), " +
        std::to_string(catalogue_.slices.size()) + " slices in the catalogue");
    scan_data_dir();
    if (Status st = rebuild(); !st) {
      std::fprintf(stderr, "essaim worker: %s\n", st.message().c_str());
      return 1;
    }
    std::unique_ptr<net::Acceptor> acceptor = open_acceptor();
    if (!acceptor) return 1;
    net::StreamServer server(std::move(acceptor), [this](net::ByteStream& s) { serve(s); },
                             {.on_refused = [this](net::ByteStream& s) { refuse(s); }});
    std::atomic<bool> stop{false};
    std::mutex mu;
    std::condition_variable cv;
    std::thread market_thread([&] { market_loop(stop, mu, cv); });
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    const std::string refused = refusal_->why();
    if (refused.empty()) std::fprintf(stderr, "essaim worker: %s, stopping\n", signal_number == SIGINT ? "SIGINT" : "SIGTERM");
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    cv.notify_all();
    market_thread.join();
    // Leaving, said before the port closes: this node's ranges go scarce at once (not after 3 silent
    // heartbeats), and the connections still open are served until the server stops.
    heartbeat(/*leaving=*/true);
    log("told the coordinator this node is leaving");
    server.stop();
    if (!refused.empty()) {
      std::fprintf(stderr, "essaim worker: %s; stopping\n", refused.c_str());
      return 1;
    }
    if (std::shared_ptr<ServedSet> set = current()) {
      std::fprintf(stderr, "essaim worker: stats %s\n", set->worker->stats().to_json().c_str());
    }
    return 0;
  }

 private:
  const JoinConfig& c_;
  std::optional<node::MarketClient> client_;
  std::string node_id_, address_;
  node::Catalogue catalogue_;
  node::Fingerprint fingerprint_;
  std::vector<Held> held_;  // the market thread's; heartbeats announce the served set's copy
  // One call on client_ at a time (the heartbeats meanwhile share it with the volunteer rounds), and the
  // load figures.
  std::mutex market_mu_;
  std::atomic<double> heartbeat_s_ = 2;
  bool warned_fingerprint_ = false;
  mutable std::mutex served_mu_;
  std::shared_ptr<ServedSet> served_;
  relay::RelayAcceptor* relay_ = nullptr;  // behind a relay: the server's acceptor (it outlives the market thread)
  std::shared_ptr<RelayRefusal> refusal_ = std::make_shared<RelayRefusal>();  // set if the relay refused our token
  const ServedSet* load_set_ = nullptr;
  uint64_t load_ns_ = 0;
  Clock::time_point load_at_{};
};

}  // namespace

int run_joined_worker(const JoinConfig& config, sigset_t stop_signals) {
  Joiner j(config);
  return j.run(stop_signals);
}

}  // namespace essaim::worker
