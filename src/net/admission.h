// Connection admission shared by every listener (the expert worker now; `essaim serve`, the coordinator and
// the relay as they come): per-source-address limits, connections that have not authenticated yet capped
// apart from those that have, and every refusal or eviction counted with its reason. Transport-agnostic:
// it sees an address string and a callback, so a thread-per-connection server and a Boost.Beast acceptor
// use it alike (docs/worker.md, "Admission").
//
//   net::Admission admission({.max_unauthenticated = 64, .max_unauthenticated_per_address = 16});
//   // on accept, before reading anything:
//   std::unique_ptr<Admission::Ticket> t = admission.admit(peer_address, [&](const std::string& why) {
//     tell_peer_non_blocking(why);  // e.g. a REFUSE BUSY or an HTTP 503; then close the connection
//   });
//   ... read the handshake / the request headers, within a short deadline and a small byte limit ...
//   if (std::optional<std::string> no = t->authenticate()) refuse(*no);   // authenticated caps full
//   ... serve; the ticket's destructor frees its slot ...
//   admission.counters().to_json();   // or .to_prometheus("essaim_worker") for a /metrics page
//
// The rule that lets no flood lock out a real peer: a new connection is always admitted. When its address
// already has max_unauthenticated_per_address connections still unauthenticated, or all addresses together
// have max_unauthenticated, the oldest unauthenticated connection (of that address, else of all) is
// evicted: its callback runs and it loses its slot. A real peer authenticates within one round trip, so it
// survives unless the attacker opens that many connections within that round trip; an attacker's idle
// connections never outlive the handshake deadline anyway. Authenticated connections are never evicted;
// past their own caps (per address and in all), authenticate() refuses with a reason.
//
// Eviction callbacks run on the admitting thread, under the admission lock: they must not block (write at
// most a few bytes without waiting, close), and the ticket's owner must keep whatever the callback touches
// alive until the ticket is destroyed (the destructor takes the same lock). Refusals are logged through
// `log` at most once per log_interval, with the number suppressed since.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

namespace essaim::net {

struct AdmissionLimits {
  size_t max_unauthenticated = 64;              // connections not yet authenticated, all addresses
  size_t max_unauthenticated_per_address = 16;  // of one source address
  size_t max_authenticated = 256;               // authenticated connections, all addresses
  size_t max_authenticated_per_address = 64;    // of one source address
  std::chrono::milliseconds log_interval{1000};  // at most one refusal line per interval
};

struct AdmissionCounters {
  uint64_t admitted = 0;                     // connections given a ticket
  uint64_t authenticated = 0;                // tickets that authenticated
  uint64_t evicted_address_full = 0;         // oldest unauthenticated of an address with too many
  uint64_t evicted_unauthenticated_full = 0; // oldest unauthenticated of all
  uint64_t refused_authenticated_full = 0;   // authenticate(): max_authenticated reached
  uint64_t refused_address_full = 0;         // authenticate(): max_authenticated_per_address reached
  uint64_t refused_evicted = 0;              // authenticate() on a ticket evicted meanwhile
  uint64_t refused_by_server = 0;            // counted by the server itself (note_refused), e.g. thread cap
  uint64_t live_unauthenticated = 0;         // now
  uint64_t live_authenticated = 0;           // now
  uint64_t refusals() const {
    return evicted_address_full + evicted_unauthenticated_full + refused_authenticated_full + refused_address_full +
           refused_by_server;
  }
  std::string to_json() const;
  // Prometheus text exposition, one counter or gauge per field: "<prefix>_admission_evicted_total{reason=...}".
  std::string to_prometheus(const std::string& prefix) const;
};

class Admission {
 public:
  using Evict = std::function<void(const std::string& why)>;
  using Log = std::function<void(const std::string& line)>;

  class Ticket {
   public:
    ~Ticket();  // frees the slot (takes the admission lock)
    Ticket(const Ticket&) = delete;
    Ticket& operator=(const Ticket&) = delete;
    // nullopt: authenticated, never evicted from now on. Otherwise why not (caps full, or already evicted).
    std::optional<std::string> authenticate();
    const std::string& address() const { return address_; }
    bool evicted() const;  // the eviction callback has run (or is running) for this ticket

   private:
    friend class Admission;
    Ticket(Admission* a, std::string address) : a_(a), address_(std::move(address)) {}
    Admission* a_;
    std::string address_;
    Evict on_evict_;
    bool authenticated_ = false;  // guarded by a_->mu_
    bool evicted_ = false;        // guarded by a_->mu_
    std::list<Ticket*>::iterator pos_;  // in a_->unauthenticated_ while neither flag is set
  };

  explicit Admission(AdmissionLimits limits = {}, Log log = {});
  ~Admission();  // every ticket must be gone
  Admission(const Admission&) = delete;
  Admission& operator=(const Admission&) = delete;

  // Never refuses; may evict an older unauthenticated connection to make room (see above).
  std::unique_ptr<Ticket> admit(const std::string& address, Evict on_evict);
  // A refusal the server made on its own (a thread cap, a malformed first byte): counted and logged here.
  void note_refused(const std::string& address, const std::string& why);

  AdmissionCounters counters() const;
  const AdmissionLimits& limits() const { return limits_; }

 private:
  struct PerAddress {
    size_t unauthenticated = 0;
    size_t authenticated = 0;
  };
  void evict_locked(Ticket* t, const std::string& why, uint64_t& counter);
  void log_locked(const std::string& line);
  void forget_address_locked(const std::string& address);

  const AdmissionLimits limits_;
  const Log log_;
  mutable std::mutex mu_;
  std::list<Ticket*> unauthenticated_;           // oldest first; guarded by mu_
  std::map<std::string, PerAddress> addresses_;  // guarded by mu_
  AdmissionCounters counters_;                   // guarded by mu_
  std::chrono::steady_clock::time_point last_log_{};  // guarded by mu_
  uint64_t suppressed_ = 0;                      // refusals not logged since last_log_; guarded by mu_
};

}  // namespace essaim::net
