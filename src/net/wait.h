// Condition-variable wait with a Deadline that may be kNoDeadline (internal to net/).
//
//   std::unique_lock lock(mu);
//   if (!wait_until_deadline(cv, lock, deadline, [&] { return ready; })) return timeout_error();
#pragma once

#include <condition_variable>
#include <mutex>

#include "net/byte_stream.h"

namespace essaim::net {

// wait_until with time_point::max() overflows inside some standard libraries; kNoDeadline waits plainly.
template <typename Pred>
bool wait_until_deadline(std::condition_variable& cv, std::unique_lock<std::mutex>& lock, Deadline deadline,
                         Pred pred) {
  if (deadline == kNoDeadline) {
    cv.wait(lock, pred);
    return true;
  }
  return cv.wait_until(lock, deadline, pred);
}

}  // namespace essaim::net
