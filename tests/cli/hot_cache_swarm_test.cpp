// The hot-expert cache end to end, every part a real process on loopback: `essaim coordinator` serving a
// skewed synth model's slices, a worker that joins by itself, and `essaim eval --coordinator
// --expert-cache-mb`, whose cache fetches the hottest experts from the coordinator's slice server by Range.
//   - the logits equal the monolithic eval byte for byte, and a share of the pairs came from the cache;
//   - with layer 0's slice files altered on the coordinator (bytes flipped across their data), every
//     download of a layer-0 expert is refused and counted, and the logits are still the monolithic ones.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "cli_test_util.h"
#include "net/http_client.h"

namespace essaim::cli_test {
namespace {

using Clock = std::chrono::steady_clock;
using nlohmann::json;
namespace fs = std::filesystem;

constexpr const char* kAdmin = "hot-cache-test-admin-token";

struct SkewedModel {
  std::string dir, model, slices;
  std::string backbone() const { return slices + "/skewed.backbone.gguf"; }
};

const SkewedModel& skewed() {
  static const SkewedModel m = [] {
    SkewedModel s;
    s.dir = make_temp_dir("hot");
    s.model = s.dir + "/skewed.gguf";
    s.slices = s.dir + "/slices";
    CliRun r = run_cli("essaim synth --arch qwen3moe --preset tiny --types q4_k_m --seed 5 --router-skew 4 -o " + s.model);
    if (r.code != 0) ADD_FAILURE() << r.err;
    r = run_cli("essaim slice -m " + s.model + " --plan 3 --backbone --stem skewed -o " + s.slices);
    if (r.code != 0) ADD_FAILURE() << r.err;
    return s;
  }();
  return m;
}

// A comma list of n seeded token ids below 200 (the tiny vocabulary is larger).
// The cached evals run kEvalTokens one-token steps: long enough for the cache's background planner (a look
// every 20 ms) to choose and fetch experts while the eval runs. With 160 steps an eval took ~65 ms on a
// fast run and ended before the first fetch.
constexpr size_t kEvalTokens = 800;
std::string tokens(size_t n) {
  std::string t;
  uint64_t x = 12345;
  for (size_t i = 0; i < n; ++i) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    t += (i ? "," : "") + std::to_string((x >> 33) % 200);
  }
  return t;
}

class Coordinator {
 public:
  Coordinator(const std::string& dir, const std::string& slices)
      : dir_(dir), proc_("essaim coordinator --model " + skewed().model + " --slices " + slices + " --db " + dir +
                         "/coord.sqlite --listen 127.0.0.1:0 --admin-token " + kAdmin + " --replicas 1 --heartbeat-s 1") {}
  bool up() const { return proc_.port() != 0; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(proc_.port()); }
  std::string log() const { return proc_.stderr_text(); }
  json call(const std::string& method, const std::string& target, const std::string& body = "") const {
    net::HttpUrl u{.host = "127.0.0.1", .port = proc_.port(), .base_path = ""};
    Result<net::HttpAnswer> a = net::http_call(u, {.method = method, .target = target, .bearer = kAdmin,
                                                         .body = body, .headers = {}});
    if (!a || a->status / 100 != 2) return json();
    return json::parse(a->body, nullptr, false);
  }
  // A self-joining worker with room for every slice.
  std::unique_ptr<BackgroundProcess> worker(const std::string& name) const {
    json j = call("POST", "/api/nodes", json{{"name", name}}.dump());
    const std::string token = j.is_object() ? j.value("token", "") : "";
    return std::make_unique<BackgroundProcess>("essaim-worker --coordinator " + url() + " --token " + token +
                                               " --budget-mb 4 --data-dir " + dir_ + "/" + name + " --listen 127.0.0.1:0");
  }
  // Held (layer, first expert) ranges in the map.
  size_t ranges_held() const {
    json m = call("GET", "/api/expert-map");
    size_t n = 0;
    if (m.is_object() && m["workers"].is_array())
      for (const json& w : m["workers"]) n += w["holdings"].size();
    return n;
  }
  bool wait_ranges(size_t n, double timeout_s) const {
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < std::chrono::duration<double>(timeout_s)) {
      if (ranges_held() >= n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  }

 private:
  std::string dir_;
  BackgroundProcess proc_;
};

// eval through the coordinator with the cache on; returns the --json summary.
json cached_eval(const Coordinator& c, const std::string& out, const std::string& extra = "",
                 const std::string& model_flag = "-m " + skewed().model) {
  const CliRun r = run_cli("essaim eval " + model_flag + " --tokens " + tokens(kEvalTokens) + " --batch 1 --logits-out " +
                           out + " --coordinator " + c.url() + " --token " + kAdmin +
                           " --expert-cache-mb 0.25 --worker-log --json" + extra);
  EXPECT_EQ(r.code, 0) << r.err;
  json j = json::parse(r.out, nullptr, false);
  EXPECT_TRUE(j.is_object()) << r.out << r.err;
  if (!j.is_object()) return json::object();
  j["stderr"] = r.err;
  return j;
}

std::string mono(const std::string& dir) {
  const std::string p = dir + "/mono.npy";
  const CliRun r = run_cli("essaim eval -m " + skewed().model + " --tokens " + tokens(kEvalTokens) + " --batch 1 --logits-out " + p);
  EXPECT_EQ(r.code, 0) << r.err;
  return read_text(p);
}

TEST(HotCacheSwarm, TheCacheServesAShareOfThePairsAndTheLogitsAreMonolithic) {
  const std::string dir = make_temp_dir("hot-clean");
  Coordinator c(dir, skewed().slices);
  ASSERT_TRUE(c.up()) << c.log();
  auto w = c.worker("w0");
  ASSERT_NE(w->port(), 0) << w->stderr_text();
  ASSERT_TRUE(c.wait_ranges(4, 30)) << c.log() << w->stderr_text();

  json s = cached_eval(c, dir + "/swarm.npy");
  EXPECT_EQ(mono(dir), read_text(dir + "/swarm.npy")) << "not bit-identical";
  const json& d = s["dispatch"];
  ASSERT_TRUE(d.contains("hot_cache")) << s.dump();
  const json& h = d["hot_cache"];
  EXPECT_GT(d.value("pairs_cached", 0), 0) << s.dump();
  EXPECT_GT(d.value("pairs_remote", 0), 0) << "a 0.25 MiB cache cannot hold the whole model: " << s.dump();
  EXPECT_EQ(d.value("pairs_fallback", 1), 0) << s.dump();
  // The full model's cache (this test's subject) with every range held: nothing may come from the local copy.
  EXPECT_EQ(d.value("pairs_local", 1), 0) << s.dump();
  EXPECT_EQ(d.value("pairs", 0), d.value("pairs_remote", 0) + d.value("pairs_local", 0) + d.value("pairs_cached", 0));
  EXPECT_GT(h.value("fetches", 0), 0) << s.dump();
  EXPECT_EQ(h.value("refusals", 1), 0) << s.dump();
  EXPECT_EQ(h.value("hits", 0), d.value("pairs_cached", 1));
  EXPECT_LE(h.value("bytes_held", uint64_t(1) << 40), h.value("budget_bytes", uint64_t(0)));
  std::printf("[ measure ] %d of %d pairs from the hot cache (0.25 MiB, router skew 4)\n", d.value("pairs_cached", 0),
              d.value("pairs", 0));
  // The text summary names the cache too.
  const CliRun text = run_cli("essaim eval -m " + skewed().model + " --tokens " + tokens(40) + " --batch 1 --logits-out " +
                              dir + "/t.npy --coordinator " + c.url() + " --token " + kAdmin + " --expert-cache-mb 0.25");
  EXPECT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.err.find("hot cache:"), std::string::npos) << text.err;

  // `essaim serve` with the cache: /metrics counts its hits, fetches and bytes held.
  BackgroundProcess serve("essaim serve -m " + skewed().model + " --port 0 --coordinator " + c.url() + " --token " +
                          kAdmin + " --expert-cache-mb 0.25");
  ASSERT_NE(serve.port(), 0) << serve.stderr_text();
  const net::HttpUrl u{.host = "127.0.0.1", .port = serve.port(), .base_path = ""};
  const std::string body = json{{"prompt", "Once upon a time"}, {"max_tokens", 48}, {"temperature", 0}}.dump();
  auto metric = [&](const std::string& text, const std::string& key) {
    const size_t at = text.find("\n" + key + " ");
    return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size() + 2));
  };
  std::string metrics;
  const auto t0 = Clock::now();
  while (Clock::now() - t0 < std::chrono::seconds(30)) {
    Result<net::HttpAnswer> a = net::http_call(u, {.method = "POST", .target = "/v1/completions", .bearer = "",
                                                         .body = body, .headers = {}});
    Result<net::HttpAnswer> m = net::http_call(u, {.method = "GET", .target = "/metrics", .bearer = "",
                                                         .body = "", .headers = {}});
    if (a && a->status == 200 && m && m->status == 200) {
      metrics = m->body;
      if (metric(metrics, "essaim_hot_cache_hits_total") > 0) break;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // still loading
    }
  }
  EXPECT_GT(metric(metrics, "essaim_hot_cache_hits_total"), 0) << metrics << serve.stderr_text();
  EXPECT_GT(metric(metrics, "essaim_hot_cache_fetches_total"), 0) << metrics;
  EXPECT_EQ(metric(metrics, "essaim_hot_cache_refusals_total"), 0) << metrics;
  EXPECT_GT(metric(metrics, "essaim_hot_cache_experts"), 0) << metrics;
  EXPECT_NE(metrics.find("essaim_hot_cache_bytes{kind=\"held\"}"), std::string::npos) << metrics;
  EXPECT_NE(metrics.find("essaim_dispatch_pairs_total{where=\"hot_cache\"}"), std::string::npos) << metrics;
}

// A backbone that holds no expert bytes (the backbone file): the cache is its only local compute, its
// expected bytes are the digests the backbone file records, and the logits are still the full model's.
TEST(HotCacheSwarm, ABackboneFileBackboneComputesItsHotExpertsFromTheCacheBitForBit) {
  const std::string dir = make_temp_dir("hot-lean");
  Coordinator c(dir, skewed().slices);
  ASSERT_TRUE(c.up()) << c.log();
  auto w = c.worker("w0");
  ASSERT_NE(w->port(), 0) << w->stderr_text();
  ASSERT_TRUE(c.wait_ranges(4, 30)) << c.log() << w->stderr_text();

  json s = cached_eval(c, dir + "/swarm.npy", "", "--backbone-file " + skewed().backbone());
  EXPECT_EQ(mono(dir), read_text(dir + "/swarm.npy")) << "not bit-identical";
  const json& d = s["dispatch"];
  EXPECT_GT(d.value("pairs_cached", 0), 0) << s.dump();
  EXPECT_EQ(d.value("pairs_local", 1), 0) << "no expert bytes here but the cache's: " << s.dump();
  EXPECT_EQ(d.value("pairs_fallback", 1), 0) << s.dump();
  EXPECT_EQ(d["hot_cache"].value("refusals", 1), 0) << s.dump();
  EXPECT_NE(s.value("stderr", std::string()).find("backbone file"), std::string::npos) << s.value("stderr", std::string());
  std::printf("[ measure ] backbone file: %d of %d pairs from the hot cache\n", d.value("pairs_cached", 0),
              d.value("pairs", 0));
}

// Layer 0 has no holder here (its slices are damaged, so the worker refuses them): the full model's own copy
// computes it on purpose, which is the fallback this test needs beside the refused downloads.
TEST(HotCacheSwarm, AlteredSliceFilesOnTheCoordinatorAreRefusedAndNeverUsed) {
  const std::string dir = make_temp_dir("hot-altered");
  const std::string slices = dir + "/slices";
  fs::copy(skewed().slices, slices, fs::copy_options::recursive);
  // Layer 0's slices: bytes flipped across their data (same length, so the coordinator still serves them).
  int altered = 0;
  for (const auto& e : fs::directory_iterator(slices)) {
    const std::string name = e.path().filename().string();
    const size_t l = name.find(".L");  // <stem>.L<layer, zero-padded>.E<experts>.gguf
    if (l == std::string::npos || name.find(".E", l) == std::string::npos ||
        std::stoi(name.substr(l + 2, name.find(".E", l) - l - 2)) != 0)
      continue;
    const uint64_t len = fs::file_size(e.path());
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    for (uint64_t k = 4; k < 32; ++k) {
      const uint64_t at = len * k / 32;
      f.seekg(std::streamoff(at));
      char b = 0;
      f.read(&b, 1);
      b = char(b ^ 0x20);
      f.seekp(std::streamoff(at));
      f.write(&b, 1);
    }
    ++altered;
  }
  ASSERT_EQ(altered, 2);
  Coordinator c(dir, slices);
  ASSERT_TRUE(c.up()) << c.log();
  auto w = c.worker("w0");
  ASSERT_NE(w->port(), 0) << w->stderr_text();
  ASSERT_TRUE(c.wait_ranges(2, 30)) << "layer 1's two slices are intact: " << c.log() << w->stderr_text();

  json s = cached_eval(c, dir + "/swarm.npy");
  EXPECT_EQ(mono(dir), read_text(dir + "/swarm.npy")) << "not bit-identical";
  const json& h = s["dispatch"]["hot_cache"];
  EXPECT_GT(h.value("refusals", 0), 0) << s.dump();
  EXPECT_NE(h.value("last_refusal", std::string()).find("layer 0"), std::string::npos) << s.dump();
  EXPECT_NE(s.value("stderr", std::string()).find("hot cache: refused layer 0"), std::string::npos) << s.value("stderr", std::string());
  EXPECT_EQ(s["dispatch"].value("pairs_fallback", 1), 0) << s.dump();
}

}  // namespace
}  // namespace essaim::cli_test
