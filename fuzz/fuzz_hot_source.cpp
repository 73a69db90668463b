// libFuzzer target for what the backbone's hot-expert cache reads from a coordinator's slice server: the
// input is a slice file served byte range by byte range through SliceServerSource (its header parsed from a
// prefix, then the slabs of the experts the router picks), and HotExpertCache checks and inserts what
// comes back (digest, slab shapes, layer validation). Any input must end in experts refused or failed with
// a message, or inserted within the budget — never a crash, a read outside the input, or an over-budget
// cache.
//
//   build-fuzz/fuzz/fuzz_hot_source -max_total_time=60 fuzz/corpus/fuzz_hot_source
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "backbone/hot_expert_cache.h"
#include "backbone/slice_server_source.h"
#include "slice/expert_slice.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim;
  using namespace essaim::backbone;
  const std::vector<uint8_t> file(data, data + size);
  // The catalogue entry the coordinator would give: the range the header claims when it parses (so the
  // fuzzer reaches the slab reads), else a made-up one.
  SliceRef ref{.layer = 0, .expert_first = 0, .expert_count = 1, .target = "/slices/x.gguf", .bytes = size};
  ModelIdentity model{};
  if (Result<GgufFile> f = GgufFile::parse(file); f) {
    if (Result<ExpertSlice> s = ExpertSlice::from_gguf(std::move(*f)); s) {
      ref.layer = s->layer_first();
      ref.expert_first = s->expert_first();
      ref.expert_count = std::min<uint32_t>(s->expert_count(), 4);
      model = s->source_model();
    }
  }
  auto fetch = [&file](const std::string&, uint64_t offset, uint64_t length) -> Result<std::vector<uint8_t>> {
    if (offset > file.size() || length > file.size() - offset) return Status::error("past the end");
    return std::vector<uint8_t>(file.begin() + std::ptrdiff_t(offset), file.begin() + std::ptrdiff_t(offset + length));
  };
  const uint64_t budget = 1u << 20;
  HotCacheOptions options;
  options.budget_bytes = budget;
  options.window_steps = 4;
  HotExpertCache cache(std::make_unique<SliceServerSource>(model, std::vector<SliceRef>{ref}, fetch), options);
  std::vector<int32_t> ids;
  for (uint32_t e = 0; e < ref.expert_count; ++e) ids.insert(ids.end(), 2, int32_t(ref.expert_first + e));
  cache.observe(ExpertBatch{.layer = int32_t(ref.layer), .n_rows = int64_t(ids.size()), .k = 1,
                            .act_type = GgmlType::F32, .act = {}, .ids = ids});
  cache.step();
  const HotCacheReport r = cache.report();
  if (r.bytes_held > budget) std::abort();
  if (r.refusals > 0 && r.last_refusal.empty()) std::abort();
  for (const ExpertKey& k : cache.snapshot()->keys())
    if (uint32_t(k.layer) != ref.layer || cache.snapshot()->store().find(k.layer, k.expert) == nullptr) std::abort();
  return 0;
}
