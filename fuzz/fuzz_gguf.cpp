// libFuzzer target for the GGUF reader: any bytes must parse into an error value or into a file whose every
// tensor view and expert slab lies inside the input (ASan watches each byte read), and whatever parses must
// render through inspect, text and JSON, without throwing.
//
//   build-fuzz/fuzz/fuzz_gguf -max_total_time=60 build-fuzz/corpus/fuzz_gguf
#include <cstdint>
#include <cstdlib>

#include "gguf/gguf_file.h"
#include "gguf/gguf_inspect.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace essaim;
  Result<GgufFile> f = GgufFile::parse({data, size});
  if (!f) {
    if (f.status().message().empty()) std::abort();  // every refusal says why
    return 0;
  }
  uint64_t sum = 0;
  for (const GgufTensor& t : f->tensors()) {
    if (t.file_offset + t.nbytes > size || t.data != data + t.file_offset) std::abort();
    for (uint8_t b : t.bytes()) sum += b;
    if (gguf_is_expert_tensor(t))
      for (int64_t e = 0; e < t.ne[2]; ++e) sum += t.expert_slab(e).front();
  }
  const std::string text = gguf_inspect_text(*f, {});
  const std::string json = gguf_inspect_json(*f, {.full_arrays = true}).dump();
  volatile uint64_t sink = sum + text.size() + json.size();
  (void)sink;
  return 0;
}
