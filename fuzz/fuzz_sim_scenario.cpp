// libFuzzer target for essaim-sim's scenario parser (sim/scenario.h): any bytes as a scenario document must
// give a scenario or an error, never a crash; an accepted scenario holds what the simulation relies on
// (counts >= 1, at least one class, shares adding up to more than 0) and reads back the same from its JSON.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "sim/scenario.h"

namespace {
void require(bool ok) {
  if (!ok) std::abort();
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim::sim;
  const std::string text(reinterpret_cast<const char*>(data), size);
  essaim::Result<Scenario> s = parse_scenario(text);
  if (!s) return 0;
  require(s->workers >= 1 && s->backbones >= 1 && s->hours > 0 && s->replicas >= 1 && !s->classes.empty());
  double shares = 0;
  for (const DeviceClass& c : s->classes) shares += c.share;
  require(shares > 0);
  essaim::Result<Scenario> again = parse_scenario(scenario_json(*s));
  require(again && scenario_json(*again) == scenario_json(*s));
  return 0;
}
