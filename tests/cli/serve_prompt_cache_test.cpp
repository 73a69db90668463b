// `essaim serve --cache-ram` as a process, through HTTP, on the trained model: chat requests that share a long
// system prompt, and one sent twice, get from a server with the prompt cache exactly the answers a server
// without it gives, and /metrics counts the hits and the tokens reused. (That a hit is faster is measured by
// bench/prompt_cache_bench, not tested.)
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace essaim::cli_test {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;

const std::string kModel = std::string(ESSAIM_SOURCE_DIR) + "/models/kjv-moe-q4_k_m.gguf";

std::string base(uint16_t port) { return "http://127.0.0.1:" + std::to_string(port); }

bool wait_ready(uint16_t port) {
  const auto end = std::chrono::steady_clock::now() + 60s;
  while (std::chrono::steady_clock::now() < end) {
    if (run_cli("curl -sf -m 10 -o /dev/null " + base(port) + "/health").code == 0) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// The answer's text, finish reason and token counts: what must not change with the cache.
std::string chat(uint16_t port, const std::string& dir, const std::string& system, const std::string& user) {
  const std::string body_path = dir + "/body.json";
  std::ofstream(body_path) << json({{"messages", {{{"role", "system"}, {"content", system}},
                                                  {{"role", "user"}, {"content", user}}}},
                                    {"max_tokens", 24},
                                    {"temperature", 0}})
                                  .dump();
  const CliRun r = run_cli("curl -s -m 120 -H 'Content-Type: application/json' -d @" + body_path + " " + base(port) +
                           "/v1/chat/completions");
  const json j = json::parse(r.out, nullptr, false);
  if (!j.is_object() || !j.contains("choices")) return "<no answer: " + r.out + r.err + ">";
  return j["choices"][0]["message"]["content"].get<std::string>() + "|" +
         j["choices"][0]["finish_reason"].get<std::string>() + "|" + j["usage"].dump();
}

// The value of one sample line of /metrics ("NAME{labels} VALUE"), or -1.
double metric(uint16_t port, const std::string& sample) {
  const std::string text = run_cli("curl -s -m 10 " + base(port) + "/metrics").out;
  const size_t at = text.find("\n" + sample + " ");
  if (at == std::string::npos) return -1;
  return std::atof(text.c_str() + at + 1 + sample.size() + 1);
}

TEST(ServeProcess, PromptCacheGivesTheUncachedAnswersAndMetricsCountItsHits) {
  const std::string flags = " --port 0 -np 2 -t 1 -c 2048 --no-access-log";
  BackgroundProcess cached("essaim serve -m " + kModel + flags + " -cram 64");
  BackgroundProcess plain("essaim serve -m " + kModel + flags + " --cache-ram 0");
  ASSERT_NE(cached.port(), 0) << cached.stderr_text();
  ASSERT_NE(plain.port(), 0) << plain.stderr_text();
  ASSERT_TRUE(wait_ready(cached.port())) << cached.stderr_text();
  ASSERT_TRUE(wait_ready(plain.port())) << plain.stderr_text();

  // ~900 tokens of system prompt: the second request resumes past its checkpoints at 256, 512 and 768.
  std::string system = "Thou art a scribe of the king, and thou shalt answer in the words of the book.";
  for (int i = 0; i < 24; ++i)
    system += " And the LORD spake unto Moses, saying, Speak unto the children of Israel, and say unto them, " +
              std::to_string(i) + ": the land whereon thou standest is holy ground.";
  const std::string dir = make_temp_dir("serve-prompt-cache");
  const std::vector<std::string> users = {"Who spake unto Moses?", "And what did the children of Israel say?",
                                          "Who spake unto Moses?"};  // the last: the first request again
  std::vector<std::string> want, got;
  for (const std::string& u : users) {
    want.push_back(chat(plain.port(), dir, system, u));
    got.push_back(chat(cached.port(), dir, system, u));
  }
  for (size_t i = 0; i < users.size(); ++i) EXPECT_EQ(got[i], want[i]) << "request " << i;
  EXPECT_NE(want[0], want[1]);  // different questions, different answers: the comparison means something

  EXPECT_EQ(metric(cached.port(), "essaim_serve_prompt_cache_lookups_total{result=\"hit\"}"), 2);
  EXPECT_EQ(metric(cached.port(), "essaim_serve_prompt_cache_lookups_total{result=\"miss\"}"), 1);
  // The third request resumes a token before its end; the second from the last checkpoint (every 256 tokens)
  // within the system prompt, whose end is at most ~20 tokens before the first prompt's.
  const json usage = json::parse(want[0].substr(want[0].rfind('|') + 1));
  const int prompt = usage["prompt_tokens"].get<int>();
  ASSERT_GT(prompt, 800);
  EXPECT_EQ(metric(cached.port(), "essaim_serve_prompt_cache_tokens_reused_total"),
            (prompt - 1) + (prompt - 20) / 256 * 256);
  EXPECT_EQ(metric(cached.port(), "essaim_serve_prompt_cache_bytes{kind=\"budget\"}"), 64.0 * 1024 * 1024);
  EXPECT_EQ(metric(plain.port(), "essaim_serve_prompt_cache_lookups_total{result=\"hit\"}"), 0);
  EXPECT_EQ(metric(plain.port(), "essaim_serve_prompt_cache_lookups_total{result=\"miss\"}"), 0);
}

}  // namespace
}  // namespace essaim::cli_test
