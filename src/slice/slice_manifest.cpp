#include "slice/slice_manifest.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

namespace essaim {
namespace {

using nlohmann::json;

// Typed field access on an untrusted JSON object: each getter names the field it refused.
class Fields {
 public:
  Fields(const json& obj, std::string where) : obj_(obj), where_(std::move(where)) {}

  Result<const json*> get(const char* key) const {
    const auto it = obj_.find(key);
    if (it == obj_.end()) return Status::error(where_ + ": missing field \"" + key + "\"");
    return &*it;
  }
  Result<uint64_t> u64(const char* key) const {
    ESSAIM_ASSIGN_OR_RETURN(const json* v, get(key));
    if (!v->is_number_unsigned()) return Status::error(where_ + ": \"" + key + "\" is not a non-negative integer");
    return v->get<uint64_t>();
  }
  Result<uint32_t> u32(const char* key) const {
    ESSAIM_ASSIGN_OR_RETURN(uint64_t v, u64(key));
    if (v > UINT32_MAX) return Status::error(where_ + ": \"" + key + "\" is larger than 2^32-1");
    return uint32_t(v);
  }
  Result<std::string> str(const char* key) const {
    ESSAIM_ASSIGN_OR_RETURN(const json* v, get(key));
    if (!v->is_string()) return Status::error(where_ + ": \"" + key + "\" is not a string");
    return v->get<std::string>();
  }
  Result<Sha256Digest> digest(const char* key) const {
    ESSAIM_ASSIGN_OR_RETURN(std::string s, str(key));
    const std::optional<Sha256Digest> d = digest_from_hex(s);
    if (!d) return Status::error(where_ + ": \"" + key + "\" is not 64 hex digits");
    return *d;
  }
  Result<std::string> file_name(const char* key) const {
    ESSAIM_ASSIGN_OR_RETURN(std::string s, str(key));
    if (!manifest_file_name_is_plain(s))
      return Status::error(where_ + ": \"" + key + "\" must be a plain file name inside the manifest's directory");
    return s;
  }

 private:
  const json& obj_;
  std::string where_;
};

Result<SliceManifest> parse_object(const json& root) {
  if (!root.is_object()) return Status::error("manifest: top level is not a JSON object");
  const Fields top(root, "manifest");
  ESSAIM_ASSIGN_OR_RETURN(std::string format, top.str("format"));
  if (format != kManifestFormat)
    return Status::error("manifest: format is \"" + format + "\", expected \"" + std::string(kManifestFormat) + "\"");
  ESSAIM_ASSIGN_OR_RETURN(uint32_t version, top.u32("version"));
  if (version != kManifestVersion)
    return Status::error("manifest: version " + std::to_string(version) + " is not supported (this build reads " +
                         std::to_string(kManifestVersion) + ")");
  SliceManifest m;
  ESSAIM_ASSIGN_OR_RETURN(const json* src, top.get("source"));
  if (!src->is_object()) return Status::error("manifest: \"source\" is not an object");
  const Fields s(*src, "manifest source");
  ESSAIM_ASSIGN_OR_RETURN(m.source_model, s.digest("model"));
  ESSAIM_ASSIGN_OR_RETURN(m.source_file, s.str("file"));
  ESSAIM_ASSIGN_OR_RETURN(m.source_architecture, s.str("architecture"));
  ESSAIM_ASSIGN_OR_RETURN(m.source_block_count, s.u32("block_count"));
  ESSAIM_ASSIGN_OR_RETURN(m.source_expert_count, s.u32("expert_count"));

  std::set<std::string> names;
  if (const auto it = root.find("backbone"); it != root.end() && !it->is_null()) {
    if (!it->is_object()) return Status::error("manifest: \"backbone\" is not an object");
    const Fields b(*it, "manifest backbone");
    ManifestBackbone bb;
    ESSAIM_ASSIGN_OR_RETURN(bb.file, b.file_name("file"));
    ESSAIM_ASSIGN_OR_RETURN(bb.bytes, b.u64("bytes"));
    ESSAIM_ASSIGN_OR_RETURN(bb.sha256, b.digest("sha256"));
    names.insert(bb.file);
    m.backbone = std::move(bb);
  }

  ESSAIM_ASSIGN_OR_RETURN(const json* slices, top.get("slices"));
  if (!slices->is_array()) return Status::error("manifest: \"slices\" is not an array");
  if (slices->size() > kManifestMaxSlices)
    return Status::error("manifest: " + std::to_string(slices->size()) + " slices, more than the limit " +
                         std::to_string(kManifestMaxSlices));
  m.slices.reserve(slices->size());
  for (size_t i = 0; i < slices->size(); ++i) {
    const json& o = (*slices)[i];
    const std::string where = "manifest slice " + std::to_string(i);
    if (!o.is_object()) return Status::error(where + ": not an object");
    const Fields f(o, where);
    ManifestSlice e;
    ESSAIM_ASSIGN_OR_RETURN(e.file, f.file_name("file"));
    ESSAIM_ASSIGN_OR_RETURN(e.layer_first, f.u32("layer_first"));
    ESSAIM_ASSIGN_OR_RETURN(e.layer_count, f.u32("layer_count"));
    ESSAIM_ASSIGN_OR_RETURN(e.expert_first, f.u32("expert_first"));
    ESSAIM_ASSIGN_OR_RETURN(e.expert_count, f.u32("expert_count"));
    ESSAIM_ASSIGN_OR_RETURN(e.bytes, f.u64("bytes"));
    ESSAIM_ASSIGN_OR_RETURN(e.sha256, f.digest("sha256"));
    // 64-bit sums: a u32 first + count cannot wrap.
    if (e.layer_count == 0 || uint64_t(e.layer_first) + e.layer_count > m.source_block_count)
      return Status::error(where + " (" + e.file + "): layers " + std::to_string(e.layer_first) + " + " +
                           std::to_string(e.layer_count) + " lie outside the source's " +
                           std::to_string(m.source_block_count) + " layers");
    if (e.expert_count == 0 || uint64_t(e.expert_first) + e.expert_count > m.source_expert_count)
      return Status::error(where + " (" + e.file + "): experts " + std::to_string(e.expert_first) + " + " +
                           std::to_string(e.expert_count) + " lie outside the source's " +
                           std::to_string(m.source_expert_count) + " experts");
    if (!names.insert(e.file).second) return Status::error(where + ": file \"" + e.file + "\" is listed twice");
    m.slices.push_back(std::move(e));
  }
  return m;
}

}  // namespace

bool manifest_file_name_is_plain(std::string_view name) {
  if (name.empty() || name.size() > 255 || name == "." || name == "..") return false;
  for (char c : name)
    if (c == '/' || c == '\\' || c == '\0') return false;
  return true;
}

std::string SliceManifest::to_json() const {
  nlohmann::ordered_json src = {{"model", digest_hex(source_model)},
              {"file", source_file},
              {"architecture", source_architecture},
              {"block_count", source_block_count},
              {"expert_count", source_expert_count}};
  // Hand-assembled around nlohmann's dump so that each slice stays on one line (a 384-slice manifest is then
  // 384 greppable lines rather than 4000); ordered_json keeps keys in reading order rather than sorted.
  std::ostringstream out;
  out << "{\n  \"format\": " << json(kManifestFormat).dump() << ",\n  \"version\": " << kManifestVersion
      << ",\n  \"source\": " << src.dump() << ",\n";
  if (backbone)
    out << "  \"backbone\": "
        << nlohmann::ordered_json{{"file", backbone->file}, {"bytes", backbone->bytes}, {"sha256", digest_hex(backbone->sha256)}}.dump()
        << ",\n";
  out << "  \"slices\": [";
  for (size_t i = 0; i < slices.size(); ++i) {
    const ManifestSlice& e = slices[i];
    nlohmann::ordered_json o = {{"file", e.file},
                                {"layer_first", e.layer_first},
                                {"layer_count", e.layer_count},
                                {"expert_first", e.expert_first},
                                {"expert_count", e.expert_count},
                                {"bytes", e.bytes},
                                {"sha256", digest_hex(e.sha256)}};
    out << (i == 0 ? "\n    " : ",\n    ") << o.dump();
  }
  out << (slices.empty() ? "]\n}\n" : "\n  ]\n}\n");
  return out.str();
}

Result<SliceManifest> SliceManifest::parse(std::string_view text) {
  // allow_exceptions=false: malformed JSON yields a discarded value, never an exception across this seam.
  const json root = json::parse(text.begin(), text.end(), nullptr, false);
  if (root.is_discarded()) return Status::error("manifest: not valid JSON");
  try {
    return parse_object(root);
  } catch (const json::exception& e) {  // defensive: typed access above should leave nothing to throw
    return Status::error(std::string("manifest: ") + e.what());
  }
}

Result<SliceManifest> SliceManifest::load(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return Status::error("cannot stat '" + path + "': " + std::strerror(errno));
  if (uint64_t(st.st_size) > kManifestMaxBytes)
    return Status::error("'" + path + "' is " + std::to_string(st.st_size) + " bytes, larger than a manifest may be (" +
                         std::to_string(kManifestMaxBytes) + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot open '" + path + "'");
  std::ostringstream text;
  text << in.rdbuf();
  Result<SliceManifest> m = parse(text.str());
  if (!m) return m.status().with_context(path);
  return m;
}

Status SliceManifest::save(const std::string& path) const {
  const std::string part = path + ".part";
  const std::string text = to_json();
  std::FILE* f = std::fopen(part.c_str(), "wb");
  if (f == nullptr) return Status::error("cannot create '" + part + "': " + std::strerror(errno));
  const bool wrote = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  const bool closed = std::fclose(f) == 0;
  if (!wrote || !closed || std::rename(part.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(part.c_str());
    return Status::error("cannot write '" + path + "': " + std::strerror(err));
  }
  return Status::ok();
}

Status verify_manifest(const SliceManifest& manifest, const std::string& dir, Progress* progress) {
  struct Item {
    const std::string* file;
    uint64_t bytes;
    const Sha256Digest* sha256;
  };
  std::vector<Item> items;
  if (manifest.backbone) items.push_back({&manifest.backbone->file, manifest.backbone->bytes, &manifest.backbone->sha256});
  for (const ManifestSlice& e : manifest.slices) items.push_back({&e.file, e.bytes, &e.sha256});

  std::vector<std::string> failures;
  for (const Item& it : items) {
    struct Advance {  // every item counts its listed bytes once, checked or not
      Progress* p;
      uint64_t n;
      ~Advance() { if (p != nullptr) p->advance(n); }
    } advance{progress, it.bytes};
    if (!manifest_file_name_is_plain(*it.file)) {
      failures.push_back("'" + *it.file + "': not a plain file name");
      continue;
    }
    const std::string path = dir + "/" + *it.file;
    struct stat st {};
    if (::stat(path.c_str(), &st) != 0) {
      failures.push_back(*it.file + ": " + std::strerror(errno));
      continue;
    }
    if (uint64_t(st.st_size) != it.bytes) {
      failures.push_back(*it.file + ": " + std::to_string(st.st_size) + " bytes, the manifest says " +
                         std::to_string(it.bytes));
      continue;
    }
    Result<Sha256Digest> d = sha256_file(path);
    if (!d) {
      failures.push_back(d.status().message());
    } else if (*d != *it.sha256) {
      failures.push_back(*it.file + ": SHA-256 " + digest_hex(*d) + " differs from the manifest's " +
                         digest_hex(*it.sha256));
    }
  }
  if (failures.empty()) return Status::ok();
  std::string msg = std::to_string(failures.size()) + " of " + std::to_string(items.size()) +
                    " files in '" + dir + "' fail verification against the manifest";
  constexpr size_t kShown = 8;
  for (size_t i = 0; i < failures.size() && i < kShown; ++i) msg += "\n  " + failures[i];
  if (failures.size() > kShown) msg += "\n  ... and " + std::to_string(failures.size() - kShown) + " more";
  return Status::error(msg);
}

}  // namespace essaim
