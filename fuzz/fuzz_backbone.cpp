// libFuzzer target for a backbone file's expert records (slice/backbone_experts.h): a GGUF file that a
// backbone loads with --backbone-file. Any input must give an error value that says why, or records whose
// shape-only tensors are consistent with them (one per kind per MoE layer, ne[2] = expert_count, sizes that
// do not wrap) and can be added to the file once and only once.
//
//   build-fuzz/fuzz/fuzz_backbone -max_total_time=60 build-fuzz/corpus/fuzz_backbone
#include <cstdint>
#include <cstdlib>

#include "slice/backbone_experts.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim;
  Result<GgufFile> f = GgufFile::parse({data, size});
  if (!f) return 0;  // fuzz_gguf covers the reader itself
  Result<BackboneExperts> b = read_backbone_experts(*f);
  if (!b) {
    if (b.status().message().empty()) std::abort();
    return 0;
  }
  if (b->digests.size() != b->layers.size()) std::abort();
  for (const std::vector<Sha256Digest>& d : b->digests)
    if (d.size() != b->expert_count) std::abort();
  const std::vector<GgufTensor> shapes = b->shape_tensors();
  if (shapes.size() != b->layers.size() * (b->gate_up_fused ? 2 : 3)) std::abort();
  for (const GgufTensor& t : shapes)
    if (t.ne[2] != int64_t(b->expert_count) || t.nbytes == 0 || t.data != nullptr) std::abort();
  if (!f->add_shape_only_tensors(shapes)) std::abort();
  if (f->add_shape_only_tensors(shapes)) std::abort();  // the second time every name is taken
  return 0;
}
