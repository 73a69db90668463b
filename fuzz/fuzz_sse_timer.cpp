// libFuzzer target for the serving benchmark's reader of server-sent events (bench/support/sse_load.h): any
// bytes, cut into reads at the places byte 0 picks, must give a result (events, text, usage, or an error),
// never a crash; the same bytes whole and cut give the same text and the same number of text events, and
// an accepted stream's event times never go backwards.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "sse_load.h"

namespace {

void require(bool ok) {
  if (!ok) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using essaim::bench::LoadResult;
  using essaim::bench::SseTimer;
  if (size == 0) return 0;
  const size_t step = 1 + data[0] % 31;
  const std::string_view stream(reinterpret_cast<const char*>(data + 1), size - 1);
  LoadResult whole, cut;
  whole.ok = cut.ok = true;
  SseTimer(whole).feed(stream, 0);
  SseTimer timer(cut);
  double now = 0;
  for (size_t at = 0; at < stream.size(); at += step) timer.feed(stream.substr(at, step), now++);
  require(whole.ok == cut.ok);
  if (whole.ok) {
    require(whole.text == cut.text);
    require(whole.chunk_s.size() == cut.chunk_s.size());
    for (size_t i = 1; i < cut.chunk_s.size(); ++i) require(cut.chunk_s[i] >= cut.chunk_s[i - 1]);
  }
  return 0;
}
