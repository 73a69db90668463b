// A backbone that holds only the dense path (`--backbone-file`, docs/dispatch.md "A backbone without the
// experts"): the file `essaim slice --backbone` writes, plus essaim-worker processes serving every expert,
// gives the monolithic full-model logits bit for bit (qwen3moe and qwen35moe, Q4_K_M, f32 and bf16 expert
// outputs, and the 122B-shaped synth layer); a killed worker whose slices have another replica changes no
// bit; when every replica of an expert is gone the request fails with a message naming the layer and
// experts, in bounded time, and `serve` carries on. Each test prints the mapped bytes against the full file.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <memory>
#include <thread>
#include <nlohmann/json.hpp>
#include <vector>

#include "cli_test_util.h"

namespace essaim::cli_test {
namespace {

using Clock = std::chrono::steady_clock;

std::string addr(const BackgroundProcess& w) { return "127.0.0.1:" + std::to_string(w.port()); }

// A synthetic model cut into one-layer slices of `per_slice` experts and a backbone file.
struct CutModel {
  std::string model;
  std::string slices;
  std::string backbone;
};

CutModel cut_model(const std::string& name, const std::string& synth_args, int per_slice) {
  CutModel c;
  const std::string dir = make_temp_dir(name);
  c.model = dir + "/model.gguf";
  c.slices = dir + "/slices";
  const CliRun s = run_cli("essaim synth " + synth_args + " -o " + c.model, "", 600);
  EXPECT_EQ(s.code, 0) << s.err;
  const CliRun p = run_cli("essaim slice -m " + c.model + " --plan " + std::to_string(per_slice) +
                               " --backbone --stem m -o " + c.slices, "", 600);
  EXPECT_EQ(p.code, 0) << p.err;
  c.backbone = c.slices + "/m.backbone.gguf";
  return c;
}

// Workers serving the given expert ranges of every layer, and the --worker flags naming them.
struct Workers {
  std::vector<std::unique_ptr<BackgroundProcess>> procs;
  std::string flags;
};
Workers start_workers(const std::string& slices, const std::vector<std::string>& ranges) {
  Workers w;
  for (const std::string& r : ranges) {
    w.procs.push_back(std::make_unique<BackgroundProcess>("essaim-worker --slices " + slices + " --experts " + r +
                                                          " --port 0 -q"));
    EXPECT_NE(w.procs.back()->port(), 0) << w.procs.back()->stderr_text();
    w.flags += " --worker " + addr(*w.procs.back());
  }
  return w;
}

uint64_t file_bytes(const std::string& p) { return std::filesystem::file_size(p); }

// Teacher-forced logits of the same prompt, monolithic from the full file and from the backbone file over
// the workers: the two .npy files must be byte-identical (header and every float).
void expect_same_logits(const CutModel& c, const std::vector<std::string>& ranges, const std::string& extra) {
  const std::string dir = make_temp_dir("eval");
  const std::string prompt = " -p 'Once upon a time, a small model said' ";
  const CliRun mono = run_cli("essaim eval -m " + c.model + prompt + extra + " --logits-out " + dir + "/mono.npy");
  ASSERT_EQ(mono.code, 0) << mono.err;
  Workers w = start_workers(c.slices, ranges);
  const CliRun swarm = run_cli("essaim eval --backbone-file " + c.backbone + prompt + extra + w.flags +
                               " --require-workers --logits-out " + dir + "/swarm.npy");
  ASSERT_EQ(swarm.code, 0) << swarm.err;
  const std::string a = read_text(dir + "/mono.npy"), b = read_text(dir + "/swarm.npy");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the backbone file over workers must give the monolithic logits bit for bit";
  EXPECT_NE(swarm.err.find("backbone file"), std::string::npos) << swarm.err;
  EXPECT_NE(swarm.err.find("peak resident"), std::string::npos) << swarm.err;
  const size_t at = swarm.err.find("backbone file ", swarm.err.find("peak resident") - 60);
  std::printf("[ memory   ] %s", swarm.err.substr(at, swarm.err.find('\n', at) - at + 1).c_str());
  std::printf("[ mapped   ] backbone file %llu bytes, full model %llu bytes (%.1f%%)\n",
              (unsigned long long)file_bytes(c.backbone), (unsigned long long)file_bytes(c.model),
              100.0 * double(file_bytes(c.backbone)) / double(file_bytes(c.model)));
}

TEST(BackboneFile, Qwen3MoeOverThreeWorkersEqualsTheFullModel) {
  const CutModel c = cut_model("q3", "--arch qwen3moe --preset tiny --types q4_k_m --seed 5", 2);
  expect_same_logits(c, {"0-1", "2-3", "4-5"}, "");
}

TEST(BackboneFile, Qwen3MoeBf16OutputsEqualTheFullModelInThatMode) {
  const CutModel c = cut_model("q3bf", "--arch qwen3moe --preset tiny --types q4_k_m --seed 6", 3);
  expect_same_logits(c, {"0-2", "3-5"}, " --expert-output bf16");
}

TEST(BackboneFile, Qwen35MoeFusedWithAnMtpBlockOverThreeWorkersEqualsTheFullModel) {
  const CutModel c =
      cut_model("q35", "--arch qwen35moe --preset tiny --types q4_k_m --seed 7 --fused-gate-up --nextn 1", 2);
  expect_same_logits(c, {"0-1", "2-3", "4-5"}, "");
}

// The trained model of models/ (readable text, a router with real skew), its Q4_K_M file cut into slices of
// 11 experts: three workers hold every expert of every layer, the backbone none, so every pair is remote.
CutModel cut_shipped(const std::string& name, const std::string& file, int per_slice) {
  CutModel c;
  const std::string dir = make_temp_dir(name);
  c.model = std::string(ESSAIM_SOURCE_DIR) + "/models/" + file;
  c.slices = dir + "/slices";
  const CliRun p = run_cli("essaim slice -m " + c.model + " --plan " + std::to_string(per_slice) +
                               " --backbone --stem m -o " + c.slices, "", 600);
  EXPECT_EQ(p.code, 0) << p.err;
  c.backbone = c.slices + "/m.backbone.gguf";
  return c;
}

TEST(BackboneFile, TheTrainedModelOverThreeWorkersEqualsTheFullModel) {
  const CutModel c = cut_shipped("trained", "kjv-moe-q4_k_m.gguf", 11);
  expect_same_logits(c, {"0-10", "11-21", "22-31"}, "");
}

// `essaim perplexity` of the held-out text: the same figure, to the last digit, from the backbone file over
// workers as from the full file; and far below what a unigram model scores (models/README.md).
TEST(BackboneFile, TheTrainedModelsPerplexityThroughWorkersIsTheMonolithicOne) {
  const CutModel c = cut_shipped("trained_ppl", "kjv-moe-q4_k_m.gguf", 16);
  const std::string args = " -f " + std::string(ESSAIM_SOURCE_DIR) + "/models/heldout.txt -c 128 --chunks 3 --json";
  const CliRun mono = run_cli("essaim perplexity -m " + c.model + args);
  ASSERT_EQ(mono.code, 0) << mono.err;
  Workers w = start_workers(c.slices, {"0-15", "16-31"});
  const CliRun swarm = run_cli("essaim perplexity --backbone-file " + c.backbone + args + w.flags + " --require-workers");
  ASSERT_EQ(swarm.code, 0) << swarm.err;
  EXPECT_NE(mono.err.find("Final estimate: PPL = "), std::string::npos) << mono.err;
  EXPECT_NE(mono.err.find("[1]"), std::string::npos) << mono.err;
  const auto ppl = [](const std::string& out) { return nlohmann::json::parse(out).at("ppl").get<double>(); };
  EXPECT_EQ(ppl(mono.out), ppl(swarm.out));
  EXPECT_LT(ppl(mono.out), 100.0) << "the unigram baseline of the held-out text is ~300 (models/README.md)";
}

// `--router-stats` where the answer is known: a tiny synth model whose router skew (100: the top expert's logit
// +100, the second's +50, the third's +33) makes every token pick the same two experts of 6 in every layer, so
// each layer's usage entropy is exactly 1 bit, the top ceil(6/10) = 1 expert takes half the picks, and every
// token reuses both of the previous token's experts.
TEST(Perplexity, RouterStatsOfARouterThatAlwaysPicksTheSameTwo) {
  const std::string dir = make_temp_dir("router_stats");
  const CliRun s = run_cli("essaim synth --arch qwen3moe --preset tiny --types f32 --router-skew 100 -o " + dir +
                           "/m.gguf");
  ASSERT_EQ(s.code, 0) << s.err;
  const CliRun r = run_cli("essaim perplexity -m " + dir + "/m.gguf -f " + std::string(ESSAIM_SOURCE_DIR) +
                           "/models/heldout.txt -c 64 --chunks 3 --router-stats --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j.at("router").size(), 2u);  // tiny qwen3moe: 2 MoE layers
  for (const nlohmann::json& l : j.at("router")) {
    EXPECT_EQ(l.at("tokens").get<int>(), 3 * 64);
    EXPECT_NEAR(l.at("entropy_bits").get<double>(), 1.0, 1e-12) << l.dump();
    EXPECT_NEAR(l.at("max_entropy_bits").get<double>(), std::log2(6.0), 1e-12);
    EXPECT_EQ(l.at("top_experts").get<int>(), 1);
    EXPECT_NEAR(l.at("top_share").get<double>(), 0.5, 1e-12);
    EXPECT_NEAR(l.at("reuse").get<double>(), 1.0, 1e-12);
    uint64_t picks = 0;
    for (const nlohmann::json& c : l.at("picks")) picks += c.get<uint64_t>();
    EXPECT_EQ(picks, 3u * 64u * 2u);
  }
}

TEST(BackboneFile, The122bShapedLayerThroughWorkersEqualsTheFullModel) {
  const auto t0 = Clock::now();
  const CutModel c = cut_model("q122", "--arch qwen3moe --preset q35-122b --layers 1 --types q4_k_m --seed 2", 128);
  const double cut_s = std::chrono::duration<double>(Clock::now() - t0).count();
  expect_same_logits(c, {"0-127", "128-255"}, " -t 2");
  const double total_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::printf("[ timing   ] 122B-shaped layer: synth + slice %.1f s, whole test %.1f s\n", cut_s, total_s);
  std::filesystem::remove_all(std::filesystem::path(c.model).parent_path());  // ~3 GB with its slices
}

TEST(BackboneFile, WithoutASwarmOrWithAFullModelItIsRefused) {
  const CutModel c = cut_model("refuse", "--arch qwen3moe --preset tiny --types q4_k_m --seed 8", 3);
  CliRun r = run_cli("essaim run --backbone-file " + c.backbone + " -p Hi -n 2");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("holds no experts"), std::string::npos) << r.err;
  r = run_cli("essaim eval --backbone-file " + c.backbone + " -m " + c.model + " -p Hi --logits-out x.npy");
  EXPECT_EQ(r.code, 2) << r.err;
  r = run_cli("essaim run -m " + c.backbone + " -p Hi -n 2");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("--backbone-file"), std::string::npos) << r.err;
  r = run_cli("essaim run --backbone-file " + c.model + " -p Hi -n 2 --worker 127.0.0.1:1");
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("not an essaim backbone file"), std::string::npos) << r.err;
  r = run_cli("essaim run --backbone-file " + c.backbone + " -p Hi -n 2 --worker 127.0.0.1:1 --worker-audit 4");
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_NE(r.err.find("--worker-audit"), std::string::npos) << r.err;
}

// A run whose experts lack a replica fails, naming the layer and the experts, and does not hang.
TEST(BackboneFile, ExpertsWithoutALiveReplicaFailTheRunWithTheirNames) {
  const CutModel c = cut_model("missing", "--arch qwen3moe --preset tiny --types q4_k_m --seed 9", 3);
  Workers w = start_workers(c.slices, {"0-2"});
  const auto t0 = Clock::now();
  const CliRun r = run_cli("essaim run --backbone-file " + c.backbone + " -p 'Once upon' -n 8 --temp 0" + w.flags +
                           " --worker-timeout-ms 500", "", 60);
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(r.code, 1) << r.err;
  EXPECT_NE(r.err.find("no live worker holds"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("layer 0"), std::string::npos) << r.err;
  EXPECT_LT(s, 30.0) << "bounded by the deadline, not a hang";
}

std::string completion(uint16_t port, int max_tokens) {
  const std::string body = nlohmann::json{{"prompt", "Once upon a time"}, {"max_tokens", max_tokens},
                                          {"temperature", 0}}.dump();
  const CliRun r = run_cli("curl -s -m 60 -o - -w '\\n%{http_code}' -H 'Content-Type: application/json' -d '" + body +
                           "' http://127.0.0.1:" + std::to_string(port) + "/v1/completions");
  return r.out;
}

// The HTTP status (last line) and the generated text of a completion answer.
std::pair<int, std::string> status_and_text(const std::string& answer) {
  const size_t nl = answer.find_last_of('\n');
  if (nl == std::string::npos) return {0, answer};
  const int status = std::atoi(answer.c_str() + nl + 1);
  const nlohmann::json j = nlohmann::json::parse(answer.substr(0, nl), nullptr, false);
  if (status == 200 && j.contains("choices")) return {status, j["choices"][0]["text"].get<std::string>()};
  return {status, answer.substr(0, nl)};
}

// `essaim serve` listens before it loads (503 "loading" until then): wait, bounded, for /health 200.
bool wait_until_loaded(uint16_t port) {
  for (int i = 0; i < 300; ++i) {
    const CliRun h = run_cli("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:" + std::to_string(port) + "/health");
    if (h.out == "200") return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

TEST(BackboneFile, ServeSurvivesAKilledReplicaBitForBitAndFailsOnlyTheStepsWithNoReplicaLeft) {
  const CutModel c = cut_model("serve", "--arch qwen3moe --preset tiny --types q4_k_m --seed 10", 3);
  BackgroundProcess mono("essaim serve -m " + c.model + " --port 0 -np 1");
  ASSERT_NE(mono.port(), 0) << mono.stderr_text();
  ASSERT_TRUE(wait_until_loaded(mono.port())) << mono.stderr_text();
  const auto [mono_status, want] = status_and_text(completion(mono.port(), 12));
  ASSERT_EQ(mono_status, 200) << want;

  // Two full replicas (each worker holds every expert); the first killed between requests.
  Workers w = start_workers(c.slices, {"0-5", "0-5"});
  BackgroundProcess serve("essaim serve --backbone-file " + c.backbone + " --port 0 -np 1 --worker-timeout-ms 2000" +
                          w.flags);
  ASSERT_NE(serve.port(), 0) << serve.stderr_text();
  ASSERT_TRUE(wait_until_loaded(serve.port())) << serve.stderr_text();
  auto [s1, t1] = status_and_text(completion(serve.port(), 12));
  EXPECT_EQ(s1, 200) << t1 << serve.stderr_text();
  EXPECT_EQ(t1, want) << "the backbone file over two replicas writes the monolithic text";
  ASSERT_EQ(::kill(w.procs[0]->pid(), SIGKILL), 0);
  auto [s2, t2] = status_and_text(completion(serve.port(), 12));
  EXPECT_EQ(s2, 200) << t2 << serve.stderr_text();
  EXPECT_EQ(t2, want) << "one replica killed: the other serves, the same bits";

  // The last replica gone: the request fails with the layer and experts named, in bounded time.
  ASSERT_EQ(::kill(w.procs[1]->pid(), SIGKILL), 0);
  const auto t0 = Clock::now();
  auto [s3, t3] = status_and_text(completion(serve.port(), 12));
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(s3, 500) << t3;
  EXPECT_NE(t3.find("layer 0"), std::string::npos) << t3;
  EXPECT_NE(t3.find("expert"), std::string::npos) << t3;
  EXPECT_LT(secs, 30.0);
  // The server carries on and says why it cannot serve: /health 503 (issue 45), and the next request is
  // answered (with the same error).
  const CliRun health = run_cli("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:" + std::to_string(serve.port()) + "/health");
  EXPECT_EQ(health.out, "503");
  EXPECT_EQ(status_and_text(completion(serve.port(), 4)).first, 500);
}

// serve --no-mmap (the model read into private memory) answers with the mapped server's text.
TEST(BackboneFile, ServeWithNoMmapWritesTheMappedServersText) {
  const CutModel c = cut_model("serve-no-mmap", "--arch qwen3moe --preset tiny --types q4_k_m --seed 11", 2);
  BackgroundProcess mapped("essaim serve -m " + c.model + " --port 0 -np 1");
  BackgroundProcess copied("essaim serve -m " + c.model + " --port 0 -np 1 --no-mmap");
  ASSERT_NE(mapped.port(), 0) << mapped.stderr_text();
  ASSERT_NE(copied.port(), 0) << copied.stderr_text();
  ASSERT_TRUE(wait_until_loaded(mapped.port())) << mapped.stderr_text();
  ASSERT_TRUE(wait_until_loaded(copied.port())) << copied.stderr_text();
  const auto [s1, want] = status_and_text(completion(mapped.port(), 12));
  const auto [s2, got] = status_and_text(completion(copied.port(), 12));
  ASSERT_EQ(s1, 200) << want;
  EXPECT_EQ(s2, 200) << got;
  EXPECT_EQ(got, want);
}

}  // namespace
}  // namespace essaim::cli_test
