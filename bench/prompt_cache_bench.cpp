// The prompt cache's gain as a client sees it: time to first token through HTTP of `essaim serve` with and
// without --cache-ram, on prompts that share a long prefix (an agent's system prompt and history) and differ
// after it. Two servers run side by side on the same file, one with the cache off (--cache-ram 0) and one with
// it on; each round sends the same new prompt — the shared prefix then a suffix no earlier round used — to
// each in turn (which one first alternates by round), alone (one request in flight), streamed, and times the
// first event; the cached server saw the prefix once before the timed rounds (its first, a miss, is reported
// apart). Then --miss-rounds prompts that share nothing cached go to both: what the cache costs a miss (its
// prefill stops at each checkpoint to copy the recurrent states). Prints one JSON document: medians, every
// round, the ratio of the medians and the median of the rounds' own ratios (steadier when a shared host
// drifts), and what /metrics says the cache restored.
//
//   build/bench/prompt_cache_bench                                   # trained model, 2,000-token prefix
//   build/bench/prompt_cache_bench --prefix 2000 --suffix 16 --rounds 9 --miss-rounds 6 --threads 2
//   build/bench/prompt_cache_bench --model other.gguf --ctx 8192
//
// The prompts are token ids (a /v1/completions token array) cut from the text of models/heldout.txt, so the
// prefix is exactly --prefix tokens. Both servers must stream the same first token in every round, or the
// benchmark refuses to report: a fast wrong answer is not a result.
#include <CLI/CLI.hpp>
#include <boost/asio.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "median.h"
#include "text/tokenizer.h"
#include "text/vocab.h"
#include "worker_processes.h"

namespace essaim {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
namespace asio = boost::asio;

struct Options {
  std::string model = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf";
  std::string text = std::string(ESSAIM_SOURCE_DIR) + "/models/heldout.txt";
  std::string essaim;
  int prefix = 2000;
  int suffix = 16;
  int rounds = 7;
  int threads = 2;
  int ctx = 4096;
  int miss_rounds = 3;
};

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "prompt_cache_bench: %s\n", what.c_str());
  std::exit(1);
}

// The text's tokens by the model's own tokenizer.
std::vector<TokenId> text_tokens(const Options& o) {
  Result<GgufFile> file = GgufFile::open(o.model);
  if (!file) die(file.status().message());
  Result<Vocab> vocab = vocab_from_gguf(file.value());
  if (!vocab) die(vocab.status().message());
  Result<Tokenizer> tok = Tokenizer::create(std::move(vocab.value()));
  if (!tok) die(tok.status().message());
  std::ifstream in(o.text);
  std::stringstream ss;
  ss << in.rdbuf();
  return tok.value().encode(ss.str(), /*parse_special=*/false);
}

// Prompt i: the shared prefix, then a window of the text after it whose first token no other prompt's
// suffix starts with (so every prompt shares exactly the prefix with the others).
std::vector<std::vector<TokenId>> prompts(const Options& o, const std::vector<TokenId>& t, int n) {
  std::vector<std::vector<TokenId>> out;
  std::set<TokenId> firsts = {t.at(size_t(o.prefix))};  // the text's own continuation of the prefix
  for (size_t at = size_t(o.prefix) + 1; int(out.size()) < n && at + size_t(o.suffix) <= t.size(); ++at) {
    if (!firsts.insert(t[at]).second) continue;
    std::vector<TokenId> p(t.begin(), t.begin() + o.prefix);
    p.insert(p.end(), t.begin() + ptrdiff_t(at), t.begin() + ptrdiff_t(at) + o.suffix);
    out.push_back(std::move(p));
  }
  if (int(out.size()) < n) die("the text is too short for " + std::to_string(n) + " prompts");
  return out;
}

// Prompts of the same length that share no prefix with those above nor with each other: windows of the text
// from after them on (the cost of a miss: the cached server's prefill stops at every checkpoint).
std::vector<std::vector<TokenId>> fresh_prompts(const Options& o, const std::vector<TokenId>& t, int n) {
  std::vector<std::vector<TokenId>> out;
  const size_t len = size_t(o.prefix + o.suffix);
  std::set<TokenId> firsts = {t.at(0)};
  for (size_t at = size_t(o.prefix) + 4096; int(out.size()) < n && at + len <= t.size(); at += 1) {
    if (!firsts.insert(t[at]).second) continue;
    out.emplace_back(t.begin() + ptrdiff_t(at), t.begin() + ptrdiff_t(at + len));
    at += len;
  }
  if (int(out.size()) < n) die("the text is too short for " + std::to_string(n) + " fresh prompts");
  return out;
}

std::string http_post(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
}

struct Answer {
  double first_event_ms = 0;  // request sent → the first "data:" event read
  std::string first_text;     // that event's choices[0].text
};

// One streamed completion of one token; the clock runs from the first byte written to the first event read.
Answer first_token(uint16_t port, const std::vector<TokenId>& prompt) {
  const std::string req = http_post(
      "/v1/completions", json({{"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}, {"stream", true}}).dump());
  asio::io_context io;
  asio::ip::tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), port});
  const Clock::time_point t0 = Clock::now();
  asio::write(sock, asio::buffer(req));
  std::string got;
  Answer a;
  char buf[4096];
  boost::system::error_code ec;
  for (;;) {
    const size_t n = sock.read_some(asio::buffer(buf), ec);
    got.append(buf, n);
    if (a.first_event_ms == 0 && got.find("\ndata: ") != std::string::npos)
      a.first_event_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (ec) break;
  }
  const size_t at = got.find("\ndata: ");
  if (at == std::string::npos) die("no event in the answer: " + got);
  const json j = json::parse(got.substr(at + 7, got.find('\n', at + 7) - at - 7), nullptr, false);
  if (!j.is_object() || !j.contains("choices")) die("unexpected first event: " + got.substr(at));
  a.first_text = j["choices"][0]["text"].get<std::string>();
  return a;
}

// The same prompt to the uncached and the cached server, one after the other, the first by turns (round r).
std::pair<Answer, Answer> both(uint16_t off, uint16_t on, const std::vector<TokenId>& prompt, int r) {
  if (r % 2 == 0) {
    Answer a = first_token(off, prompt);
    return {a, first_token(on, prompt)};
  }
  Answer b = first_token(on, prompt);
  return {first_token(off, prompt), b};
}

double metric(uint16_t port, const std::string& sample) {
  asio::io_context io;
  asio::ip::tcp::socket sock(io);
  sock.connect({asio::ip::make_address("127.0.0.1"), port});
  asio::write(sock, asio::buffer(std::string("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")));
  std::string got;
  char buf[4096];
  boost::system::error_code ec;
  for (size_t n; (n = sock.read_some(asio::buffer(buf), ec)) > 0 || !ec;) got.append(buf, n);
  const size_t at = got.find("\n" + sample + " ");
  return at == std::string::npos ? -1 : std::atof(got.c_str() + at + sample.size() + 2);
}

bench::WorkerProcess start_serve(const Options& o, const std::string& cache_ram) {
  Result<bench::WorkerProcess> p = bench::start_listening(
      {o.essaim, "serve", "-m", o.model, "--port", "0", "-np", "1", "-c", std::to_string(o.ctx), "-t",
       std::to_string(o.threads), "--no-access-log", "--cache-ram", cache_ram});
  if (!p) die(p.status().message());
  return p.value();
}

void wait_ready(uint16_t port) {  // the listener is up before the model is loaded
  const auto end = Clock::now() + std::chrono::seconds(120);
  while (metric(port, "essaim_serve_ready") != 1) {
    if (Clock::now() > end) die("the server did not load its model");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  using namespace essaim;
  Options o;
  CLI::App app{"Time to first token through HTTP with and without the prompt cache"};
  app.add_option("--model", o.model, "GGUF model (default: the trained model of models/)");
  app.add_option("--text", o.text, "Text the prompts are cut from (default: models/heldout.txt)");
  app.add_option("--essaim", o.essaim, "The essaim binary (default: <build>/src/cli/essaim)");
  app.add_option("--prefix", o.prefix, "Tokens every prompt shares (default 2000)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--suffix", o.suffix, "Tokens after the prefix, new in each round (default 16)")->check(CLI::Range(1, 4096));
  app.add_option("--rounds", o.rounds, "Timed rounds (default 7)")->check(CLI::Range(1, 1000));
  app.add_option("--miss-rounds", o.miss_rounds, "Rounds of prompts sharing nothing cached (default 3)")
      ->check(CLI::Range(0, 1000));
  app.add_option("--threads", o.threads, "Compute threads of each server (default 2)")->check(CLI::Range(1, 1024));
  app.add_option("--ctx", o.ctx, "Context of each server (default 4096)")->check(CLI::Range(1, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  if (o.essaim.empty()) o.essaim = bench::default_cli_binary(argv[0], "essaim");
  if (o.essaim.empty()) die("no essaim binary beside the benchmark; give --essaim");
  if (o.prefix + o.suffix >= o.ctx) die("--ctx must exceed --prefix + --suffix");

  const std::vector<TokenId> text = text_tokens(o);
  const std::vector<std::vector<TokenId>> ps = prompts(o, text, o.rounds + 2);
  const std::vector<std::vector<TokenId>> misses = fresh_prompts(o, text, o.miss_rounds);
  const bench::WorkerProcess off = start_serve(o, "0"), on = start_serve(o, "8192");
  wait_ready(off.port);
  wait_ready(on.port);
  // Untimed: each server's first request (pages faulted in); on the cached one it also stores the prefix.
  const Answer warm_off = first_token(off.port, ps[0]);
  const Answer miss = first_token(on.port, ps[1]);
  if (first_token(off.port, ps[1]).first_text != miss.first_text) die("the servers disagree on the priming prompt");
  (void)warm_off;
  std::vector<double> t_off, t_on, ratios;
  json rounds = json::array();
  for (int r = 0; r < o.rounds; ++r) {
    const std::vector<TokenId>& p = ps[size_t(r) + 2];
    const auto [a, b] = both(off.port, on.port, p, r);
    if (a.first_text != b.first_text)
      die("round " + std::to_string(r) + ": the cached server answered '" + b.first_text + "', the uncached '" +
          a.first_text + "'");
    t_off.push_back(a.first_event_ms);
    t_on.push_back(b.first_event_ms);
    ratios.push_back(a.first_event_ms / b.first_event_ms);
    rounds.push_back({{"uncached_ms", a.first_event_ms}, {"cached_ms", b.first_event_ms}});
  }
  std::vector<double> miss_off, miss_on;
  for (size_t r = 0; r < misses.size(); ++r) {
    const auto [a, b] = both(off.port, on.port, misses[r], int(r));
    if (a.first_text != b.first_text) die("a fresh prompt: the servers disagree");
    miss_off.push_back(a.first_event_ms);
    miss_on.push_back(b.first_event_ms);
  }
  const double hits = metric(on.port, "essaim_serve_prompt_cache_lookups_total{result=\"hit\"}");
  const double reused = metric(on.port, "essaim_serve_prompt_cache_tokens_reused_total");
  const double held = metric(on.port, "essaim_serve_prompt_cache_bytes{kind=\"held\"}");
  bench::stop_workers({off, on});
  if (hits != o.rounds) die("the cached server counted " + std::to_string(hits) + " hits in " + std::to_string(o.rounds) + " rounds");
  const json out = {
      {"bench", "prompt_cache_bench"},
      {"model", o.model},
      {"prefix_tokens", o.prefix},
      {"suffix_tokens", o.suffix},
      {"prompt_tokens", o.prefix + o.suffix},
      {"threads", o.threads},
      {"rounds", o.rounds},
      {"ttft_ms", {{"uncached_median", bench::median(t_off)}, {"cached_median", bench::median(t_on)},
                   {"cached_first_request_miss", miss.first_event_ms}}},
      {"ratio_of_medians", bench::median(t_off) / bench::median(t_on)},
      {"miss_ttft_ms", {{"rounds", o.miss_rounds}, {"uncached_median", bench::median(miss_off)},
                        {"cached_median", bench::median(miss_on)},
                        {"cached_over_uncached", bench::median(miss_on) / bench::median(miss_off)}}},
      {"median_paired_ratio", bench::median(ratios)},
      {"restored_tokens_per_hit", reused / hits},
      {"cache_bytes_held", held},
      {"per_round", rounds},
  };
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}
