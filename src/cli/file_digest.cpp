#include "cli/file_digest.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

namespace essaim::cli {

Result<Sha256Digest> sha256_of_file(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::error("cannot open '" + path + "': " + std::strerror(errno));
  Sha256 h;
  std::vector<uint8_t> buf(size_t(1) << 20);
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), f)) > 0;) h.update({buf.data(), n});
  const bool failed = std::ferror(f) != 0;
  std::fclose(f);
  if (failed) return Status::error("cannot read '" + path + "'");
  return h.finish();
}

nlohmann::json file_json(const std::string& path, uint64_t bytes, const Sha256Digest& sha256) {
  return nlohmann::json{{"path", path}, {"bytes", bytes}, {"sha256", digest_hex(sha256)}};
}

Result<nlohmann::json> file_summary_json(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(const Sha256Digest d, sha256_of_file(path));
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Status::error("cannot open '" + path + "': " + std::strerror(errno));
  std::fseek(f, 0, SEEK_END);
  const long size = std::ftell(f);
  std::fclose(f);
  return file_json(path, uint64_t(size < 0 ? 0 : size), d);
}

}  // namespace essaim::cli
