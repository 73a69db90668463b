#include "sse_load.h"

#include <atomic>
#include <nlohmann/json.hpp>
#include <thread>

#include "net/http_client.h"

namespace essaim::bench {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// The text an event carries: a completion's choices[0].text, or a chat delta's content or reasoning.
std::string event_text(const json& e) {
  if (!e.contains("choices") || !e["choices"].is_array() || e["choices"].empty()) return {};
  const json& c = e["choices"][0];
  std::string text;
  if (c.contains("text") && c["text"].is_string()) text += c["text"].get<std::string>();
  if (c.contains("delta") && c["delta"].is_object())
    for (const char* k : {"reasoning_content", "content"})
      if (c["delta"].contains(k) && c["delta"][k].is_string()) text += c["delta"][k].get<std::string>();
  return text;
}

void run_one(const LoadOptions& o, const LoadRequest& r, Clock::time_point t0, LoadResult& out) {
  const auto since = [t0] { return std::chrono::duration<double>(Clock::now() - t0).count(); };
  std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(r.arrival_s)));
  net::HttpCall call;
  call.method = "POST";
  call.target = o.target;
  call.body = r.body;
  call.deadline = std::chrono::milliseconds(30'000);
  call.read_timeout = o.timeout;
  SseTimer timer(out);
  out.ok = true;
  out.sent_s = since();
  int status = 0;
  std::string refusal;  // the body of an answer other than 200
  const Status s = net::http_stream(
      {.host = o.host, .port = o.port, .base_path = {}}, call,
      [&](const net::HttpAnswer& head) {
        status = head.status;
        return Status::ok();
      },
      [&](std::span<const char> bytes) {
        if (status != 200) refusal.append(bytes.data(), std::min<size_t>(bytes.size(), 4096 - std::min<size_t>(refusal.size(), 4096)));
        else timer.feed(std::string_view(bytes.data(), bytes.size()), since());
        return Status::ok();
      });
  out.done_s = since();
  if (status != 200) out.ok = false, out.error = "HTTP status " + std::to_string(status) + ": " + refusal;
  if (!s) out.ok = false, out.error = s.message();
  if (out.ok && out.chunk_s.empty()) out.ok = false, out.error = "no text in the stream";
}

}  // namespace

void SseTimer::feed(std::string_view bytes, double now_s) {
  for (char c : bytes)
    if (c != '\r') pending_ += c;
  if (pending_.size() > kMaxEventBytes && pending_.find("\n\n") == std::string::npos) {
    into_.ok = false, into_.error = "an event longer than " + std::to_string(kMaxEventBytes) + " bytes";
    pending_.clear();
    return;
  }
  for (size_t end; (end = pending_.find("\n\n")) != std::string::npos;) {
    std::string data;
    size_t line = 0;
    while (line < end) {
      const size_t nl = std::min(pending_.find('\n', line), end);
      std::string_view l(pending_.data() + line, nl - line);
      if (l.rfind("data:", 0) == 0) {
        l.remove_prefix(5);
        if (!l.empty() && l.front() == ' ') l.remove_prefix(1);
        data += l;
      }
      line = nl + 1;
    }
    pending_.erase(0, end + 2);
    if (!data.empty()) event(data, now_s);
  }
}

void SseTimer::event(std::string_view data, double now_s) {
  if (data == "[DONE]") return;
  const json e = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (e.is_discarded() || !e.is_object()) {
    into_.ok = false, into_.error = "an event that is not JSON: " + std::string(data.substr(0, 200));
    return;
  }
  if (e.contains("error")) {
    into_.ok = false, into_.error = "error event: " + e["error"].dump();
    return;
  }
  if (e.contains("usage") && e["usage"].is_object()) {
    into_.prompt_tokens = e["usage"].value("prompt_tokens", int64_t(-1));
    into_.completion_tokens = e["usage"].value("completion_tokens", int64_t(-1));
  }
  const std::string text = event_text(e);
  if (text.empty()) return;
  if (into_.chunk_s.empty()) into_.first_s = now_s;
  into_.chunk_s.push_back(now_s);
  into_.text += text;
}

std::vector<LoadResult> run_streaming_load(const LoadOptions& options, std::span<const LoadRequest> requests) {
  std::vector<LoadResult> results(requests.size());
  std::atomic<size_t> next{0};
  const Clock::time_point t0 = Clock::now();
  std::vector<std::thread> clients;
  const size_t n = std::min(requests.size(), size_t(std::max(1, options.max_in_flight)));
  for (size_t c = 0; c < n; ++c)
    clients.emplace_back([&] {
      for (size_t i; (i = next.fetch_add(1)) < requests.size();) run_one(options, requests[i], t0, results[i]);
    });
  for (std::thread& t : clients) t.join();
  return results;
}

}  // namespace essaim::bench
