#include "net/http_limits.h"

namespace essaim::net {

bool api_key_ok(std::string_view configured, std::string_view authorization) {
  if (configured.empty()) return true;
  constexpr std::string_view kBearer = "Bearer ";
  if (authorization.size() < kBearer.size() || authorization.substr(0, kBearer.size()) != kBearer) return false;
  const std::string_view given = authorization.substr(kBearer.size());
  // Constant time in the key's content (not its length), so a timing probe learns nothing byte by byte.
  unsigned char diff = given.size() == configured.size() ? 0 : 1;
  for (size_t i = 0; i < configured.size(); ++i) {
    const unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff |= static_cast<unsigned char>(g ^ static_cast<unsigned char>(configured[i]));
  }
  return diff == 0;
}

}  // namespace essaim::net
