#include "worker/worker_stats.h"

#include <nlohmann/json.hpp>

namespace essaim::worker {

WorkerStats WorkerCounters::snapshot() const {
  auto get = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  WorkerStats s;
  s.connections = get(connections);
  s.handshakes_ok = get(handshakes_ok);
  s.handshakes_failed = get(handshakes_failed);
  for (size_t i = 0; i < kRefuseReasonCount; ++i) s.handshakes_refused[i] = get(handshakes_refused[i]);
  s.requests = get(requests);
  s.rows = get(rows);
  s.pairs = get(pairs);
  for (size_t i = 0; i < kErrorCodeCount; ++i) s.errors[i] = get(errors[i]);
  s.closed_on_protocol_error = get(closed_on_protocol_error);
  s.bytes_in = get(bytes_in);
  s.bytes_out = get(bytes_out);
  s.compute_ns = get(compute_ns);
  return s;
}

std::string WorkerStats::to_json() const {
  nlohmann::ordered_json j;
  j["connections"] = connections;
  j["handshakes_ok"] = handshakes_ok;
  j["handshakes_failed"] = handshakes_failed;
  nlohmann::ordered_json refused = nlohmann::ordered_json::object();
  for (size_t i = 1; i < kRefuseReasonCount; ++i)
    if (handshakes_refused[i] != 0)
      refused[std::string(proto::refuse_reason_name(proto::RefuseReason(i)))] = handshakes_refused[i];
  j["handshakes_refused"] = refused;
  j["requests"] = requests;
  j["rows"] = rows;
  j["pairs"] = pairs;
  nlohmann::ordered_json errs = nlohmann::ordered_json::object();
  for (size_t i = 1; i < kErrorCodeCount; ++i)
    if (errors[i] != 0) errs[std::string(proto::error_code_name(proto::ErrorCode(i)))] = errors[i];
  j["errors"] = errs;
  j["closed_on_protocol_error"] = closed_on_protocol_error;
  j["bytes_in"] = bytes_in;
  j["bytes_out"] = bytes_out;
  j["compute_seconds"] = double(compute_ns) * 1e-9;
  j["admission"] = nlohmann::ordered_json::parse(admission.to_json());
  return j.dump();
}

}  // namespace essaim::worker
