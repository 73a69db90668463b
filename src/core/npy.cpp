#include "core/npy.h"

#include <cstdio>
#include <bit>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <string_view>

namespace essaim {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
// Header lengths this large are not produced by numpy for any array a logits file holds; refusing them
// bounds the parsing work on hostile input.
constexpr size_t kMaxHeaderLen = 1 << 16;
constexpr size_t kMaxRank = 32;

// A tiny cursor over the header dictionary: {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
struct DictParser {
  std::string_view s;
  size_t i = 0;

  void skip_ws() { while (i < s.size() && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n')) ++i; }
  bool eat(char c) {
    skip_ws();
    if (i < s.size() && s[i] == c) { ++i; return true; }
    return false;
  }
  bool quoted(std::string* out) {
    skip_ws();
    if (i >= s.size() || (s[i] != '\'' && s[i] != '"')) return false;
    const char q = s[i++];
    const size_t start = i;
    while (i < s.size() && s[i] != q) ++i;
    if (i >= s.size()) return false;
    *out = std::string(s.substr(start, i - start));
    ++i;
    return true;
  }
  bool word(std::string* out) {
    skip_ws();
    const size_t start = i;
    while (i < s.size() && ((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z'))) ++i;
    *out = std::string(s.substr(start, i - start));
    return !out->empty();
  }
  bool integer(int64_t* out) {
    skip_ws();
    const size_t start = i;
    int64_t v = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') {
      if (v > (std::numeric_limits<int64_t>::max() - 9) / 10) return false;
      v = v * 10 + (s[i] - '0');
      ++i;
    }
    // numpy may write a trailing 'L' on Python 2 longs.
    if (i < s.size() && s[i] == 'L') ++i;
    *out = v;
    return i > start;
  }
};

Status parse_shape(DictParser& p, std::vector<int64_t>* shape) {
  if (!p.eat('(')) return Status::error("npy header: 'shape' is not a tuple");
  shape->clear();
  while (!p.eat(')')) {
    int64_t d;
    if (!p.integer(&d)) return Status::error("npy header: bad dimension in 'shape'");
    if (shape->size() >= kMaxRank) return Status::error("npy header: 'shape' has too many dimensions");
    shape->push_back(d);
    if (!p.eat(',')) {
      if (!p.eat(')')) return Status::error("npy header: unterminated 'shape' tuple");
      break;
    }
  }
  return Status::ok();
}

Status parse_header(std::string_view header, std::vector<int64_t>* shape) {
  DictParser p{header};
  if (!p.eat('{')) return Status::error("npy header: not a dictionary");
  bool have_descr = false, have_order = false, have_shape = false;
  while (!p.eat('}')) {
    std::string key;
    if (!p.quoted(&key)) return Status::error("npy header: expected a quoted key");
    if (!p.eat(':')) return Status::error("npy header: expected ':' after '" + key + "'");
    if (key == "descr") {
      std::string descr;
      if (!p.quoted(&descr)) return Status::error("npy header: 'descr' is not a string");
      if (descr != "<f4")
        return Status::error("npy: dtype '" + descr + "' is not supported (only little-endian float32 '<f4')");
      have_descr = true;
    } else if (key == "fortran_order") {
      std::string v;
      if (!p.word(&v) || (v != "False" && v != "True"))
        return Status::error("npy header: 'fortran_order' is not a boolean");
      if (v == "True") return Status::error("npy: Fortran-ordered arrays are not supported");
      have_order = true;
    } else if (key == "shape") {
      ESSAIM_RETURN_IF_ERROR(parse_shape(p, shape));
      have_shape = true;
    } else {
      return Status::error("npy header: unexpected key '" + key + "'");
    }
    if (!p.eat(',')) {
      if (!p.eat('}')) return Status::error("npy header: expected ',' or '}'");
      break;
    }
  }
  if (!have_descr || !have_order || !have_shape)
    return Status::error("npy header: missing one of 'descr', 'fortran_order', 'shape'");
  return Status::ok();
}

std::string shape_tuple(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (i + 1 < shape.size() || shape.size() == 1) s += ",";
    if (i + 1 < shape.size()) s += " ";
  }
  return s + ")";
}

}  // namespace

Status npy_write_f32(const std::string& path, std::span<const int64_t> shape, std::span<const float> data) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return Status::error("npy_write_f32: negative dimension");
    n *= uint64_t(d);
  }
  if (n != data.size()) return Status::error("npy_write_f32: shape does not match the data size");
  std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': " + shape_tuple(shape) + ", }";
  // Pad with spaces so that magic + version + length + header (ending in '\n') is a multiple of 64.
  const size_t prefix = kMagicLen + 2 + 2;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  if (header.size() > std::numeric_limits<uint16_t>::max()) return Status::error("npy_write_f32: header too long");

  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) return Status::error("cannot create '" + path + "'");
  const uint8_t version[2] = {1, 0};
  const uint16_t len = uint16_t(header.size());
  const uint8_t len_le[2] = {uint8_t(len & 0xFF), uint8_t(len >> 8)};
  bool ok = std::fwrite(kMagic, 1, kMagicLen, f) == kMagicLen && std::fwrite(version, 1, 2, f) == 2 &&
            std::fwrite(len_le, 1, 2, f) == 2 && std::fwrite(header.data(), 1, header.size(), f) == header.size();
  // The payload is written as the host's floats; essaim only builds for little-endian hosts.
  static_assert(std::endian::native == std::endian::little);
  ok = ok && std::fwrite(data.data(), sizeof(float), data.size(), f) == data.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) return Status::error("write error on '" + path + "'");
  return Status::ok();
}

Status npy_write_f32(const std::string& path, std::initializer_list<int64_t> shape, std::span<const float> data) {
  return npy_write_f32(path, std::span<const int64_t>(shape.begin(), shape.size()), data);
}

Result<NpyArray> npy_parse_f32(std::span<const uint8_t> bytes) {
  if (bytes.size() < kMagicLen + 4 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0)
    return Status::error("not a .npy file (bad magic)");
  const uint8_t major = bytes[kMagicLen];
  size_t header_len, header_start;
  if (major == 1) {
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8;
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Status::error("npy: truncated header length");
    header_len = size_t(bytes[8]) | size_t(bytes[9]) << 8 | size_t(bytes[10]) << 16 | size_t(bytes[11]) << 24;
    header_start = 12;
  } else {
    return Status::error("npy: unsupported format version " + std::to_string(major));
  }
  if (header_len > kMaxHeaderLen) return Status::error("npy: header length " + std::to_string(header_len) + " too large");
  if (bytes.size() - header_start < header_len) return Status::error("npy: truncated header");
  const std::string_view header(reinterpret_cast<const char*>(bytes.data() + header_start), header_len);

  NpyArray a;
  ESSAIM_RETURN_IF_ERROR(parse_header(header, &a.shape));
  const uint64_t payload = bytes.size() - header_start - header_len;
  uint64_t n = 1;
  for (int64_t d : a.shape) {
    if (d != 0 && n > payload / uint64_t(d)) return Status::error("npy: shape larger than the payload");
    n *= uint64_t(d);
  }
  if (n * sizeof(float) != payload)
    return Status::error("npy: payload is " + std::to_string(payload) + " bytes, shape " + shape_tuple(a.shape) +
                         " needs " + std::to_string(n * sizeof(float)));
  a.data.resize(n);
  if (n) std::memcpy(a.data.data(), bytes.data() + header_start + header_len, n * sizeof(float));
  return a;
}

Result<NpyArray> npy_read_f32(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot open '" + path + "'");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) return Status::error("read error on '" + path + "'");
  Result<NpyArray> r = npy_parse_f32(bytes);
  if (!r) return r.status().with_context(path);
  return r;
}

}  // namespace essaim
