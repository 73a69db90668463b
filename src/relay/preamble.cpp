#include "relay/preamble.h"

#include <algorithm>

namespace essaim::relay {

namespace {

bool id_char(uint8_t c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '~' ||
         c == '-';
}
bool valid_id(std::string_view s, size_t max) {
  if (s.empty() || s.size() > max) return false;
  for (char c : s) {
    if (!id_char(uint8_t(c))) return false;
  }
  return true;
}

void put16(std::vector<uint8_t>& o, uint16_t v) {
  o.push_back(uint8_t(v)), o.push_back(uint8_t(v >> 8));
}
void put32(std::vector<uint8_t>& o, uint32_t v) {
  for (int i = 0; i < 4; ++i) o.push_back(uint8_t(v >> (8 * i)));
}

// A bounds-checked little-endian reader.
struct Reader {
  std::span<const uint8_t> b;
  size_t pos = 0;
  bool need(size_t n) const { return b.size() - pos >= n; }
  uint8_t u8() { return b[pos++]; }
  uint16_t u16() {
    uint16_t v = uint16_t(b[pos] | b[pos + 1] << 8);
    pos += 2;
    return v;
  }
  uint32_t u32() {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t(b[pos + size_t(i)]) << (8 * i);
    pos += 4;
    return v;
  }
};

}  // namespace

bool valid_node_id(std::string_view s) { return valid_id(s, kMaxNodeIdBytes); }
bool valid_token(std::string_view s) { return valid_id(s, kMaxTokenBytes); }

std::string RelayBuild::text() const {
  return "model " + proto::model_id_hex(model).substr(0, 16) + ", protocol " + std::to_string(protocol_version) +
         ", kernel ABI " + std::to_string(kernel_abi);
}

std::vector<uint8_t> encode_preamble(const Preamble& p) {
  std::vector<uint8_t> o;
  o.push_back(uint8_t(p.role));
  o.push_back(kPreambleVersion);
  put16(o, uint16_t(p.token.size()));
  o.insert(o.end(), p.token.begin(), p.token.end());
  o.insert(o.end(), p.build.model.begin(), p.build.model.end());
  put16(o, p.build.protocol_version);
  put32(o, p.build.kernel_abi);
  put16(o, uint16_t(p.node_id.size()));
  o.insert(o.end(), p.node_id.begin(), p.node_id.end());
  return o;
}

Result<Preamble> decode_preamble(std::span<const uint8_t> bytes) {
  if (bytes.size() > kMaxPreambleBytes) return Status::error("preamble of " + std::to_string(bytes.size()) + " bytes (at most " + std::to_string(kMaxPreambleBytes) + ")");
  Reader r{bytes};
  Preamble p;
  if (!r.need(4)) return Status::error("preamble truncated (" + std::to_string(bytes.size()) + " bytes)");
  const uint8_t role = r.u8();
  if (role != uint8_t(RelayRole::WORKER) && role != uint8_t(RelayRole::BACKBONE)) {
    return Status::error("unknown role byte " + std::to_string(role) + " (1 = backbone, 2 = worker)");
  }
  p.role = RelayRole(role);
  const uint8_t version = r.u8();
  if (version != kPreambleVersion) {
    return Status::error("relay protocol version " + std::to_string(version) + " (this relay speaks " + std::to_string(kPreambleVersion) + ")");
  }
  const uint16_t token_len = r.u16();
  if (token_len == 0 || token_len > kMaxTokenBytes) return Status::error("token length " + std::to_string(token_len) + " (1.." + std::to_string(kMaxTokenBytes) + ")");
  if (!r.need(token_len)) return Status::error("preamble truncated inside the token");
  p.token.assign(reinterpret_cast<const char*>(bytes.data() + r.pos), token_len);
  r.pos += token_len;
  if (!valid_token(p.token)) return Status::error("the token has characters outside [A-Za-z0-9._~-]");
  if (!r.need(32 + 2 + 4 + 2)) return Status::error("preamble truncated inside the build fingerprint");
  std::copy_n(bytes.data() + r.pos, 32, p.build.model.begin());
  r.pos += 32;
  p.build.protocol_version = r.u16();
  p.build.kernel_abi = r.u32();
  const uint16_t node_len = r.u16();
  if (node_len > kMaxNodeIdBytes) return Status::error("node id length " + std::to_string(node_len) + " (at most " + std::to_string(kMaxNodeIdBytes) + ")");
  if (!r.need(node_len)) return Status::error("preamble truncated inside the node id");
  p.node_id.assign(reinterpret_cast<const char*>(bytes.data() + r.pos), node_len);
  r.pos += node_len;
  if (r.pos != bytes.size()) return Status::error(std::to_string(bytes.size() - r.pos) + " unexpected bytes after the preamble");
  if (p.role == RelayRole::BACKBONE && !valid_node_id(p.node_id)) {
    return Status::error("a backbone must name the worker's node id ([A-Za-z0-9._~-], 1.." + std::to_string(kMaxNodeIdBytes) + " bytes)");
  }
  if (p.role == RelayRole::WORKER && !p.node_id.empty()) return Status::error("a worker's preamble names no node id (its token does)");
  return p;
}

}  // namespace essaim::relay
