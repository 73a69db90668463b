#include "slice/expert_digest.h"

#include <sys/stat.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace essaim {
namespace {

// The order a digest reads an expert's tensors in. GATE_UP stands where GATE and UP would: its slab is the
// gate rows then the up rows, so a fused and an unfused cut of the same weights would hash alike.
constexpr std::array<ExpertTensorKind, 4> kDigestOrder = {ExpertTensorKind::GATE, ExpertTensorKind::UP,
                                                          ExpertTensorKind::GATE_UP, ExpertTensorKind::DOWN};

constexpr const char* kCacheFormat = "essaim-expert-digests";
constexpr int kCacheVersion = 1;
constexpr uint64_t kMaxCacheBytes = 64ull << 20;

}  // namespace

Sha256Digest expert_digest(const MoeLayer& layer, uint32_t local_expert) {
  Sha256 h;
  for (ExpertTensorKind k : kDigestOrder)
    if (const GgufTensor* t = layer.tensor(k)) h.update(t->expert_slab(local_expert));
  return h.finish();
}

Sha256Digest holding_digest(std::span<const Sha256Digest> expert_digests) {
  Sha256 h;
  for (const Sha256Digest& d : expert_digests) h.update(d);
  return h.finish();
}

ExpertDigestCache::ExpertDigestCache(const GgufFile& file, const MoeLayout& layout, std::string path)
    : file_(file), layout_(layout), path_(std::move(path)) {
  digests_.resize(layout_.layers.size(), std::vector<Sha256Digest>(layout_.expert_count));
  known_.resize(layout_.layers.size(), std::vector<bool>(layout_.expert_count, false));
}

Result<std::unique_ptr<ExpertDigestCache>> ExpertDigestCache::open(const GgufFile& file, const MoeLayout& layout,
                                                                   std::string cache_path) {
  if (cache_path.empty()) cache_path = file.path() + ".essaim-digests.json";
  std::unique_ptr<ExpertDigestCache> c(new ExpertDigestCache(file, layout, std::move(cache_path)));
  c->file_bytes_ = file.file_size();
  struct stat st {};
  if (!file.path().empty() && ::stat(file.path().c_str(), &st) == 0)
    c->mtime_ns_ = int64_t(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  std::lock_guard lock(c->mu_);
  c->load();
  return c;
}

void ExpertDigestCache::load() {
  // Untrusted like any file: a cache of another model, size or mtime, or one that does not parse, is
  // ignored (the digests are then recomputed), never believed.
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path_, ec);
  if (ec || size > kMaxCacheBytes) return;
  std::ifstream in(path_, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return;
  const auto str = [&](const char* k) { return j.contains(k) && j[k].is_string() ? j[k].get<std::string>() : ""; };
  const auto num = [&](const char* k) -> std::optional<int64_t> {
    if (!j.contains(k) || !j[k].is_number_integer()) return std::nullopt;
    return j[k].get<int64_t>();
  };
  if (str("format") != kCacheFormat || num("version") != kCacheVersion) return;
  if (str("model") != digest_hex(layout_.source_model) || num("file_bytes") != int64_t(file_bytes_) ||
      num("mtime_ns") != mtime_ns_)
    return;
  if (!j.contains("layers") || !j["layers"].is_object()) return;
  for (size_t li = 0; li < layout_.layers.size(); ++li) {
    const std::string key = std::to_string(layout_.layers[li].layer);
    if (!j["layers"].contains(key)) continue;
    const nlohmann::json& a = j["layers"][key];
    if (!a.is_array() || a.size() != layout_.expert_count) continue;
    for (size_t e = 0; e < a.size(); ++e) {
      if (!a[e].is_string()) continue;
      if (std::optional<Sha256Digest> d = digest_from_hex(a[e].get<std::string>())) {
        digests_[li][e] = *d;
        known_[li][e] = true;
      }
    }
  }
}

void ExpertDigestCache::save() {
  nlohmann::json layers = nlohmann::json::object();
  for (size_t li = 0; li < layout_.layers.size(); ++li) {
    nlohmann::json a = nlohmann::json::array();
    bool any = false;
    for (size_t e = 0; e < digests_[li].size(); ++e) {
      a.push_back(known_[li][e] ? digest_hex(digests_[li][e]) : std::string());
      any = any || known_[li][e];
    }
    if (any) layers[std::to_string(layout_.layers[li].layer)] = std::move(a);
  }
  const nlohmann::json j = {{"format", kCacheFormat},      {"version", kCacheVersion},
                            {"model", digest_hex(layout_.source_model)},
                            {"file_bytes", file_bytes_},   {"mtime_ns", mtime_ns_},
                            {"layers", std::move(layers)}};
  const std::string tmp = path_ + ".part";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) return;  // read-only directory: the digests stay in memory for this run
    out << j.dump() << '\n';
    if (!out) return;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path_, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

Result<Sha256Digest> ExpertDigestCache::holding(uint32_t layer, uint32_t first, uint32_t count) {
  size_t li = 0;
  while (li < layout_.layers.size() && layout_.layers[li].layer != layer) ++li;
  if (li == layout_.layers.size())
    return Status::error("layer " + std::to_string(layer) + " has no routed experts in '" + file_.path() + "'");
  if (count == 0 || uint64_t(first) + count > layout_.expert_count)
    return Status::error("experts " + std::to_string(first) + "+" + std::to_string(count) + " of layer " +
                         std::to_string(layer) + " lie beyond the model's " + std::to_string(layout_.expert_count) +
                         " experts");
  std::lock_guard lock(mu_);
  bool added = false;
  for (uint32_t e = first; e < first + count; ++e) {
    if (known_[li][e]) continue;
    digests_[li][e] = expert_digest(layout_.layers[li], e);
    known_[li][e] = true;
    ++hashed_;
    added = true;
  }
  if (added) save();
  return holding_digest(std::span(digests_[li]).subspan(first, count));
}

uint64_t ExpertDigestCache::experts_hashed() const {
  std::lock_guard lock(mu_);
  return hashed_;
}

}  // namespace essaim
