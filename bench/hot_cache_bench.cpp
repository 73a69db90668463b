// Hot-expert cache benchmark: the share of (row, expert) pairs the backbone serves from its cache and the
// decode throughput gain over no cache, for synth models with a skewed router (`--router-skew`), at several
// cache sizes (a share of all expert bytes), with 4 `essaim-worker` processes behind an injected round trip
// (bench/support/delay_proxy.h). Prints one JSON document; the reference (cache 0) is measured in the same
// run for every (skew, sequences) pair.
//
//   build/bench/hot_cache_bench --data-dir /tmp/essaim-bench                 # skews 2,4,8; cache 0,5,10,25 %
//   build/bench/hot_cache_bench --skews 4 --cache-pct 0,25 --seqs 1 --decode 8
//
// How one point is measured: a fresh cache of the given budget; N sequences prefilled, then `warmup`
// greedy decode steps whose picks fill the window; one cache round (HotExpertCache::step: choose, fetch,
// verify — driven here rather than by the background thread so every point starts from the same cache);
// then `decode` timed steps. The cache reads the same slice files the workers serve, through the same
// SliceServerSource as `essaim run --expert-cache-mb`, with the file read in place of the coordinator's HTTP
// Range answer (the fetch is off the timed path either way). Every sequence's tokens must equal the
// monolithic ones, with no fallback, or the benchmark refuses to report.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "backbone/hot_expert_cache.h"
#include "backbone/remote_executor.h"
#include "backbone/slice_server_source.h"
#include "core/thread_pool.h"
#include "decode_steps.h"
#include "delay_proxy.h"
#include "slice/expert_digest.h"
#include "slice/expert_slice.h"
#include "model/model.h"
#include "synth/synth.h"
#include "text/tokenizer.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string data_dir = "bench-data";
  std::string worker_bin;
  uint32_t layers = 8;
  int workers = 4;
  int threads = 2;
  std::vector<double> skews = {2, 4, 8};
  std::vector<double> cache_pct = {0, 5, 10, 25};
  std::vector<int> seqs = {1, 4};
  int rtt_ms = 20;
  int prompt = 8;
  int warmup = 16;
  int decode = 16;
  std::string model_file;              // --model: a given file (the trained model) instead of synth models
  std::string text_file;               // --text: prompts cut from this text instead of random tokens
  std::vector<int32_t> text_tokens;    // the text, tokenised with the model's vocabulary
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "hot_cache_bench: %s\n", what.c_str());
  std::exit(1);
}

std::string cpu_name() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string ensure_model(const Options& o, double skew) {
  char name[128];
  std::snprintf(name, sizeof name, "/qwen3moe-tiny-%ul-skew%g-q4_k_m.gguf", o.layers, skew);
  const std::string path = o.data_dir + name;
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(o.data_dir);
  Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::TINY, .layers = o.layers,
                                       .types = SynthTypeMix::Q4_K_M, .seed = 1, .router_skew = float(skew)});
  if (!plan) die(plan.status().message());
  Result<SynthSummary> s = synth_write(*plan, path + ".part");
  if (!s) die(s.status().message());
  std::filesystem::rename(path + ".part", path);
  return path;
}

// N sequences (sequence i's prompt seeded by i): prefill, then warmup + decode greedy steps of all N at once.
// `between` runs after the warm-up steps; the last `decode` steps are timed.
struct Run {
  std::vector<std::vector<int32_t>> tokens;
  double timed_s = 0;
  backbone::DispatchStats before, after;
};
Run decode(const Model& m, const Options& o, int N, ExpertExecutor& ex, const backbone::RemoteExpertExecutor* remote,
           ThreadPool& pool, const std::function<void()>& between) {
  const size_t V = size_t(m.info().n_vocab);
  std::vector<SequenceCache> caches;
  std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(N));
  std::vector<std::vector<float>> logits(static_cast<size_t>(N), std::vector<float>(V));
  for (int i = 0; i < N; ++i) {
    caches.push_back(m.new_cache({.n_ctx = o.prompt + o.warmup + o.decode + 2}));
    std::mt19937 rng(uint32_t(1000 + i));
    for (int t = 0; t < o.prompt; ++t)
      prompts[size_t(i)].push_back(o.text_tokens.empty()
                                       ? int32_t(rng() % uint32_t(V))
                                       : o.text_tokens[(size_t(i) * 97 * size_t(o.prompt) + size_t(t)) %
                                                       o.text_tokens.size()]);
  }
  std::vector<BatchItem> items(static_cast<size_t>(N));
  for (int i = 0; i < N; ++i)
    items[size_t(i)] = {.tokens = prompts[size_t(i)], .cache = &caches[size_t(i)], .logits_mode = LogitsMode::LAST,
                        .logits = logits[size_t(i)]};
  if (Status s = m.forward_batch({.items = items, .experts = &ex, .pool = &pool}); !s) die(s.message());
  Run r;
  r.tokens.resize(size_t(N));
  std::vector<int32_t> next(static_cast<size_t>(N));
  Clock::time_point t0{};
  for (int step = 0; step < o.warmup + o.decode; ++step) {
    if (step == o.warmup) {
      if (between) between();
      if (remote) r.before = remote->stats();
      t0 = Clock::now();
    }
    for (int i = 0; i < N; ++i) {
      const std::vector<float>& l = logits[size_t(i)];
      next[size_t(i)] = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
      r.tokens[size_t(i)].push_back(next[size_t(i)]);
      items[size_t(i)].tokens = std::span<const int32_t>(&next[size_t(i)], 1);
    }
    if (Status s = m.forward_batch({.items = items, .experts = &ex, .pool = &pool}); !s) die(s.message());
  }
  r.timed_s = std::chrono::duration<double>(Clock::now() - t0).count();
  if (remote) r.after = remote->stats();
  return r;
}

std::vector<int32_t> tokenize_text(const Model& m, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) die("cannot open " + path);
  std::stringstream text;
  text << in.rdbuf();
  Result<Vocab> v = vocab_from_gguf(m.file());
  if (!v) die(v.status().message());
  Result<Tokenizer> t = Tokenizer::create(std::move(*v));
  if (!t) die(t.status().message());
  std::vector<int32_t> ids = t->encode(text.str(), false);
  if (ids.empty()) die(path + " encodes to no tokens");
  return ids;
}

int run(Options o) {
  if (o.worker_bin.empty()) die("--worker-bin is required when the default path does not exist");
  json rows = json::array();
  std::vector<std::string> table;
  const double load_before = bench::load_average();
  // A given model is measured once with its own router (reported as skew -1).
  const std::vector<double> skews = o.model_file.empty() ? o.skews : std::vector<double>{-1};
  for (double skew : skews) {
    const std::string path = o.model_file.empty() ? ensure_model(o, skew) : o.model_file;
    Result<std::unique_ptr<Model>> loaded = load_model(path);
    if (!loaded) die(loaded.status().message());
    const Model& m = **loaded;
    if (!o.text_file.empty()) o.text_tokens = tokenize_text(m, o.text_file);
    Result<std::vector<std::vector<std::string>>> slices = bench::ensure_slices(m, path, o.workers, o.data_dir);
    if (!slices) die(slices.status().message());
    Result<ModelIdentity> id = source_model_identity(m.file());
    if (!id) die(id.status().message());
    std::vector<backbone::SliceRef> refs;
    for (const auto& per_worker : *slices) {
      for (const std::string& f : per_worker) {
        Result<ExpertSlice> s = ExpertSlice::open(f);
        if (!s) die(s.status().message());
        refs.push_back({.layer = s->layer_first(), .expert_first = s->expert_first(), .expert_count = s->expert_count(),
                        .target = f, .bytes = s->file_bytes()});
      }
    }
    auto file_fetch = [](const std::string& target, uint64_t offset, uint64_t length) -> Result<std::vector<uint8_t>> {
      std::ifstream in(target, std::ios::binary);
      in.seekg(std::streamoff(offset));
      std::vector<uint8_t> b(length);
      in.read(reinterpret_cast<char*>(b.data()), std::streamsize(length));
      if (uint64_t(in.gcount()) != length) return Status::error("short read of " + target);
      return b;
    };
    Result<MoeLayout> layout = moe_layout(m.file());
    if (!layout) die(layout.status().message());
    Result<std::unique_ptr<ExpertDigestCache>> digests = ExpertDigestCache::open(m.file(), *layout);
    if (!digests) die(digests.status().message());
    uint64_t expert_bytes_total = 0;
    {
      backbone::SliceServerSource probe(*id, refs, file_fetch);
      for (int32_t l = 0; l < m.info().n_layer; ++l) {
        Result<uint64_t> b = probe.expert_bytes(l, 0);
        if (!b) die(b.status().message());
        expert_bytes_total += *b * m.info().n_expert;
      }
    }

    std::vector<bench::WorkerProcess> procs;
    std::vector<std::unique_ptr<bench::DelayProxy>> proxies;
    backbone::ExpertMap map;
    for (const auto& s : *slices) {
      Result<bench::WorkerProcess> w = bench::start_worker(o.worker_bin, 1, s);
      if (!w) die(w.status().message());
      procs.push_back(*w);
      auto proxy = bench::DelayProxy::start("127.0.0.1", w->port, std::chrono::microseconds(o.rtt_ms * 500));
      if (!proxy) die("delay proxy: " + proxy.error().message);
      map.workers.push_back({.address = (*proxy)->address(), .label = {}, .holdings = std::nullopt});
      proxies.push_back(std::move(*proxy));
    }
    ThreadPool pool(size_t(o.threads));
    LocalExpertExecutor local(m.expert_store(), &pool);
    for (int N : o.seqs) {
      const Run mono = decode(m, o, N, local, nullptr, pool, {});
      double tps_0 = 0;
      for (double pct : o.cache_pct) {
        backbone::HotCacheOptions co;
        co.budget_bytes = uint64_t(double(expert_bytes_total) * pct / 100.0);
        co.expected_digest = [&](int32_t layer, int32_t expert) {
          return (*digests)->holding(uint32_t(layer), uint32_t(expert), 1);
        };
        co.reference = &m.expert_store();
        backbone::HotExpertCache cache(std::make_unique<backbone::SliceServerSource>(*id, refs, file_fetch), co);
        backbone::DispatchOptions dopt;
        dopt.timeout = std::chrono::milliseconds(60'000);
        dopt.link.connect_timeout = std::chrono::seconds(60);
        if (pct > 0) dopt.hot_cache = &cache;
        Result<std::unique_ptr<backbone::RemoteExpertExecutor>> remote =
            backbone::remote_executor_for_model(m, map, &pool, dopt);
        if (!remote) die(remote.status().message());
        if ((*remote)->connected() != size_t(o.workers)) die("not every worker connected");
        const Run r = decode(m, o, N, **remote, remote->get(), pool, [&] { if (pct > 0) cache.step(); });
        if (r.tokens != mono.tokens) die("other tokens than the monolithic run (skew " + std::to_string(skew) + ")");
        if (r.after.fallbacks() > 0) die("fallbacks during the benchmark: " + r.after.to_json());
        const double pairs = double(r.after.pairs - r.before.pairs);
        const double cached = double(r.after.pairs_cached - r.before.pairs_cached);
        const double calls = double(r.after.layer_calls - r.before.layer_calls);
        const double requests = double(r.after.requests - r.before.requests);
        const double tps = double(N) * double(o.decode) / r.timed_s;
        if (pct == 0) tps_0 = tps;
        const backbone::HotCacheReport h = cache.report();
        json j = {{"router_skew", skew},
                  {"sequences", N},
                  {"cache_pct", pct},
                  {"cache_budget_bytes", co.budget_bytes},
                  {"cache_bytes_held", h.bytes_held},
                  {"experts_held", h.experts_held},
                  {"pairs_from_cache", pairs > 0 ? cached / pairs : 0},
                  {"requests_per_layer_call", calls > 0 ? requests / calls : 0},
                  {"layer_calls_without_round_trip",
                   calls > 0 ? double(r.after.calls_from_cache - r.before.calls_from_cache) / calls : 0},
                  {"tokens_per_s", tps},
                  {"gain_vs_no_cache", tps_0 > 0 ? tps / tps_0 : 1.0}};
        char line[256];
        std::snprintf(line, sizeof line, "| %g | %d | %g %% | %.1f MiB | %.3f | %.2f | %.3f | %.1f | %.2fx |", skew, N,
                      pct, double(h.bytes_held) / 1048576.0, j["pairs_from_cache"].get<double>(),
                      j["requests_per_layer_call"].get<double>(), j["layer_calls_without_round_trip"].get<double>(),
                      tps, j["gain_vs_no_cache"].get<double>());
        std::fprintf(stderr, "hot_cache_bench: %s\n", line);
        table.push_back(line);
        rows.push_back(j);
        remote->reset();
      }
    }
    proxies.clear();
    bench::stop_workers(procs);
  }
  json doc;
  doc["benchmark"] = "hot_cache";
  doc["cpu"] = cpu_name();
  doc["model"] = o.model_file.empty()
                     ? "synth qwen3moe tiny, " + std::to_string(o.layers) + " layers, Q4_K_M, 6 experts, top-2"
                     : o.model_file;
  doc["prompts"] = o.text_file.empty() ? "random tokens" : o.text_file;
  doc["workers"] = o.workers;
  doc["rtt_ms"] = o.rtt_ms;
  doc["backbone_threads"] = o.threads;
  doc["warmup_steps"] = o.warmup;
  doc["timed_decode_steps"] = o.decode;
  doc["load_average"] = {load_before, bench::load_average()};
  doc["rows"] = rows;
  doc["tokens_identical"] = true;
  std::printf("%s\n", doc.dump(2).c_str());
  std::fprintf(stderr, "| skew | sequences | cache | held | pairs from cache | requests/layer call | calls without a round trip | tok/s | vs no cache |\n");
  for (const std::string& l : table) std::fprintf(stderr, "%s\n", l.c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  essaim::Options o;
  o.worker_bin = essaim::bench::default_worker_binary(argv[0]);
  CLI::App app{"essaim hot-expert cache benchmark: pairs served locally and decode throughput vs cache size"};
  app.add_option("--data-dir", o.data_dir, "Where the synth models and slices are written once (default ./bench-data)");
  app.add_option("--layers", o.layers, "Layers of the synth models (default 8)")->check(CLI::Range(1, 48));
  app.add_option("--workers", o.workers, "Worker processes (default 4)")->check(CLI::Range(1, 64));
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: <build>/src/cli/essaim-worker)");
  app.add_option("--threads", o.threads, "Backbone threads (default 2)")->check(CLI::Range(1, 256));
  app.add_option("--skews", o.skews, "Router skews (default 2,4,8)")->delimiter(',')->check(CLI::Range(0.0, 100.0));
  app.add_option("--cache-pct", o.cache_pct, "Cache budgets in % of all expert bytes (default 0,5,10,25)")
      ->delimiter(',')->check(CLI::Range(0.0, 100.0));
  app.add_option("--seqs", o.seqs, "Concurrent sequences (default 1,4)")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--rtt-ms", o.rtt_ms, "Injected round trip per request (default 20)")->check(CLI::Range(0, 10000));
  app.add_option("--warmup", o.warmup, "Decode steps before the cache round (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--decode", o.decode, "Timed decode steps (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--model", o.model_file, "Measure this model file (e.g. models/kjv-moe-q4_k_m.gguf) with its own "
                                         "router instead of the synth models")->check(CLI::ExistingFile);
  app.add_option("--text", o.text_file, "Cut the prompts from this text instead of drawing random tokens")
      ->check(CLI::ExistingFile);
  app.add_option("--prompt", o.prompt, "Prompt tokens per sequence (default 8)")->check(CLI::Range(1, 4096));
  CLI11_PARSE(app, argc, argv);
  return essaim::run(o);
}
