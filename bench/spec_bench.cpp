// Speculative decoding over the swarm (docs/speculative.md): the trained model's experts on 3 `essaim-worker`
// processes behind delaying proxies (bench/support/delay_proxy.h) at each injected round trip, the serve
// scheduler running 1 or N concurrent greedy sequences (prompts from models/heldout.txt) with K = 0 (plain)
// .. 4 MTP drafts per step, the MTP block's experts on the backbone or on the workers. Per run: draft
// acceptance, tokens per step (per sequence), generated tok/s, layer calls (round trips) per token, and the
// mean, p50 and p90 inter-token latency as a streaming client sees it (tokens of one step arrive together:
// gap 0, so p50 is 0 once most steps give 2 tokens or more).
// Prints one JSON document on stdout and a markdown table on stderr.
//
//   build/bench/spec_bench                                    # models/kjv-moe-q4_k_m.gguf, 0/5/20 ms, 1 and 16
//   build/bench/spec_bench --rtt-ms 20 --seqs 1 --k 0,3 --gen 32
//
// Every run's tokens must equal the K = 0 run's (same RTT and concurrency), and sequence i's tokens must
// equal its tokens in the single-sequence run, with no fallback, or the benchmark refuses to report.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "backbone/remote_executor.h"
#include "core/thread_pool.h"
#include "delay_proxy.h"
#include "model/model.h"
#include "serve/scheduler.h"
#include "text/tokenizer.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

struct Options {
  std::string model = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf";
  std::string text = std::string(ESSAIM_SOURCE_DIR) + "/models/heldout.txt";
  std::string data_dir = "spec-bench-data";
  std::string worker_bin;
  std::vector<int> rtt_ms = {0, 5, 20};
  std::vector<int> seqs = {1, 16};
  std::vector<int> ks = {0, 1, 2, 3, 4};
  std::vector<std::string> draft_experts = {"backbone", "swarm"};  // where the MTP block's experts run
  int workers = 3;
  int prompt = 16;
  int gen = 48;
  int threads = 2;
};

[[noreturn]] void die(const std::string& m) {
  std::fprintf(stderr, "spec_bench: %s\n", m.c_str());
  std::exit(1);
}

struct Run {
  std::vector<std::vector<TokenId>> tokens;  // per sequence
  double seconds = 0;                        // submit of the first to the last token
  std::vector<double> gaps;                  // inter-token gaps of every sequence (s)
  serve::SchedulerStats stats;
};

// One scheduler run of n greedy sequences with K drafts (0: plain), events timed as they arrive.
Run run_once(const Model& m, ExpertExecutor& ex, ExpertExecutor* draft_ex, ThreadPool& pool,
             const std::vector<std::vector<TokenId>>& prompts, int n, int k, int gen) {
  serve::Scheduler sched(m, &ex, &pool,
                         {.parallel = n, .batch_tokens = 512, .queue_capacity = n, .cache = {.n_ctx = 256},
                          .spec = {.draft_max = k}, .draft_experts = draft_ex});
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  Run r;
  r.tokens.resize(size_t(n));
  std::vector<std::vector<double>> times(static_cast<size_t>(n));
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    serve::SequenceRequest req{.prompt = prompts[size_t(i)], .max_tokens = gen, .sampling = {}, .eog = {}};
    req.sampling.temperature = 0;
    const auto sink = [&, i](const serve::SequenceEvent& e) {
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      std::lock_guard<std::mutex> lock(mu);
      for (TokenId id : e.tokens) {
        r.tokens[size_t(i)].push_back(id);
        times[size_t(i)].push_back(t);
      }
      if (e.done) {
        ++done;
        cv.notify_all();
      }
    };
    if (!sched.submit(std::move(req), sink).handle) die("submit refused");
  }
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done == n; });
  r.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  uint64_t generated = 0;
  for (const std::vector<double>& t : times) {
    generated += t.size();
    for (size_t j = 1; j < t.size(); ++j) r.gaps.push_back(t[j] - t[j - 1]);
  }
  lock.unlock();
  // The last step's counters are added after its final events went out: wait (bounded) for them.
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (sched.stats().generated_tokens < generated && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  r.stats = sched.stats();
  return r;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, size_t(p * double(v.size() - 1) + 0.5))];
}

std::vector<std::vector<TokenId>> heldout_prompts(const Model& m, const Options& o, int n) {
  std::ifstream in(o.text, std::ios::binary);
  if (!in) die("cannot open " + o.text);
  std::stringstream s;
  s << in.rdbuf();
  Result<Vocab> vocab = vocab_from_gguf(m.file());
  if (!vocab) die(vocab.status().message());
  Result<Tokenizer> tok = Tokenizer::create(std::move(*vocab));
  if (!tok) die(tok.status().message());
  const std::vector<TokenId> ids = tok->encode(s.str(), false);
  std::vector<std::vector<TokenId>> out;
  for (int i = 0; i < n; ++i) {
    const size_t at = size_t(i) * 997 % (ids.size() - size_t(o.prompt));
    out.emplace_back(ids.begin() + std::ptrdiff_t(at), ids.begin() + std::ptrdiff_t(at) + o.prompt);
  }
  return out;
}

json measure(const Model& m, const Options& o, ThreadPool& pool, const std::vector<bench::WorkerProcess>& procs,
             int rtt, std::vector<std::string>& table) {
  Result<bench::DelayedWorkers> delayed = bench::behind_delay(procs, rtt);
  if (!delayed) die(delayed.status().message());
  const backbone::ExpertMap& map = delayed->map;
  backbone::DispatchOptions dopt;
  dopt.timeout = std::chrono::milliseconds(10000);
  dopt.link.connect_timeout = std::chrono::seconds(60);
  Result<std::unique_ptr<backbone::RemoteExpertExecutor>> remote = backbone::remote_executor_for_model(m, map, &pool, dopt);
  if (!remote) die(remote.status().message());
  if ((*remote)->connected() != procs.size()) die("not every worker connected: " + (*remote)->stats().to_json());
  const int max_seqs = *std::max_element(o.seqs.begin(), o.seqs.end());
  const std::vector<std::vector<TokenId>> prompts = heldout_prompts(m, o, max_seqs);
  json runs = json::array();
  std::vector<std::vector<TokenId>> single;  // each sequence's tokens alone (K = 0, 1 sequence, or its first run)
  for (int n : o.seqs) {
    std::vector<std::vector<TokenId>> plain;
    double plain_tps = 0;
    LocalExpertExecutor local(m.expert_store(), &pool);
    for (int k : o.ks)
      for (const std::string& where : o.draft_experts) {
      if (k == 0 && where != o.draft_experts[0]) continue;  // nothing drafted
      const uint64_t calls0 = (*remote)->stats().layer_calls;
      const Run r = run_once(m, **remote, where == "backbone" ? &local : nullptr, pool, prompts, n, k, o.gen);
      const uint64_t calls = (*remote)->stats().layer_calls - calls0;
      if ((*remote)->stats().fallbacks() > 0) die("fallbacks during the benchmark: " + (*remote)->stats().to_json());
      if (plain.empty()) plain = r.tokens;
      if (r.tokens != plain) die("K=" + std::to_string(k) + " changed the stream at " + std::to_string(rtt) + " ms");
      for (int i = 0; i < n; ++i) {
        if (size_t(i) >= single.size()) single.push_back(r.tokens[size_t(i)]);
        if (r.tokens[size_t(i)] != single[size_t(i)]) die("sequence " + std::to_string(i) + " depends on the batch");
      }
      uint64_t generated = 0;
      for (const auto& t : r.tokens) generated += t.size();
      const double tps = double(generated) / r.seconds;
      if (k == 0) plain_tps = tps;
      const serve::SchedulerStats& s = r.stats;
      const double accept = s.spec_drafted ? double(s.spec_accepted) / double(s.spec_drafted) : 0.0;
      const double per_step = s.spec_rounds ? double(s.spec_tokens) / double(s.spec_rounds) : 1.0;
      const double p50 = percentile(r.gaps, 0.5) * 1e3, p90 = percentile(r.gaps, 0.9) * 1e3;
      double mean = 0;
      for (double g : r.gaps) mean += g;
      mean = r.gaps.empty() ? 0 : mean / double(r.gaps.size()) * 1e3;
      runs.push_back({{"rtt_ms", rtt}, {"seqs", n}, {"k", k}, {"drafts_on", k ? where : "-"}, {"generated", generated}, {"seconds", r.seconds},
                      {"tok_s", tps}, {"speedup", plain_tps > 0 ? tps / plain_tps : 1.0}, {"acceptance", accept},
                      {"tokens_per_step", per_step}, {"steps", s.steps}, {"layer_calls", calls},
                      {"layer_calls_per_token", double(calls) / double(generated)},
                      {"itl_mean_ms", mean}, {"itl_p50_ms", p50}, {"itl_p90_ms", p90}});
      char line[256];
      std::snprintf(line, sizeof line, "| %d | %d | %d | %s | %.2f | %.2f | %.1f | %.2f× | %.2f | %.1f | %.1f | %.1f |", rtt, n,
                    k, k ? where.c_str() : "-", accept, per_step, tps, plain_tps > 0 ? tps / plain_tps : 1.0, double(calls) / double(generated),
                    mean, p50, p90);
      table.push_back(line);
      std::fprintf(stderr, "%s\n", line);
      }
  }
  remote->reset();  // links closed before the proxies go
  return runs;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  using namespace essaim;
  Options o;
  CLI::App app("Speculative decoding (MTP drafts) over the swarm: acceptance, tokens per step, tok/s, latency");
  app.add_option("--model", o.model, "Model with an MTP block (default: the trained Q4_K_M file)");
  app.add_option("--text", o.text, "Text the prompts are cut from (default models/heldout.txt)");
  app.add_option("--data-dir", o.data_dir, "Where the workers' slices are written once");
  app.add_option("--worker-bin", o.worker_bin, "essaim-worker binary (default: beside this benchmark's build)");
  app.add_option("--rtt-ms", o.rtt_ms, "Injected round trips (default 0,5,20)")->delimiter(',');
  app.add_option("--seqs", o.seqs, "Concurrent sequences (default 1,16)")->delimiter(',');
  app.add_option("--k", o.ks, "Drafts per step, 0 = plain (default 0,1,2,3,4)")->delimiter(',');
  app.add_option("--draft-experts", o.draft_experts,
                 "Where the MTP block's experts run, each measured: backbone (here, no round trip) and/or swarm "
                 "(default backbone,swarm)")
      ->delimiter(',');
  app.add_option("--workers", o.workers, "Worker processes (default 3)");
  app.add_option("--prompt", o.prompt, "Prompt tokens (default 16)");
  app.add_option("--gen", o.gen, "Tokens generated per sequence (default 48)");
  app.add_option("--threads", o.threads, "Backbone threads (default 2)");
  CLI11_PARSE(app, argc, argv);
  if (o.worker_bin.empty()) o.worker_bin = bench::default_worker_binary(argv[0]);
  if (o.ks.empty() || o.ks[0] != 0) die("--k must start with 0 (the plain run every other is compared with)");
  Result<std::unique_ptr<Model>> model = load_model(o.model);
  if (!model) die(model.status().message());
  if (!(*model)->has_nextn()) die(o.model + " has no MTP block");
  Result<std::vector<std::vector<std::string>>> slices = bench::ensure_slices(**model, o.model, o.workers, o.data_dir);
  if (!slices) die(slices.status().message());
  std::vector<bench::WorkerProcess> procs;
  for (const std::vector<std::string>& s : *slices) {
    Result<bench::WorkerProcess> w = bench::start_worker(o.worker_bin, 1, s);
    if (!w) die(w.status().message());
    procs.push_back(*w);
  }
  ThreadPool pool(size_t(o.threads));
  std::vector<std::string> table = {
      "| RTT ms | seqs | K | MTP experts | acceptance | tokens/step/seq | tok/s | vs K=0 | layer calls/token | ITL mean ms | ITL p50 ms | ITL p90 ms |",
      "|---|---|---|---|---|---|---|---|---|---|---|---|"};
  for (const std::string& l : table) std::fprintf(stderr, "%s\n", l.c_str());
  json runs = json::array();
  for (int rtt : o.rtt_ms)
    for (json& r : measure(**model, o, pool, procs, rtt, table)) runs.push_back(std::move(r));
  bench::stop_workers(procs);
  json doc{{"benchmark", "spec"}, {"model", o.model}, {"workers", o.workers}, {"prompt_tokens", o.prompt},
           {"generated_per_sequence", o.gen}, {"threads", o.threads}, {"runs", runs}};
  std::printf("%s\n", doc.dump(1).c_str());
  std::fprintf(stderr, "\n");
  for (const std::string& l : table) std::fprintf(stderr, "%s\n", l.c_str());
  return 0;
}
