#include "cli/model_load.h"

#include <algorithm>

#include "core/mapped_file.h"
#include "core/progress.h"

namespace essaim::cli {
namespace {

// Touches one byte of every page, chunk by chunk, so the file is in the page cache afterwards.
Status read_into_memory(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(const MappedFile f, MappedFile::open(path));
  constexpr size_t kChunk = size_t(16) << 20;
  constexpr size_t kPage = 4096;
  Progress progress("reading " + path, f.size());
  const std::span<const uint8_t> bytes = f.bytes();
  volatile uint8_t sink = 0;
  for (size_t off = 0; off < bytes.size(); off += kChunk) {
    const size_t n = std::min(kChunk, bytes.size() - off);
    if (off + n < bytes.size()) f.advise_willneed(off + n, std::min(kChunk, bytes.size() - off - n));
    uint8_t acc = 0;
    for (size_t p = 0; p < n; p += kPage) acc ^= bytes[off + p];
    sink = sink ^ acc;
    progress.advance(n);
  }
  progress.finish();
  return Status::ok();
}

}  // namespace

Result<std::unique_ptr<Model>> load_model_for_cli(const std::string& path, bool mlock) {
  if (mlock) ESSAIM_RETURN_IF_ERROR(read_into_memory(path));
  return load_model(path, {.mlock = mlock});
}

}  // namespace essaim::cli
