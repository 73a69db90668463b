// libFuzzer target for what a worker and a coordinator read from the network about slices: the first byte
// picks the parser. 'M' + bytes: a manifest (JSON); anything else: a GGUF file opened as an expert slice.
// Any input must give an error value that says why, or a slice whose every held expert slab lies inside the
// input (and whose recorded expert digests are checked against those slabs), and a manifest that
// re-serialises and re-parses to itself.
//
//   build-fuzz/fuzz/fuzz_slice -max_total_time=60 build-fuzz/corpus/fuzz_slice
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "slice/expert_slice.h"
#include "slice/slice_manifest.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim;
  if (size > 0 && data[0] == 'M') {
    Result<SliceManifest> m = SliceManifest::parse({reinterpret_cast<const char*>(data) + 1, size - 1});
    if (!m) {
      if (m.status().message().empty()) std::abort();
      return 0;
    }
    Result<SliceManifest> again = SliceManifest::parse(m->to_json());
    if (!again || again->to_json() != m->to_json()) std::abort();
    return 0;
  }
  Result<GgufFile> f = GgufFile::parse({data, size});
  if (!f) return 0;  // fuzz_gguf covers the reader itself
  Result<ExpertSlice> s = ExpertSlice::from_gguf(std::move(*f));
  if (!s) {
    if (s.status().message().empty()) std::abort();
    return 0;
  }
  uint64_t sum = 0;
  for (uint32_t layer = s->layer_first(); layer - s->layer_first() < s->layer_count(); ++layer) {
    const MoeLayer* l = s->layer(layer);
    if (l == nullptr) std::abort();
    for (const GgufTensor* t : l->tensors) {
      if (t == nullptr) continue;
      if (t->ne[2] != int64_t(s->expert_count())) std::abort();
      for (uint32_t j = 0; j < s->expert_count(); ++j) {
        const std::span<const uint8_t> slab = t->expert_slab(j);
        if (slab.data() < data || slab.data() + slab.size() > data + size) std::abort();
        sum += slab.front() + slab.back();
      }
    }
  }
  // The digests recorded in the header against the slabs: an error value (never a crash) when they differ.
  if (Status v = s->verify_digests(); !v && v.message().empty()) std::abort();
  volatile uint64_t sink = sum;
  (void)sink;
  return 0;
}
