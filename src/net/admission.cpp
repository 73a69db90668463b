#include "net/admission.h"

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace essaim::net {

Admission::Admission(AdmissionLimits limits, Log log) : limits_(limits), log_(std::move(log)) {}

Admission::~Admission() { ESSAIM_CHECK(unauthenticated_.empty() && counters_.live_authenticated == 0); }

void Admission::log_locked(const std::string& line) {
  if (!log_) return;
  const auto now = std::chrono::steady_clock::now();
  if (last_log_ != std::chrono::steady_clock::time_point{} && now - last_log_ < limits_.log_interval) {
    ++suppressed_;
    return;
  }
  last_log_ = now;
  std::string text = line;
  if (suppressed_ != 0) text += " (" + std::to_string(suppressed_) + " more refusals since the last such line)";
  suppressed_ = 0;
  log_(text);
}

void Admission::forget_address_locked(const std::string& address) {
  auto it = addresses_.find(address);
  if (it != addresses_.end() && it->second.unauthenticated == 0 && it->second.authenticated == 0) addresses_.erase(it);
}

void Admission::evict_locked(Ticket* t, const std::string& why, uint64_t& counter) {
  unauthenticated_.erase(t->pos_);
  t->evicted_ = true;
  --counters_.live_unauthenticated;
  --addresses_[t->address_].unauthenticated;
  ++counter;
  log_locked("evicted an unauthenticated connection from " + t->address_ + ": " + why);
  if (t->on_evict_) t->on_evict_(why);
}

std::unique_ptr<Admission::Ticket> Admission::admit(const std::string& address, Evict on_evict) {
  std::unique_ptr<Ticket> t(new Ticket(this, address));
  t->on_evict_ = std::move(on_evict);
  std::lock_guard lock(mu_);
  PerAddress& mine = addresses_[address];
  if (mine.unauthenticated >= limits_.max_unauthenticated_per_address && mine.unauthenticated > 0) {
    for (Ticket* old : unauthenticated_) {
      if (old->address_ != address) continue;
      evict_locked(old,
                   std::to_string(limits_.max_unauthenticated_per_address) +
                       " connections from this address were still in their handshake; the oldest made room",
                   counters_.evicted_address_full);
      break;
    }
  } else if (unauthenticated_.size() >= limits_.max_unauthenticated && !unauthenticated_.empty()) {
    evict_locked(unauthenticated_.front(),
                 std::to_string(limits_.max_unauthenticated) +
                     " connections were still in their handshake; the oldest made room",
                 counters_.evicted_unauthenticated_full);
  }
  t->pos_ = unauthenticated_.insert(unauthenticated_.end(), t.get());
  ++addresses_[address].unauthenticated;
  ++counters_.live_unauthenticated;
  ++counters_.admitted;
  return t;
}

std::optional<std::string> Admission::Ticket::authenticate() {
  Admission& a = *a_;
  std::lock_guard lock(a.mu_);
  if (authenticated_) return std::nullopt;
  if (evicted_) {
    ++a.counters_.refused_evicted;
    return "this connection was evicted to make room for newer ones before its handshake completed";
  }
  PerAddress& mine = a.addresses_[address_];
  std::optional<std::string> no;
  if (mine.authenticated >= a.limits_.max_authenticated_per_address) {
    ++a.counters_.refused_address_full;
    no = std::to_string(mine.authenticated) + " connections from " + address_ + " are already served (limit " +
         std::to_string(a.limits_.max_authenticated_per_address) + " per address)";
  } else if (a.counters_.live_authenticated >= a.limits_.max_authenticated) {
    ++a.counters_.refused_authenticated_full;
    no = std::to_string(a.counters_.live_authenticated) + " connections are already served (limit " +
         std::to_string(a.limits_.max_authenticated) + ")";
  }
  if (no) {
    a.log_locked("refused " + address_ + ": " + *no);
    return no;
  }
  a.unauthenticated_.erase(pos_);
  --mine.unauthenticated;
  ++mine.authenticated;
  --a.counters_.live_unauthenticated;
  ++a.counters_.live_authenticated;
  ++a.counters_.authenticated;
  authenticated_ = true;
  return std::nullopt;
}

bool Admission::Ticket::evicted() const {
  std::lock_guard lock(a_->mu_);
  return evicted_;
}

Admission::Ticket::~Ticket() {
  Admission& a = *a_;
  std::lock_guard lock(a.mu_);
  if (authenticated_) {
    --a.addresses_[address_].authenticated;
    --a.counters_.live_authenticated;
  } else if (!evicted_) {
    a.unauthenticated_.erase(pos_);
    --a.addresses_[address_].unauthenticated;
    --a.counters_.live_unauthenticated;
  }
  a.forget_address_locked(address_);
}

void Admission::note_refused(const std::string& address, const std::string& why) {
  std::lock_guard lock(mu_);
  ++counters_.refused_by_server;
  log_locked("refused " + address + ": " + why);
}

AdmissionCounters Admission::counters() const {
  std::lock_guard lock(mu_);
  return counters_;
}

std::string AdmissionCounters::to_json() const {
  nlohmann::ordered_json j;
  j["admitted"] = admitted;
  j["authenticated"] = authenticated;
  j["evicted_address_full"] = evicted_address_full;
  j["evicted_unauthenticated_full"] = evicted_unauthenticated_full;
  j["refused_authenticated_full"] = refused_authenticated_full;
  j["refused_address_full"] = refused_address_full;
  j["refused_evicted"] = refused_evicted;
  j["refused_by_server"] = refused_by_server;
  j["live_unauthenticated"] = live_unauthenticated;
  j["live_authenticated"] = live_authenticated;
  return j.dump();
}

std::string AdmissionCounters::to_prometheus(const std::string& prefix) const {
  const std::string p = prefix + "_admission_";
  std::string out;
  auto line = [&](const std::string& name, const char* labels, uint64_t v) {
    out += p + name + labels + " " + std::to_string(v) + "\n";
  };
  out += "# TYPE " + p + "admitted_total counter\n";
  line("admitted_total", "", admitted);
  out += "# TYPE " + p + "authenticated_total counter\n";
  line("authenticated_total", "", authenticated);
  out += "# TYPE " + p + "refused_total counter\n";
  line("refused_total", "{reason=\"evicted_address_full\"}", evicted_address_full);
  line("refused_total", "{reason=\"evicted_unauthenticated_full\"}", evicted_unauthenticated_full);
  line("refused_total", "{reason=\"authenticated_full\"}", refused_authenticated_full);
  line("refused_total", "{reason=\"address_full\"}", refused_address_full);
  line("refused_total", "{reason=\"server\"}", refused_by_server);
  out += "# TYPE " + p + "live gauge\n";
  line("live", "{state=\"unauthenticated\"}", live_unauthenticated);
  line("live", "{state=\"authenticated\"}", live_authenticated);
  return out;
}

}  // namespace essaim::net
