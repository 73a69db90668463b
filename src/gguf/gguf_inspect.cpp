// The text and JSON renderings behind `essaim inspect` (layout documented in gguf_inspect.h, docs/gguf.md).
#include "gguf/gguf_inspect.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace essaim {
namespace {

// Length of the well-formed UTF-8 sequence starting at s[i] (no overlongs, no surrogates, at most
// U+10FFFF), or 0 when the byte there does not start one.
size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  size_t len = 0;
  uint32_t cp = 0;
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
  else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
  else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
  if (len == 0 || i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  static constexpr uint32_t kMinForLen[5] = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMinForLen[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

// Metadata strings are opaque bytes, JSON text must be UTF-8: invalid bytes become U+FFFD.
std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const size_t len = utf8_sequence_length(s, i);
    if (len == 0) {
      out += "\xEF\xBF\xBD";
      ++i;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return out;
}

// Escaped and shortened for a terminal (no quotes).
std::string escape(std::string_view s, size_t max_bytes) {
  std::string out;
  for (size_t k = 0; k < s.size() && k < max_bytes;) {
    const unsigned char c = static_cast<unsigned char>(s[k]);
    const size_t len = utf8_sequence_length(s, k);
    if (len > 1) {  // printable as is: the terminal shows the character
      out.append(s.substr(k, len));
      k += len;
      continue;
    }
    if (c == '"' || c == '\\') { out += '\\'; out += char(c); }
    else if (c == '\n') out += "\\n";
    else if (c == '\t') out += "\\t";
    else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += char(c);
    }
    ++k;
  }
  if (s.size() > max_bytes) out += "...";
  return out;
}

std::string text_string(std::string_view s, size_t max_bytes = 72) {
  std::string out = "\"" + escape(s, max_bytes) + "\"";
  if (s.size() > max_bytes) out += " (" + std::to_string(s.size()) + " bytes)";
  return out;
}

std::string float_text(double f) {
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%.9g", f);
  return buf;
}

bool is_int(GgufValueType t) {
  return t == GgufValueType::INT8 || t == GgufValueType::INT16 || t == GgufValueType::INT32 ||
         t == GgufValueType::INT64;
}
bool is_float(GgufValueType t) { return t == GgufValueType::FLOAT32 || t == GgufValueType::FLOAT64; }

// Element k of an array (or the scalar itself when k is unused), for people.
std::string element_text(const GgufValue& v, GgufValueType t, size_t k, bool scalar) {
  if (t == GgufValueType::STRING) return text_string(scalar ? v.str : v.strs[k]);
  if (t == GgufValueType::BOOL) return (scalar ? v.u : v.uints[k]) ? "true" : "false";
  if (is_float(t)) return float_text(scalar ? v.f : v.floats[k]);
  if (is_int(t)) return std::to_string(scalar ? v.i : v.ints[k]);
  return std::to_string(scalar ? v.u : v.uints[k]);
}

nlohmann::json element_json(const GgufValue& v, GgufValueType t, size_t k, bool scalar) {
  if (t == GgufValueType::STRING) return utf8_sanitize(scalar ? v.str : v.strs[k]);
  if (t == GgufValueType::BOOL) return (scalar ? v.u : v.uints[k]) != 0;
  if (is_float(t)) return scalar ? v.f : v.floats[k];
  if (is_int(t)) return scalar ? v.i : v.ints[k];
  return scalar ? v.u : v.uints[k];
}

std::string shape_text(const GgufTensor& t) {
  std::string s = "[";
  for (uint32_t k = 0; k < t.n_dims; ++k) s += (k ? ", " : "") + std::to_string(t.ne[k]);
  return s + "]";
}

std::string pad_right(std::string s, size_t width) {
  if (s.size() < width) s.append(width - s.size(), ' ');
  return s;
}

std::string value_type_text(const GgufValue& v) {
  if (v.type != GgufValueType::ARRAY) return std::string(gguf_value_type_name(v.type));
  return "ARRAY[" + std::string(gguf_value_type_name(v.elem_type)) + "]";
}

void append_expert_slabs_text(std::string& out, const GgufTensor& t, const GgufInspectOptions& o) {
  const int64_t n = t.ne[2];
  const uint64_t slab = t.expert_slab_bytes();
  out += "      expert slabs: " + std::to_string(n) + " x " + std::to_string(slab) + " bytes\n";
  const int64_t edge = int64_t(o.text_expert_preview);
  for (int64_t e = 0; e < n; ++e) {
    if (!o.full_arrays && n > 2 * edge && e == edge) {
      out += "        ... " + std::to_string(n - 2 * edge) + " more (--full-arrays lists all)\n";
      e = n - edge - 1;
      continue;
    }
    char buf[128];
    std::snprintf(buf, sizeof(buf), "        expert %-5" PRId64 " file_offset %-14" PRIu64 " bytes %" PRIu64 "\n", e,
                  t.file_offset + uint64_t(e) * slab, slab);
    out += buf;
  }
}

}  // namespace

std::string gguf_quote_string(std::string_view value, size_t max_bytes) {
  std::string out = "'" + escape(value, max_bytes) + "'";
  return out;
}

bool gguf_is_expert_tensor(const GgufTensor& t) {
  return t.n_dims == 3 && t.name.find("_exps") != std::string::npos;
}

std::string gguf_inspect_text(const GgufFile& f, const GgufInspectOptions& o) {
  std::string out;
  out += "GGUF v" + std::to_string(f.version()) + "  " + f.path() + "  " + std::to_string(f.file_size()) +
         " bytes, alignment " + std::to_string(f.alignment()) + ", data at byte " +
         std::to_string(f.data_start()) + "\n";

  size_t key_width = 0;
  for (const GgufKv& kv : f.kvs()) key_width = std::max(key_width, kv.key.size());
  key_width = std::min<size_t>(key_width, 48);
  out += "\nmetadata (" + std::to_string(f.kvs().size()) + " keys)\n";
  for (const GgufKv& kv : f.kvs()) {
    const GgufValue& v = kv.value;
    std::string line = "  " + pad_right(escape(kv.key, 96), key_width);
    line += "  " + pad_right(value_type_text(v), 16) + " ";
    if (v.type != GgufValueType::ARRAY) {
      line += element_text(v, v.type, 0, true);
    } else {
      const size_t n = size_t(v.array_size());
      const size_t shown = o.full_arrays ? n : std::min(n, o.text_array_preview);
      line += "count " + std::to_string(n) + " [";
      for (size_t k = 0; k < shown; ++k) line += (k ? ", " : "") + element_text(v, v.elem_type, k, false);
      line += shown < n ? ", ...]" : "]";
    }
    out += line + "\n";
  }

  size_t name_width = 0;
  for (const GgufTensor& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  out += "\ntensors (" + std::to_string(f.tensors().size()) + ")\n";
  out += "  " + pad_right("name", name_width) + "  " + pad_right("type", 8) + pad_right("shape ne[]", 22) +
         pad_right("offset", 14) + pad_right("file_offset", 14) + "bytes\n";
  for (const GgufTensor& t : f.tensors()) {
    out += "  " + pad_right(escape(t.name, 64), name_width) + "  " + pad_right(std::string(type_name(t.type)), 8) + pad_right(shape_text(t), 22) +
           pad_right(std::to_string(t.offset), 14) + pad_right(std::to_string(t.file_offset), 14) +
           std::to_string(t.nbytes) + "\n";
    if (gguf_is_expert_tensor(t)) append_expert_slabs_text(out, t, o);
  }
  return out;
}

nlohmann::json gguf_inspect_json(const GgufFile& f, const GgufInspectOptions& o) {
  nlohmann::json j;
  j["path"] = utf8_sanitize(f.path());
  j["version"] = f.version();
  j["alignment"] = f.alignment();
  j["data_start"] = f.data_start();
  j["file_size"] = f.file_size();
  j["kv_count"] = f.kvs().size();
  j["tensor_count"] = f.tensors().size();

  nlohmann::json meta = nlohmann::json::object();
  for (const GgufKv& kv : f.kvs()) {
    const GgufValue& v = kv.value;
    nlohmann::json e;
    e["type"] = gguf_value_type_name(v.type);
    if (v.type != GgufValueType::ARRAY) {
      e["value"] = element_json(v, v.type, 0, true);
    } else {
      const size_t n = size_t(v.array_size());
      const size_t shown = o.full_arrays ? n : std::min(n, o.json_array_limit);
      e["elem_type"] = gguf_value_type_name(v.elem_type);
      e["count"] = n;
      nlohmann::json values = nlohmann::json::array();
      for (size_t k = 0; k < shown; ++k) values.push_back(element_json(v, v.elem_type, k, false));
      e["values"] = std::move(values);
      e["truncated"] = shown < n;
    }
    meta[utf8_sanitize(kv.key)] = std::move(e);
  }
  j["metadata"] = std::move(meta);

  nlohmann::json tensors = nlohmann::json::array();
  for (const GgufTensor& t : f.tensors()) {
    nlohmann::json e;
    e["name"] = utf8_sanitize(t.name);
    e["type"] = type_name(t.type);
    e["n_dims"] = t.n_dims;
    e["ne"] = std::vector<int64_t>(t.ne.begin(), t.ne.begin() + t.n_dims);
    e["offset"] = t.offset;
    e["file_offset"] = t.file_offset;
    e["bytes"] = t.nbytes;
    if (gguf_is_expert_tensor(t)) {
      nlohmann::json slabs = nlohmann::json::array();
      const uint64_t slab = t.expert_slab_bytes();
      for (int64_t x = 0; x < t.ne[2]; ++x)
        slabs.push_back({{"expert", x}, {"file_offset", t.file_offset + uint64_t(x) * slab}, {"bytes", slab}});
      e["expert_slabs"] = std::move(slabs);
    }
    tensors.push_back(std::move(e));
  }
  j["tensors"] = std::move(tensors);
  return j;
}

}  // namespace essaim
