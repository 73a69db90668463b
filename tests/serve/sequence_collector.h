// Collects one scheduler sequence's events (the scheduler tests): its tokens, and how it ended; wait() blocks,
// bounded, until the final event.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "serve/scheduler.h"

namespace essaim::serve::testing {

struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<TokenId> tokens;
  bool done = false;
  FinishReason reason = FinishReason::NONE;
  std::string error;

  SequenceSink sink() {
    return [this](const SequenceEvent& e) {
      std::lock_guard<std::mutex> lock(mu);
      tokens.insert(tokens.end(), e.tokens.begin(), e.tokens.end());
      if (e.done) {
        done = true;
        reason = e.reason;
        error = e.error;
        cv.notify_all();
      }
    };
  }
  bool wait(std::chrono::milliseconds timeout = std::chrono::seconds(120)) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, timeout, [&] { return done; });
  }
};

}  // namespace essaim::serve::testing
