// SseTimer, the serving benchmark's reader of server-sent events: the same stream gives the same text,
// event times, usage and errors however it is cut into reads (every cut, and seeded random ones that vary),
// with LF or CRLF line ends; chat deltas (content and reasoning) count as text, role-only and usage chunks
// do not; an error event, an event that is not JSON or an endless one fails the request.
#include "sse_load.h"

#include <gtest/gtest.h>

#include <random>
#include <set>

namespace essaim::bench {
namespace {

const std::string kCompletion =
    "data: {\"choices\":[{\"index\":0,\"text\":\"Hel\"}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n"
    "data: {\"choices\":[{\"index\":0,\"text\":\"lo\"}]}\n\n"
    "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":2}}\n\n"
    "data: [DONE]\n\n";

// Feeds `stream` in pieces ending at `cuts`, the i-th piece at time i.
LoadResult feed_cut(const std::string& stream, const std::vector<size_t>& cuts) {
  LoadResult r;
  r.ok = true;
  SseTimer t(r);
  size_t at = 0;
  double now = 0;
  for (size_t c : cuts) {
    t.feed(std::string_view(stream).substr(at, c - at), now++);
    at = c;
  }
  t.feed(std::string_view(stream).substr(at), now);
  return r;
}

TEST(SseTimer, CompletionEventsWholeOrCutAnywhere) {
  const LoadResult whole = feed_cut(kCompletion, {});
  EXPECT_TRUE(whole.ok) << whole.error;
  EXPECT_EQ(whole.text, "Hello");
  EXPECT_EQ(whole.chunk_s.size(), 2u);
  EXPECT_EQ(whole.prompt_tokens, 7);
  EXPECT_EQ(whole.completion_tokens, 2);
  for (size_t cut = 0; cut <= kCompletion.size(); ++cut) {
    const LoadResult r = feed_cut(kCompletion, {cut});
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.text, "Hello");
    EXPECT_EQ(r.chunk_s.size(), 2u);
    EXPECT_EQ(r.completion_tokens, 2);
  }
  // The second text event completes in the second piece when the cut falls before its blank line.
  const size_t second = kCompletion.find("lo\"");
  const LoadResult r = feed_cut(kCompletion, {second});
  EXPECT_EQ(r.first_s, 0);
  EXPECT_EQ(r.chunk_s.back(), 1);
}

TEST(SseTimer, SeededRandomCutsAndCrlfGiveTheSameEvents) {
  std::string crlf;
  for (char c : kCompletion) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
  std::mt19937 rng(5);
  std::set<size_t> pieces_seen;
  for (int trial = 0; trial < 200; ++trial) {
    const std::string& s = trial % 2 ? crlf : kCompletion;
    std::vector<size_t> cuts;
    for (size_t at = 0; (at += 1 + rng() % 17) < s.size();) cuts.push_back(at);
    pieces_seen.insert(cuts.size());
    const LoadResult r = feed_cut(s, cuts);
    EXPECT_TRUE(r.ok);
    EXPECT_EQ(r.text, "Hello");
    EXPECT_EQ(r.chunk_s.size(), 2u);
    EXPECT_EQ(r.completion_tokens, 2);
  }
  EXPECT_GT(pieces_seen.size(), 5u);  // the cuts did vary
}

TEST(SseTimer, ChatDeltasCountContentAndReasoning) {
  const LoadResult r = feed_cut(
      "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hm\"}}]}\n\n"
      "data: {\"choices\":[{\"delta\":{\"content\":\"ok\"}}]}\n\n",
      {});
  EXPECT_TRUE(r.ok);
  EXPECT_EQ(r.text, "hmok");
  EXPECT_EQ(r.chunk_s.size(), 2u);
  EXPECT_EQ(r.completion_tokens, -1);  // no usage chunk
}

TEST(SseTimer, ErrorsFailTheRequest) {
  const LoadResult e = feed_cut("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"error\":{\"message\":\"x\"}}\n\n", {});
  EXPECT_FALSE(e.ok);
  EXPECT_NE(e.error.find("error event"), std::string::npos);
  const LoadResult garbage = feed_cut("data: {not json\n\n", {});
  EXPECT_FALSE(garbage.ok);
  const LoadResult endless = feed_cut("data: " + std::string(SseTimer::kMaxEventBytes + 10, 'a'), {});
  EXPECT_FALSE(endless.ok);
  EXPECT_NE(endless.error.find("longer than"), std::string::npos);
}

}  // namespace
}  // namespace essaim::bench
