#include "decode_steps.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>

#include "batch_decode.h"
#include "median.h"

namespace essaim::bench {

double load_average() {
  std::ifstream in("/proc/loadavg");
  double l = 0;
  in >> l;
  return l;
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

Result<std::string> ensure_q35_122b_model(const std::string& data_dir, uint32_t layers, const std::string& who) {
  return ensure_synth_model(data_dir, "q35-122b", layers, who);
}

Result<DecodeRun> decode_steps(const Model& m, const std::vector<int32_t>& prompt, int n, ExpertExecutor& experts,
                               const backbone::RemoteExpertExecutor* remote, ThreadPool& pool,
                               const std::vector<WorkerProcess>& procs) {
  using Clock = std::chrono::steady_clock;
  DecodeRun r;
  std::vector<float> logits(size_t(m.info().n_vocab));
  SequenceCache cache = m.new_cache({.n_ctx = int32_t(prompt.size()) + n + 1});
  ESSAIM_RETURN_IF_ERROR(m.forward({.tokens = prompt, .cache = &cache, .experts = &experts, .pool = &pool,
                                    .logits_mode = LogitsMode::LAST, .logits = logits}));
  if (remote) r.before = remote->stats();
  const double cpu0 = self_cpu_seconds(), wcpu0 = workers_cpu_seconds(procs);
  for (int i = 0; i < n; ++i) {
    const int32_t next = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    r.tokens.push_back(next);
    const auto t0 = Clock::now();
    ESSAIM_RETURN_IF_ERROR(m.forward({.tokens = std::span<const int32_t>(&next, 1), .cache = &cache, .experts = &experts,
                                      .pool = &pool, .logits_mode = LogitsMode::LAST, .logits = logits}));
    r.token_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  r.backbone_cpu_s = self_cpu_seconds() - cpu0;
  r.workers_cpu_s = workers_cpu_seconds(procs) - wcpu0;
  if (remote) r.after = remote->stats();
  return r;
}

}  // namespace essaim::bench
