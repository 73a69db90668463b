// The serving benchmark, through HTTP: `essaim serve` started as a real process on loopback and driven by
// concurrent streaming clients (bench/support/sse_load.h) — Poisson arrivals, mixed prompt and output
// lengths, a shared system prompt (bench/support/serve_workload.h) — at each parallelism N (the server's
// slots and the clients' connections), against llama-server on the same GGUF file with the same threads,
// the same requests and the same arrival times, runs interleaved; then essaim over worker processes behind
// an injected round trip (essaim only). Prints one JSON document (stdout) and a table (stderr): generated
// tok/s, time to first token and inter-token latency p50/p99, medians over the repeats, and the ratio to
// llama-server. docs/serving-performance.md has the figures and the commands.
//
//   build/bench/serve_bench                                          # 122B-shaped qwen3moe, 2 layers (synth)
//   eval "$(../shared/tools/llama-cpp-reference --env)"             # LLAMA_SERVER: the reference, if built
//   build/bench/serve_bench --model models/kjv-moe-q4_k_m.gguf --llama-arg=--no-repack --workers 4
//
// Every essaim run must give each request the text of the first monolithic run (greedy, ignore_eos: the
// same lengths on both servers), with no fallback over workers, or the benchmark refuses to report.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "net/http_client.h"
#include "median.h"
#include "model/model.h"
#include "serve_workload.h"
#include "server_process.h"
#include "synth/synth.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;

struct Options {
  std::string model;
  std::string data_dir = "bench-data";
  std::string arch = "qwen3moe";
  uint32_t layers = 2;
  std::string essaim_bin, worker_bin, corpus;
  std::string llama_server;               // empty: essaim alone
  std::vector<std::string> llama_args;    // extra llama-server flags (--no-repack where llama.cpp's AMX path crashes)
  int threads = 2;
  std::vector<int> parallel = {1, 4, 16};
  int repeats = 3;
  int requests_per_slot = 3, min_requests = 6;
  double rate_per_slot = 0;               // requests/s per slot; 0: twice what one sequence alone completes
  bench::WorkloadOptions workload;
  int ctx = 1024;                         // per sequence
  int workers = 0;                        // > 0: also essaim over this many worker processes
  int worker_threads = 1;
  std::vector<int> rtt_ms = {0, 20};
};

// The servers and workers running now: die() stops them, so no failed run leaves a process behind.
std::vector<pid_t> g_children;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "serve_bench: %s\n", what.c_str());
  for (pid_t pid : g_children) ::kill(pid, SIGTERM);
  std::exit(1);
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

double load_average() {
  std::ifstream in("/proc/loadavg");
  double l = 0;
  in >> l;
  return l;
}

std::string ensure_model(const Options& o) {
  if (!o.model.empty()) return o.model;
  const bool q35 = o.arch == "qwen35moe";
  if (!q35 && o.arch != "qwen3moe") die("--arch is qwen3moe or qwen35moe");
  const std::string path = o.data_dir + "/" + o.arch + "-q35-122b-" + std::to_string(o.layers) + "l-q4_k_m.gguf";
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(o.data_dir);
  Result<SynthPlan> plan = synth_plan({.arch = q35 ? SynthArch::QWEN35MOE : SynthArch::QWEN3MOE,
                                       .preset = SynthPreset::Q35_122B, .layers = o.layers,
                                       .types = SynthTypeMix::Q4_K_M, .seed = 1});
  if (!plan) die(plan.status().message());
  std::fprintf(stderr, "serve_bench: writing %s\n", path.c_str());
  Result<SynthSummary> s = synth_write(*plan, path + ".part");
  if (!s) die(s.status().message());
  std::filesystem::rename(path + ".part", path);
  return path;
}

// Where a run goes: essaim alone, essaim over workers (at an injected RTT), or llama-server.
struct Target {
  std::string server;  // "essaim" or "llama-server"
  int rtt_ms = -1;     // >= 0: over the workers, through delay proxies of this RTT
  std::string label() const {
    return rtt_ms < 0 ? server : server + " (workers, " + std::to_string(rtt_ms) + " ms)";
  }
};

struct Bench {
  const Options& o;
  std::string model_path;
  std::string log_dir;
  std::vector<std::string> worker_addresses;  // of the current RTT's proxies

  std::vector<std::string> command(const Target& t, int n, uint16_t port) const {
    const std::string threads = std::to_string(o.threads);
    if (t.server == "llama-server") {
      std::vector<std::string> c = {o.llama_server, "-m", model_path, "--host", "127.0.0.1", "--port",
                                    std::to_string(port), "-np", std::to_string(n), "-c", std::to_string(o.ctx * n),
                                    "-t", threads, "-tb", threads};
      c.insert(c.end(), o.llama_args.begin(), o.llama_args.end());
      return c;
    }
    std::vector<std::string> c = {o.essaim_bin, "serve", "-m", model_path, "--host", "127.0.0.1", "--port",
                                  std::to_string(port), "--parallel", std::to_string(n), "-c", std::to_string(o.ctx),
                                  "-t", threads, "--no-access-log"};
    // essaim's prompt cache is on by default and ignores the request's cache_prompt: without --cache-prompt
    // neither server reuses a prefix, with it both do.
    if (!o.workload.cache_prompt) c.insert(c.end(), {"--cache-ram", "0"});
    if (t.rtt_ms >= 0) {
      for (const std::string& a : worker_addresses) c.insert(c.end(), {"--worker", a});
      c.insert(c.end(), {"--worker-timeout-ms", "60000"});
    }
    return c;
  }

  bench::ServerProcess start(const Target& t, int n) const {
    const uint16_t port = bench::free_loopback_port();
    const std::string log = log_dir + "/" + (t.server == "essaim" ? "essaim" : "llama-server") + ".log";
    // llama.cpp's OpenMP threads spin between parallel regions; on a shared machine they lose the CPU they
    // spin on and its decode collapses (llama-batched-bench tg 3.9 tok/s active, 22.9 passive, at load 10).
    // Passive waits are its best setting here, unless the caller chose.
    std::vector<std::string> env;
    if (t.server == "llama-server" && !std::getenv("OMP_WAIT_POLICY")) env.push_back("OMP_WAIT_POLICY=passive");
    Result<bench::ServerProcess> p = bench::start_server_process(command(t, n, port), port, log, env);
    if (!p) die(t.label() + ": " + p.status().message());
    g_children.push_back(p->pid);
    return *p;
  }
};

// essaim's /metrics: the value of the sample named `key` (name and labels, as written), or 0.
struct Metrics {
  std::string text;
  double get(const std::string& key) const {
    const size_t at = text.find("\n" + key + " ");
    return at == std::string::npos ? 0.0 : std::atof(text.c_str() + at + key.size() + 2);
  }
};
Metrics read_metrics(uint16_t port) {
  net::HttpCall call;
  call.target = "/metrics";
  Result<net::HttpAnswer> a = net::http_call({.host = "127.0.0.1", .port = port, .base_path = {}}, call);
  if (!a || a->status != 200) die("cannot read /metrics");
  return {a->body};
}
constexpr const char* kPhases[] = {"forward", "emit", "admit", "idle"};
// The step thread's seconds by phase between two readings of essaim's /metrics.
json scheduler_seconds(const Metrics& before, const Metrics& after) {
  json j;
  for (const char* phase : kPhases) {
    const std::string key = std::string("essaim_serve_scheduler_seconds_total{phase=\"") + phase + "\"}";
    j[phase] = after.get(key) - before.get(key);
  }
  return j;
}

struct Run {
  bench::RunFigures figures;
  double server_cpu_s = 0;  // the server process's CPU time over the run (workers' not included)
  json scheduler;           // essaim: the step thread's seconds by phase over the run
  std::vector<std::string> texts;
};

// One server at parallelism n: started, warmed up by one request alone (its duration returned through
// `warm_s`), the workload run with n client connections, stopped.
Run run_once(Bench& b, const Target& t, int n, const bench::Workload& w, double* warm_s) {
  bench::ServerProcess p = b.start(t, n);
  const bench::LoadOptions load{.host = "127.0.0.1", .port = p.port, .target = b.o.workload.chat ? "/v1/chat/completions" : "/v1/completions",
                                .max_in_flight = n, .timeout = std::chrono::milliseconds(600'000)};
  const std::vector<bench::LoadResult> warm = bench::run_streaming_load(load, std::span(w.requests).first(1));
  if (!warm[0].ok) die(t.label() + ": the warm-up request failed: " + warm[0].error);
  if (warm_s) *warm_s = warm[0].done_s - warm[0].sent_s;
  const bool essaim = t.server == "essaim";
  const Metrics before = essaim ? read_metrics(p.port) : Metrics{};
  const double cpu0 = bench::process_cpu_seconds(p.pid);
  const std::vector<bench::LoadResult> got = bench::run_streaming_load(load, w.requests);
  Run r{.figures = bench::summarize(got), .server_cpu_s = bench::process_cpu_seconds(p.pid) - cpu0, .scheduler = {},
        .texts = {}};
  if (essaim) {
    const Metrics after = read_metrics(p.port);
    r.scheduler = scheduler_seconds(before, after);
    if (t.rtt_ms >= 0 && after.get("essaim_dispatch_pairs_total{where=\"fallback\"}") > 0)
      die(t.label() + ": fallbacks during the run");
  }
  std::erase(g_children, p.pid);
  bench::stop_server_process(p);
  if (r.figures.failed > 0) die(t.label() + ", " + std::to_string(n) + " parallel: " + r.figures.first_error);
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].completion_tokens != w.max_tokens[i])
      die(t.label() + ": request " + std::to_string(i) + " generated " + std::to_string(got[i].completion_tokens) +
          " tokens, not " + std::to_string(w.max_tokens[i]));
    r.texts.push_back(got[i].text);
  }
  return r;
}

json figures_json(const Run& r) {
  const bench::RunFigures& f = r.figures;
  const double cpu_s = r.server_cpu_s;
  json j = {{"tokens_per_s", f.tokens_per_s}, {"ttft_ms_p50", f.ttft_ms_p50}, {"ttft_ms_p99", f.ttft_ms_p99},
          {"itl_ms_p50", f.itl_ms_p50}, {"itl_ms_p99", f.itl_ms_p99}, {"generated", f.generated},
          {"wall_s", f.wall_s}, {"prompt_tokens_mean", f.prompt_tokens_mean},
          {"tokens_per_event", f.tokens_per_event}, {"server_cpu_s", cpu_s},
          {"tokens_per_cpu_s", cpu_s > 0 ? double(f.generated) / cpu_s : 0.0}};
  for (const char* phase : kPhases)
    if (r.scheduler.contains(phase)) j[std::string("scheduler_") + phase + "_s"] = r.scheduler[phase];
  return j;
}

// Median of each figure over the runs of one (target, parallelism).
json medians(const json& runs) {
  json m;
  for (const auto& [k, v] : runs[0].items()) {
    std::vector<double> xs;
    for (const json& r : runs) xs.push_back(r[k].get<double>());
    m[k] = bench::median(xs);
  }
  return m;
}

}  // namespace
}  // namespace essaim

namespace essaim {
namespace {

struct Rows {
  std::map<std::string, std::map<int, json>> runs;  // [target label][parallelism] -> array of run figures
  std::map<int, std::vector<std::string>> reference_texts;  // essaim monolithic, first run, per parallelism
  std::map<int, std::vector<double>> ratios;        // per repeat: essaim tok/s / llama-server tok/s
  std::map<int, int> texts_equal_llama;             // requests whose llama-server text equals essaim's
};

void record(Rows& rows, const Target& t, int n, const Run& r) {
  json& runs = rows.runs[t.label()][n];
  if (runs.is_null()) runs = json::array();
  runs.push_back(figures_json(r));
  std::fprintf(stderr, "serve_bench: %-28s N=%-2d %7.1f tok/s  TTFT %6.0f/%6.0f ms  ITL %5.1f/%6.1f ms  (load %.1f)\n",
               t.label().c_str(), n, r.figures.tokens_per_s, r.figures.ttft_ms_p50, r.figures.ttft_ms_p99,
               r.figures.itl_ms_p50, r.figures.itl_ms_p99, load_average());
  if (t.server != "essaim") return;
  auto [ref, fresh] = rows.reference_texts.try_emplace(n, r.texts);
  if (fresh) return;
  for (size_t i = 0; i < r.texts.size(); ++i)
    if (r.texts[i] != ref->second[i])
      die(t.label() + ", " + std::to_string(n) + " parallel: request " + std::to_string(i) +
          " got another text than the first monolithic run");
}

bench::Workload workload_for(const Options& o, int n, double rate_per_slot) {
  bench::WorkloadOptions w = o.workload;
  w.requests = std::max(o.min_requests, o.requests_per_slot * n);
  w.rate_per_s = rate_per_slot * n;
  w.seed = o.workload.seed + uint32_t(n);
  return bench::make_workload(w);
}

// Monolithic essaim against llama-server, interleaved (which one goes first alternates between repeats).
void compare(Bench& b, Rows& rows, double& rate_per_slot) {
  const Options& o = b.o;
  const Target essaim{.server = "essaim", .rtt_ms = -1}, llama{.server = "llama-server", .rtt_ms = -1};
  for (int rep = 0; rep < o.repeats; ++rep)
    for (int n : o.parallel) {
      if (rate_per_slot <= 0) {  // twice what one sequence alone completes: the slots never wait for arrivals
        double warm_s = 0;
        run_once(b, essaim, 1, workload_for(o, 1, 1.0), &warm_s);
        rate_per_slot = 2.0 / warm_s;
      }
      const bench::Workload w = workload_for(o, n, rate_per_slot);
      std::vector<Target> order = {essaim};
      if (!o.llama_server.empty()) order.insert(rep % 2 ? order.begin() : order.end(), llama);
      std::map<std::string, Run> got;
      for (const Target& t : order) {
        got[t.server] = run_once(b, t, n, w, nullptr);
        record(rows, t, n, got[t.server]);
      }
      if (o.llama_server.empty()) continue;
      rows.ratios[n].push_back(got["essaim"].figures.tokens_per_s / got["llama-server"].figures.tokens_per_s);
      int equal = 0;
      for (size_t i = 0; i < w.requests.size(); ++i) equal += got["essaim"].texts[i] == got["llama-server"].texts[i];
      rows.texts_equal_llama[n] = equal;
    }
}

// essaim over worker processes, each behind a delay proxy of each RTT.
void over_workers(Bench& b, Rows& rows, double rate_per_slot) {
  const Options& o = b.o;
  Result<std::unique_ptr<Model>> m = load_model(b.model_path);
  if (!m) die(m.status().message());
  Result<std::vector<std::vector<std::string>>> slices = bench::ensure_slices(**m, b.model_path, o.workers, o.data_dir);
  if (!slices) die(slices.status().message());
  m->reset();
  std::vector<bench::WorkerProcess> procs;
  for (const auto& s : *slices) {
    Result<bench::WorkerProcess> w = bench::start_worker(o.worker_bin, o.worker_threads, s);
    if (!w) die(w.status().message());
    procs.push_back(*w);
    g_children.push_back(w->pid);
  }
  for (int rtt : o.rtt_ms) {
    Result<bench::DelayedWorkers> delayed = bench::behind_delay(procs, rtt);
    if (!delayed) die(delayed.status().message());
    b.worker_addresses.clear();
    for (const backbone::WorkerEndpoint& w : delayed->map.workers) b.worker_addresses.push_back(w.address);
    for (int rep = 0; rep < o.repeats; ++rep)
      for (int n : o.parallel) {
        const Target t{.server = "essaim", .rtt_ms = rtt};
        record(rows, t, n, run_once(b, t, n, workload_for(o, n, rate_per_slot), nullptr));
      }
  }
  bench::stop_workers(procs);
}

json report(const Options& o, const Bench& b, const Rows& rows, double rate_per_slot, double load_before) {
  json doc;
  doc["benchmark"] = "serve";
  doc["cpu"] = cpu_name();
  doc["model"] = b.model_path;
  doc["threads"] = o.threads;
  doc["endpoint"] = o.workload.chat ? "/v1/chat/completions" : "/v1/completions";
  doc["workload"] = {{"system_tokens", o.workload.system_tokens},
                     {"prompt_tokens", {o.workload.prompt_tokens_min, o.workload.prompt_tokens_max}},
                     {"max_tokens", {o.workload.output_min, o.workload.output_max}},
                     {"requests", std::to_string(o.requests_per_slot) + " per slot, at least " + std::to_string(o.min_requests)},
                     {"arrivals", "Poisson"}, {"rate_per_slot_per_s", rate_per_slot},
                     {"sampling", "greedy, ignore_eos"}, {"cache_prompt", o.workload.cache_prompt}};
  doc["repeats"] = o.repeats;
  doc["llama_server"] = o.llama_server.empty() ? json(nullptr) : json(o.llama_server);
  doc["llama_args"] = o.llama_args;
  doc["llama_env"] = std::getenv("OMP_WAIT_POLICY") ? std::string("OMP_WAIT_POLICY=") + std::getenv("OMP_WAIT_POLICY")
                                                    : std::string("OMP_WAIT_POLICY=passive");
  doc["load_average"] = {load_before, load_average()};
  json targets = json::array();
  for (const auto& [label, by_n] : rows.runs)
    for (const auto& [n, runs] : by_n)
      targets.push_back({{"target", label}, {"parallel", n}, {"runs", runs}, {"median", medians(runs)}});
  doc["rows"] = targets;
  if (o.llama_server.empty()) return doc;
  json cmp = json::array();
  bool met = true;
  for (int n : o.parallel) {
    const json e = medians(rows.runs.at("essaim").at(n)), l = medians(rows.runs.at("llama-server").at(n));
    const double ratio = e["tokens_per_s"].get<double>() / l["tokens_per_s"].get<double>();
    const bool no_worse = e["ttft_ms_p50"] <= l["ttft_ms_p50"] && e["ttft_ms_p99"] <= l["ttft_ms_p99"] &&
                          e["itl_ms_p50"] <= l["itl_ms_p50"] && e["itl_ms_p99"] <= l["itl_ms_p99"];
    met = met && ratio >= 1.2 && no_worse;
    cmp.push_back({{"parallel", n}, {"tokens_per_s_ratio", ratio},
                   {"tokens_per_s_ratio_per_repeat", rows.ratios.at(n)},
                   {"ttft_p50_ratio", e["ttft_ms_p50"].get<double>() / l["ttft_ms_p50"].get<double>()},
                   {"ttft_p99_ratio", e["ttft_ms_p99"].get<double>() / l["ttft_ms_p99"].get<double>()},
                   {"itl_p50_ratio", e["itl_ms_p50"].get<double>() / l["itl_ms_p50"].get<double>()},
                   {"itl_p99_ratio", e["itl_ms_p99"].get<double>() / l["itl_ms_p99"].get<double>()},
                   {"latencies_no_worse", no_worse},
                   {"texts_equal_to_essaim", rows.texts_equal_llama.at(n)}});
  }
  doc["vs_llama_server"] = cmp;
  doc["goal"] = {{"what", ">= 1.2x llama-server's tok/s at every parallelism, TTFT and ITL p50/p99 no worse"},
                 {"met", met}};
  return doc;
}

void print_table(const json& doc) {
  std::fprintf(stderr, "| server | N | tok/s | TTFT p50 ms | TTFT p99 ms | ITL p50 ms | ITL p99 ms | tok/CPU-s |\n");
  for (const json& r : doc["rows"]) {
    const json& m = r["median"];
    std::fprintf(stderr, "| %s | %d | %.1f | %.0f | %.0f | %.1f | %.1f | %.1f |\n", r["target"].get<std::string>().c_str(),
                 r["parallel"].get<int>(), m["tokens_per_s"].get<double>(), m["ttft_ms_p50"].get<double>(),
                 m["ttft_ms_p99"].get<double>(), m["itl_ms_p50"].get<double>(), m["itl_ms_p99"].get<double>(),
                 m["tokens_per_cpu_s"].get<double>());
  }
}

int run(Options& o) {
  if (o.essaim_bin.empty() || !std::filesystem::exists(o.essaim_bin)) die("--essaim-bin: no essaim binary");
  if (o.workers > 0 && o.worker_bin.empty()) die("--worker-bin: no essaim-worker binary");
  const std::vector<std::string> words = bench::corpus_words(o.corpus);
  if (words.size() < 1000) die("--corpus " + o.corpus + ": fewer than 1000 words");
  o.workload.corpus = words;
  Bench b{.o = o, .model_path = ensure_model(o), .log_dir = o.data_dir + "/serve_bench-logs", .worker_addresses = {}};
  Result<GgufFile> file = GgufFile::open(b.model_path);
  if (!file) die(file.status().message());
  Result<Vocab> vocab = vocab_from_gguf(*file);
  if (!vocab) die(vocab.status().message());
  Result<Tokenizer> tokenizer = Tokenizer::create(std::move(*vocab));
  if (!tokenizer) die(tokenizer.status().message());
  o.workload.count_tokens = [&](const std::string& text) { return tokenizer->encode(text, false).size(); };
  std::filesystem::create_directories(b.log_dir);
  if (o.llama_server.empty()) std::fprintf(stderr, "serve_bench: no llama-server (LLAMA_SERVER or --llama-server): essaim alone\n");
  const double load_before = load_average();
  double rate_per_slot = o.rate_per_slot;
  Rows rows;
  compare(b, rows, rate_per_slot);
  if (o.workers > 0) over_workers(b, rows, rate_per_slot);
  const json doc = report(o, b, rows, rate_per_slot, load_before);
  std::printf("%s\n", doc.dump(2).c_str());
  print_table(doc);
  return 0;
}

std::string beside_self(const char* argv0, const std::string& relative) {
  const std::filesystem::path p = std::filesystem::absolute(argv0).parent_path().parent_path() / relative;
  return std::filesystem::exists(p) ? p.string() : std::string();
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  o.essaim_bin = essaim::beside_self(argv[0], "src/cli/essaim");
  o.worker_bin = essaim::bench::default_worker_binary(argv[0]);
  o.corpus = std::string(ESSAIM_SOURCE_DIR) + "/models/heldout.txt";
  if (const char* s = std::getenv("LLAMA_SERVER")) o.llama_server = s;
  CLI::App app{"essaim serving benchmark through HTTP: essaim serve vs llama-server, streaming clients"};
  app.add_option("--model", o.model, "GGUF file (default: a 122B-shaped synth of --arch, written once)");
  app.add_option("--arch", o.arch, "Synth architecture when no --model: qwen3moe (default) or qwen35moe");
  app.add_option("--layers", o.layers, "Layers of the synth model (default 2)")->check(CLI::Range(1, 48));
  app.add_option("--data-dir", o.data_dir, "Synth model, slices and server logs (default ./bench-data)");
  app.add_option("--essaim-bin", o.essaim_bin, "essaim binary (default: <build>/src/cli/essaim)");
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: <build>/src/cli/essaim-worker)");
  app.add_option("--llama-server", o.llama_server, "llama-server binary (default: $LLAMA_SERVER; none: essaim alone)");
  app.add_option("--llama-arg", o.llama_args, "Extra llama-server argument (repeatable; e.g. --llama-arg=--no-repack)");
  app.add_option("--corpus", o.corpus, "Text the prompts are cut from (default: models/heldout.txt)");
  app.add_option("-t,--threads", o.threads, "Compute threads of both servers (default 2)")->check(CLI::Range(1, 256));
  app.add_option("--parallel", o.parallel, "Parallel sequences: server slots = client connections (default 1,4,16)")
      ->delimiter(',')->check(CLI::Range(1, 256));
  app.add_option("--repeats", o.repeats, "Runs of each (server, parallelism), interleaved (default 3)")->check(CLI::Range(1, 100));
  app.add_option("--requests-per-slot", o.requests_per_slot, "Requests per run = this x N, at least --min-requests (default 3)");
  app.add_option("--min-requests", o.min_requests, "Fewest requests per run (default 6)")->check(CLI::Range(1, 100000));
  app.add_option("--rate-per-slot", o.rate_per_slot, "Poisson arrival rate per slot, requests/s (default: twice one sequence's)");
  app.add_option("--system-tokens", o.workload.system_tokens, "Tokens of the shared system prompt (default 32)");
  app.add_option("--prompt-tokens-min", o.workload.prompt_tokens_min, "Fewest tokens of a request's own prompt (default 40)");
  app.add_option("--prompt-tokens-max", o.workload.prompt_tokens_max, "Most tokens of a request's own prompt (default 120)");
  app.add_option("--output-min", o.workload.output_min, "Fewest tokens generated per request (default 32)");
  app.add_option("--output-max", o.workload.output_max, "Most tokens generated per request (default 96)");
  app.add_flag("--chat", o.workload.chat, "/v1/chat/completions (system + user messages) instead of /v1/completions");
  app.add_flag("--cache-prompt", o.workload.cache_prompt, "Let both servers reuse cached prefixes (llama-server: cache_prompt: true; essaim: its --cache-ram default instead of --cache-ram 0)");
  app.add_option("-c,--ctx", o.ctx, "Context per sequence (default 1024)")->check(CLI::Range(64, 1 << 20));
  app.add_option("--workers", o.workers, "Also essaim over this many essaim-worker processes (default 0: not)")->check(CLI::Range(0, 64));
  app.add_option("--worker-threads", o.worker_threads, "Threads per worker (default 1)")->check(CLI::Range(1, 256));
  app.add_option("--rtt-ms", o.rtt_ms, "Injected round trips to the workers, ms (default 0,20)")->delimiter(',')->check(CLI::Range(0, 10000));
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
