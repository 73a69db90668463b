// Lean-wire benchmark (--expert-output bf16): what rounding expert outputs to bf16 saves on the wire and
// what it costs in accuracy, on synth models. For each model:
// - divergence, teacher-forced over a seeded token sequence: the monolithic f32 run is the reference; per
//   token, KL(p_f32 || p_bf16) of the next-token distributions (in double), its mean and max, the fraction of
//   tokens whose argmax agrees, and the largest |Δ logit|;
// - wire: the same tokens through `essaim-worker` processes on loopback in each mode (one token per call, as
//   decoding does); bytes received and sent per token per MoE layer, and the ratio bf16 / f32.
// The sharded logits must equal the monolithic logits of the same mode bit for bit, with no fallback, or the
// benchmark refuses to report. Prints one JSON document.
//
//   build/bench/lean_wire_bench --data-dir /tmp/essaim-bench                 # tiny qwen3moe + qwen35moe
//   build/bench/lean_wire_bench --data-dir /tmp/essaim-bench --q35-122b      # plus the 122B shapes, 2 layers
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "backbone/remote_executor.h"
#include "core/thread_pool.h"
#include "model/model.h"
#include "synth/synth.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;

struct Options {
  std::string data_dir = "bench-data";
  std::string worker_bin;
  int workers = 2;
  int tokens = 64;
  int threads = 2;
  bool big = false;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "lean_wire_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

struct ModelCase {
  std::string name;
  SynthArch arch;
  SynthPreset preset;
  std::optional<uint32_t> layers;
};

std::string ensure_model(const Options& o, const ModelCase& c) {
  const std::string path = o.data_dir + "/lean-" + c.name + "-q4_k_m.gguf";
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(o.data_dir);
  Result<SynthPlan> plan = synth_plan({.arch = c.arch, .preset = c.preset, .layers = c.layers,
                                       .types = SynthTypeMix::Q4_K_M, .seed = 1});
  if (!plan) die(plan.status().message());
  std::fprintf(stderr, "lean_wire_bench: writing %s\n", path.c_str());
  Result<SynthSummary> s = synth_write(*plan, path + ".part");
  if (!s) die(s.status().message());
  std::filesystem::rename(path + ".part", path);
  return path;
}

// Teacher-forced logits [n][V], one token per forward (decode-shaped calls).
std::vector<float> eval_logits(const Model& m, const std::vector<int32_t>& tokens, ExpertExecutor& ex,
                               ThreadPool& pool) {
  const size_t V = size_t(m.info().n_vocab);
  SequenceCache cache = m.new_cache({.n_ctx = int32_t(tokens.size()) + 2});
  std::vector<float> out(tokens.size() * V);
  for (size_t t = 0; t < tokens.size(); ++t) {
    const Status s = m.forward({.tokens = std::span<const int32_t>(&tokens[t], 1), .cache = &cache, .experts = &ex,
                                .pool = &pool, .logits_mode = LogitsMode::ALL,
                                .logits = std::span<float>(out).subspan(t * V, V)});
    if (!s) die(s.message());
  }
  return out;
}

std::vector<double> softmax(std::span<const float> l) {
  const double mx = *std::max_element(l.begin(), l.end());
  std::vector<double> p(l.size());
  double sum = 0;
  for (size_t i = 0; i < l.size(); ++i) sum += p[i] = std::exp(double(l[i]) - mx);
  for (double& v : p) v /= sum;
  return p;
}

json divergence(const std::vector<float>& ref, const std::vector<float>& got, size_t V) {
  const size_t n = ref.size() / V;
  double kl_sum = 0, kl_max = 0, max_abs = 0;
  size_t agree = 0;
  for (size_t t = 0; t < n; ++t) {
    std::span<const float> a(ref.data() + t * V, V), b(got.data() + t * V, V);
    const std::vector<double> p = softmax(a), q = softmax(b);
    double kl = 0;
    for (size_t i = 0; i < V; ++i)
      if (p[i] > 0) kl += p[i] * (std::log(p[i]) - std::log(std::max(q[i], 1e-300)));
    kl_sum += kl;
    kl_max = std::max(kl_max, kl);
    agree += (std::max_element(a.begin(), a.end()) - a.begin()) == (std::max_element(b.begin(), b.end()) - b.begin());
    for (size_t i = 0; i < V; ++i) max_abs = std::max(max_abs, std::fabs(double(a[i]) - double(b[i])));
  }
  return {{"tokens", n},
          {"mean_kl_nats_per_token", kl_sum / double(n)},
          {"max_kl_nats", kl_max},
          {"argmax_agreement", double(agree) / double(n)},
          {"max_abs_logit_diff", max_abs}};
}

json run_case(const Options& o, const ModelCase& c, ThreadPool& pool) {
  const std::string path = ensure_model(o, c);
  Result<std::unique_ptr<Model>> loaded = load_model(path);
  if (!loaded) die(loaded.status().message());
  const Model& m = **loaded;
  const size_t V = size_t(m.info().n_vocab);
  std::vector<int32_t> tokens(size_t(o.tokens));
  std::mt19937 rng(7);
  for (int32_t& t : tokens) t = int32_t(rng() % uint32_t(V));

  LocalExpertExecutor f32_local(m.expert_store(), &pool, ExpertOutput::F32);
  LocalExpertExecutor bf16_local(m.expert_store(), &pool, ExpertOutput::BF16);
  const std::vector<float> mono_f32 = eval_logits(m, tokens, f32_local, pool);
  const std::vector<float> mono_bf16 = eval_logits(m, tokens, bf16_local, pool);

  Result<std::vector<std::vector<std::string>>> slices = bench::ensure_slices(m, path, o.workers, o.data_dir);
  if (!slices) die(slices.status().message());
  std::vector<bench::WorkerProcess> procs;
  backbone::ExpertMap map;
  for (const auto& s : *slices) {
    Result<bench::WorkerProcess> w = bench::start_worker(o.worker_bin, 1, s);
    if (!w) die(w.status().message());
    procs.push_back(*w);
    map.workers.push_back({.address = w->address, .label = {}, .holdings = std::nullopt});
  }
  json wire = json::object();
  double received[2] = {0, 0};
  int moe_layers = 0;
  for (int32_t l = 0; l < m.expert_store().n_layers(); ++l) moe_layers += m.expert_store().ranges(l).empty() ? 0 : 1;
  for (ExpertOutput mode : {ExpertOutput::F32, ExpertOutput::BF16}) {
    backbone::DispatchOptions dopt;
    dopt.timeout = std::chrono::milliseconds(60000);
    dopt.link.connect_timeout = std::chrono::milliseconds(20000);
    dopt.expert_output = mode;
    Result<std::unique_ptr<backbone::RemoteExpertExecutor>> remote =
        backbone::remote_executor_for_model(m, map, &pool, dopt);
    if (!remote) die(remote.status().message());
    // The first handshake hashes the experts each worker claims (the weights check); with big experts that
    // can outlast a worker's handshake deadline, and the retry after the backoff finds the digests cached.
    for (int i = 0; i < 900 && (*remote)->connected() != size_t(o.workers); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    if ((*remote)->connected() != size_t(o.workers)) die("not every worker connected: " + (*remote)->stats().to_json());
    const std::vector<float> sharded = eval_logits(m, tokens, **remote, pool);
    const std::vector<float>& want = mode == ExpertOutput::BF16 ? mono_bf16 : mono_f32;
    if (std::memcmp(sharded.data(), want.data(), want.size() * sizeof(float)) != 0)
      die(std::string("sharded logits differ from monolithic in ") + std::string(expert_output_name(mode)));
    const backbone::DispatchStats s = (*remote)->stats();
    if (s.fallbacks() > 0) die("fallbacks during the benchmark: " + s.to_json());
    const double per = double(tokens.size()) * double(moe_layers);
    received[size_t(mode)] = double(s.bytes_received()) / per;
    wire[std::string(expert_output_name(mode))] = {{"bytes_received_per_token_per_layer", double(s.bytes_received()) / per},
                                                   {"bytes_sent_per_token_per_layer", double(s.bytes_sent()) / per},
                                                   {"requests_per_token_per_layer", double(s.requests) / per},
                                                   {"pairs_per_token_per_layer", double(s.pairs_remote) / per}};
  }
  bench::stop_workers(procs);
  wire["bytes_received_saved_per_token_per_layer"] = received[0] - received[1];
  wire["received_ratio_bf16_vs_f32"] = received[1] / received[0];
  return {{"model", c.name},
          {"n_embd", m.info().n_embd},
          {"n_expert_used", m.info().n_expert_used},
          {"moe_layers", moe_layers},
          {"sharded_equals_monolithic_bitwise", true},
          {"divergence_bf16_vs_f32", divergence(mono_f32, mono_bf16, V)},
          {"wire", wire}};
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  using namespace essaim;
  Options o;
  o.worker_bin = bench::default_worker_binary(argv[0]);
  CLI::App app{"lean wire: bf16 expert outputs vs f32, bytes and divergence"};
  app.add_option("--data-dir", o.data_dir, "Where the synth models and slices are written (reused)");
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary");
  app.add_option("--workers", o.workers, "Worker processes")->check(CLI::Range(1, 16));
  app.add_option("--tokens", o.tokens, "Teacher-forced tokens per model")->check(CLI::Range(2, 4096));
  app.add_option("--threads", o.threads, "Backbone threads");
  app.add_flag("--q35-122b", o.big, "Also the 122B-shaped qwen3moe stack (2 layers, ~3 GB file)");
  CLI11_PARSE(app, argc, argv);
  if (o.worker_bin.empty()) die("--worker-bin is required when the default path does not exist");
  ThreadPool pool(size_t(o.threads));
  std::vector<ModelCase> cases = {{"qwen3moe-tiny", SynthArch::QWEN3MOE, SynthPreset::TINY, 8u},
                                  {"qwen35moe-tiny", SynthArch::QWEN35MOE, SynthPreset::TINY, std::nullopt}};
  if (o.big) cases.push_back({"qwen3moe-q35-122b-2l", SynthArch::QWEN3MOE, SynthPreset::Q35_122B, 2u});
  json models = json::array();
  for (const ModelCase& c : cases) models.push_back(run_case(o, c, pool));
  const json doc = {{"benchmark", "lean_wire"},
                    {"cpu", cpu_name()},
                    {"workers", o.workers},
                    {"reference", "monolithic f32 (divergence); f32 expert outputs on the wire (bytes)"},
                    {"models", models}};
  std::printf("%s\n", doc.dump(2).c_str());
  return 0;
}
