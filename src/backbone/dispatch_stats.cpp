#include "backbone/dispatch_stats.h"

#include <cstdio>
#include <nlohmann/json.hpp>

namespace essaim::backbone {

std::string_view fallback_reason_name(FallbackReason r) {
  switch (r) {
    case FallbackReason::UNAVAILABLE: return "unavailable";
    case FallbackReason::TIMEOUT: return "timeout";
    case FallbackReason::DISCONNECTED: return "disconnected";
    case FallbackReason::PROTOCOL: return "protocol";
    case FallbackReason::ERROR_RESPONSE: return "error_response";
    case FallbackReason::BAD_RESPONSE: return "bad_response";
    case FallbackReason::AUDIT_MISMATCH: return "audit_mismatch";
    case FallbackReason::OVERLOADED: return "overloaded";
    case FallbackReason::TOO_LARGE: return "too_large";
    case FallbackReason::COUNT: break;
  }
  return "?";
}

uint64_t DispatchStats::bytes_sent() const {
  uint64_t n = 0;
  for (const LayerWire& l : layers) n += l.bytes_sent;
  return n;
}

uint64_t DispatchStats::bytes_received() const {
  uint64_t n = 0;
  for (const LayerWire& l : layers) n += l.bytes_received;
  return n;
}

uint64_t DispatchStats::fallbacks() const {
  uint64_t n = 0;
  for (uint64_t p : fallback_pairs) n += p;
  return n;
}

std::string DispatchStats::to_json() const {
  nlohmann::ordered_json j;
  j["layer_calls"] = layer_calls;
  j["pairs"] = pairs;
  j["pairs_remote"] = pairs_remote;
  j["pairs_local"] = pairs_local;
  j["pairs_fallback"] = pairs_fallback;
  j["pairs_cached"] = pairs_cached;
  j["calls_from_cache"] = calls_from_cache;
  j["requests"] = requests;
  j["responses"] = responses;
  j["audits"] = audits;
  j["hedges"] = hedges;
  j["hedge_wins"] = hedge_wins;
  j["pairs_retried"] = pairs_retried;
  j["calls_failed"] = calls_failed;
  nlohmann::ordered_json fr = nlohmann::ordered_json::object(), fp = nlohmann::ordered_json::object();
  for (size_t r = 0; r < kFallbackReasonCount; ++r) {
    fr[std::string(fallback_reason_name(FallbackReason(r)))] = fallback_requests[r];
    fp[std::string(fallback_reason_name(FallbackReason(r)))] = fallback_pairs[r];
  }
  j["fallback_requests"] = fr;
  j["fallback_pairs"] = fp;
  j["bytes_sent"] = bytes_sent();
  j["bytes_received"] = bytes_received();
  nlohmann::ordered_json ls = nlohmann::ordered_json::array();
  for (size_t i = 0; i < layers.size(); ++i) {
    if (layers[i].calls == 0) continue;
    ls.push_back({{"layer", i}, {"calls", layers[i].calls}, {"requests", layers[i].requests},
                  {"bytes_sent", layers[i].bytes_sent}, {"bytes_received", layers[i].bytes_received}});
  }
  j["layers"] = ls;
  nlohmann::ordered_json ws = nlohmann::ordered_json::array();
  for (const WorkerReport& w : workers)
    ws.push_back({{"address", w.address}, {"label", w.label}, {"connected", w.connected}, {"sessions", w.sessions},
                  {"requests", w.requests}, {"pairs_served", w.pairs_served}, {"failures", w.failures},
                  {"audits", w.audits}, {"audits_failed", w.audits_failed},
                  {"mean_round_trip_ms", w.mean_round_trip_ms},
                  {"last_error", w.last_error}});
  j["workers"] = ws;
  if (hot.enabled) {
    j["hot_cache"] = {{"budget_bytes", hot.budget_bytes}, {"bytes_held", hot.bytes_held},
                      {"experts_held", hot.experts_held}, {"hits", hot.hits}, {"fetches", hot.fetches},
                      {"fetch_bytes", hot.fetch_bytes}, {"refusals", hot.refusals},
                      {"fetch_failures", hot.fetch_failures}, {"evictions", hot.evictions},
                      {"last_refusal", hot.last_refusal}};
  }
  j["seconds"] = seconds;
  j["max_call_seconds"] = max_call_seconds;
  return j.dump();
}

std::string DispatchStats::to_text() const {
  char line[512];
  std::string t;
  std::snprintf(line, sizeof line,
                "dispatch: %llu layer calls, %llu (row, expert) pairs: %llu by workers, %llu local, %llu fallback%s\n",
                (unsigned long long)layer_calls, (unsigned long long)pairs, (unsigned long long)pairs_remote,
                (unsigned long long)pairs_local, (unsigned long long)pairs_fallback,
                hot.enabled ? (", " + std::to_string(pairs_cached) + " from the hot cache").c_str() : "");
  t += line;
  if (hot.enabled) {
    std::snprintf(line, sizeof line,
                  "dispatch: hot cache: %llu experts, %.1f of %.1f MiB held; %llu hits, %llu layer calls without a "
                  "round trip, %llu fetches (%.1f MiB), %llu refused, %llu failed, %llu evicted%s%s\n",
                  (unsigned long long)hot.experts_held, double(hot.bytes_held) / 1048576.0,
                  double(hot.budget_bytes) / 1048576.0, (unsigned long long)hot.hits,
                  (unsigned long long)calls_from_cache, (unsigned long long)hot.fetches,
                  double(hot.fetch_bytes) / 1048576.0, (unsigned long long)hot.refusals,
                  (unsigned long long)hot.fetch_failures, (unsigned long long)hot.evictions,
                  hot.last_refusal.empty() ? "" : "; last refusal: ", hot.last_refusal.c_str());
    t += line;
  }
  const double calls = layer_calls > 0 ? double(layer_calls) : 1.0;
  std::snprintf(line, sizeof line,
                "dispatch: %llu requests, %.1f KiB sent, %.1f KiB received (%.0f B per layer call), "
                "slowest layer call %.1f ms\n",
                (unsigned long long)requests, double(bytes_sent()) / 1024, double(bytes_received()) / 1024,
                double(bytes_sent() + bytes_received()) / calls, max_call_seconds * 1e3);
  t += line;
  if (fallbacks() > 0) {
    std::string reasons;
    for (size_t r = 0; r < kFallbackReasonCount; ++r)
      if (fallback_pairs[r] > 0)
        reasons += (reasons.empty() ? "" : ", ") + std::string(fallback_reason_name(FallbackReason(r))) + " " +
                   std::to_string(fallback_pairs[r]);
    t += "dispatch: fallback pairs by reason: " + reasons + "\n";
  }
  if (pairs_retried > 0 || calls_failed > 0) {
    std::snprintf(line, sizeof line, "dispatch: no local copy: %llu pairs served by another replica, %llu layer calls failed\n",
                  (unsigned long long)pairs_retried, (unsigned long long)calls_failed);
    t += line;
  }
  for (const WorkerReport& w : workers) {
    std::snprintf(line, sizeof line, "dispatch: worker %s%s%s: %s, %llu requests, %llu pairs served, %llu failed%s%s\n",
                  w.address.c_str(), w.label.empty() ? "" : " ", w.label.empty() ? "" : ("(" + w.label + ")").c_str(),
                  w.connected ? "up" : "down", (unsigned long long)w.requests, (unsigned long long)w.pairs_served,
                  (unsigned long long)w.failures, w.last_error.empty() ? "" : "; last error: ",
                  w.last_error.c_str());
    t += line;
  }
  return t;
}

}  // namespace essaim::backbone
