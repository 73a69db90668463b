// Which remote answers the backbone re-computes from its replica and compares bit for bit (the audit), per
// worker. Adaptive, after BOINC's adaptive replication: a new worker has every answer audited; each
// `step` clean audits double the interval between audits, up to one answer in `max_interval`; one
// mismatch drops the worker from this dispatcher for good (its pairs are computed here; the market is told
// through POST /api/work). A fixed `every` (--worker-audit N) audits every Nth answer of the whole
// dispatcher instead, as before. Numbers: docs/dispatch.md "Audits".
//
//   AuditPolicy audit(n_workers, {.adaptive = true});
//   if (audit.should_audit(w)) { bool same = compare(); audit.record(w, same); }
//   if (audit.dropped(w)) route nothing to w;
//
// Not thread-safe: the dispatcher calls it under its one-call-at-a-time lock.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace essaim::backbone {

struct AuditOptions {
  uint32_t every = 0;         // fixed: every Nth answer (0 = off unless adaptive)
  bool adaptive = false;      // per-worker adaptive rate (wins over `every`)
  uint32_t step = 4;          // clean audits per doubling of the interval
  uint32_t max_interval = 64; // the long-run rate: one answer in 64 (1.6 %)
};

class AuditPolicy {
 public:
  AuditPolicy(size_t workers, AuditOptions options);
  bool enabled() const { return options_.adaptive || options_.every > 0; }
  // One accepted answer of worker w: audit it?
  bool should_audit(size_t w);
  void record(size_t w, bool clean);
  bool dropped(size_t w) const { return w < state_.size() && state_[w].dropped; }
  // The interval between audits of a worker with `clean` clean audits (adaptive mode).
  static uint32_t interval(uint32_t clean, const AuditOptions& o);

 private:
  struct PerWorker {
    uint32_t clean = 0;
    uint32_t since_audit = 0;
    bool dropped = false;
  };
  AuditOptions options_;
  std::vector<PerWorker> state_;
  uint64_t answers_ = 0;  // fixed mode: the dispatcher-wide count
};

}  // namespace essaim::backbone
