#include "backbone/audit_policy.h"

#include <algorithm>

namespace essaim::backbone {

AuditPolicy::AuditPolicy(size_t workers, AuditOptions options) : options_(options), state_(workers) {
  options_.step = std::max<uint32_t>(1, options_.step);
  options_.max_interval = std::max<uint32_t>(1, options_.max_interval);
}

uint32_t AuditPolicy::interval(uint32_t clean, const AuditOptions& o) {
  const uint32_t doublings = clean / std::max<uint32_t>(1, o.step);
  if (doublings >= 31) return o.max_interval;
  return std::min<uint32_t>(o.max_interval, uint32_t(1) << doublings);
}

bool AuditPolicy::should_audit(size_t w) {
  if (options_.adaptive) {
    if (w >= state_.size()) return true;
    PerWorker& p = state_[w];
    if (++p.since_audit < interval(p.clean, options_)) return false;
    p.since_audit = 0;
    return true;
  }
  return options_.every > 0 && ++answers_ % options_.every == 0;
}

void AuditPolicy::record(size_t w, bool clean) {
  if (w >= state_.size()) return;
  if (clean) {
    ++state_[w].clean;
  } else {
    state_[w].dropped = true;
  }
}

}  // namespace essaim::backbone
