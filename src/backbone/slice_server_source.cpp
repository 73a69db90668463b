// Reading a slice's header from a prefix of the file: the hardened reader checks every tensor's extent
// against the file's length, so the prefix is laid into an anonymous mapping of the slice's full length
// (pages never written cost no memory) and parsed there; the header is accepted only when its data section
// starts inside the prefix, i.e. every byte the parser looked at was fetched.
#include "backbone/slice_server_source.h"

#include <sys/mman.h>

#include <cstring>

#include "slice/expert_slice.h"

namespace essaim::backbone {
namespace {

constexpr uint64_t kFirstPrefix = 64u << 10;
constexpr uint64_t kMaxPrefix = 16u << 20;
constexpr uint64_t kMaxSliceBytes = 1ull << 40;  // a catalogue length beyond this is not a slice

// An anonymous read-write mapping, unmapped on scope exit.
class Scratch {
 public:
  explicit Scratch(uint64_t bytes) : bytes_(bytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    data_ = p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
  }
  ~Scratch() {
    if (data_ != nullptr) ::munmap(data_, bytes_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
  uint64_t bytes_ = 0;
};

}  // namespace

SliceServerSource::SliceServerSource(const ModelIdentity& model, std::vector<SliceRef> slices, RangeFetch fetch)
    : model_(model), slices_(std::move(slices)), fetch_(std::move(fetch)) {}

Result<const SliceRef*> SliceServerSource::slice_of(int32_t layer, int32_t expert) const {
  for (const SliceRef& s : slices_)
    if (int64_t(s.layer) == layer && expert >= int64_t(s.expert_first) &&
        int64_t(expert) < int64_t(s.expert_first) + int64_t(s.expert_count))
      return &s;
  return Status::error("no slice of the catalogue holds it");
}

Result<const SliceServerSource::Header*> SliceServerSource::header(const SliceRef& s) {
  if (auto it = headers_.find(s.target); it != headers_.end()) return &it->second;
  if (s.bytes == 0 || s.bytes > kMaxSliceBytes)
    return Status::error("slice " + s.target + ": a catalogue length of " + std::to_string(s.bytes) + " bytes");
  Scratch scratch(s.bytes);
  if (scratch.data() == nullptr) return Status::error("cannot map " + std::to_string(s.bytes) + " bytes to parse a header");
  uint64_t have = 0;
  std::string last = "empty";
  for (uint64_t want = std::min(kFirstPrefix, s.bytes);; want = std::min({want * 16, s.bytes, kMaxPrefix})) {
    ESSAIM_ASSIGN_OR_RETURN(std::vector<uint8_t> more, fetch_(s.target, have, want - have));
    ++header_fetches_;
    if (more.size() != want - have) return Status::error("slice " + s.target + ": a short header read");
    std::memcpy(scratch.data() + have, more.data(), more.size());
    have = want;
    Result<GgufFile> file = GgufFile::parse(std::span<const uint8_t>(scratch.data(), s.bytes));
    if (file && file->data_start() <= have) {
      ESSAIM_ASSIGN_OR_RETURN(ExpertSlice slice, ExpertSlice::from_gguf(std::move(*file)));
      if (slice.source_model() != model_)
        return Status::error("slice " + s.target + " was cut from another model (" +
                             digest_hex(slice.source_model()).substr(0, 16) + "...)");
      if (slice.layer_count() != 1 || slice.layer_first() != s.layer || slice.expert_first() != s.expert_first ||
          slice.expert_count() != s.expert_count)
        return Status::error("slice " + s.target + " holds other experts than the catalogue says");
      const MoeLayer* l = slice.layer(s.layer);
      Header h;
      h.fused = slice.gate_up_fused();
      const ExpertTensorKind order[] = {ExpertTensorKind::GATE, ExpertTensorKind::UP, ExpertTensorKind::GATE_UP,
                                        ExpertTensorKind::DOWN};
      for (ExpertTensorKind k : order) {
        const GgufTensor* t = l->tensor(k);
        if (t == nullptr) continue;
        h.slabs.push_back({.type = t->type, .cols = t->ne[0], .rows = t->ne[1], .file_offset = t->file_offset,
                           .expert_bytes = t->expert_slab_bytes()});
        h.expert_bytes += t->expert_slab_bytes();
      }
      const std::span<const Sha256Digest> d = slice.recorded_digests(s.layer);
      h.digests.assign(d.begin(), d.end());
      return &headers_.emplace(s.target, std::move(h)).first->second;
    }
    last = file ? "its data section starts past the bytes read" : file.status().message();
    if (have >= std::min(s.bytes, kMaxPrefix)) break;
  }
  return Status::error("slice " + s.target + ": no header in its first " + std::to_string(have) + " bytes (" + last + ")");
}

Result<uint64_t> SliceServerSource::expert_bytes(int32_t layer, int32_t expert) {
  ESSAIM_ASSIGN_OR_RETURN(const SliceRef* s, slice_of(layer, expert));
  ESSAIM_ASSIGN_OR_RETURN(const Header* h, header(*s));
  return h->expert_bytes;
}

Result<FetchedExpert> SliceServerSource::fetch(int32_t layer, int32_t expert) {
  ESSAIM_ASSIGN_OR_RETURN(const SliceRef* s, slice_of(layer, expert));
  ESSAIM_ASSIGN_OR_RETURN(const Header* h, header(*s));
  const uint32_t local = uint32_t(expert) - s->expert_first;
  FetchedExpert f;
  f.fused = h->fused;
  f.recorded_digest = h->digests.at(local);
  f.bytes.reserve(h->expert_bytes);
  for (const Slab& slab : h->slabs) {
    const uint64_t at = slab.file_offset + uint64_t(local) * slab.expert_bytes;  // inside the file: parsed so
    ESSAIM_ASSIGN_OR_RETURN(std::vector<uint8_t> bytes, fetch_(s->target, at, slab.expert_bytes));
    if (bytes.size() != slab.expert_bytes) return Status::error("a short read of " + s->target);
    f.slabs.push_back({.type = slab.type, .cols = slab.cols, .rows = slab.rows, .offset = f.bytes.size(),
                       .bytes = slab.expert_bytes});
    f.bytes.insert(f.bytes.end(), bytes.begin(), bytes.end());
  }
  return f;
}

}  // namespace essaim::backbone
