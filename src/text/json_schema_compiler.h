// Internal to text/: the JSON Schema -> grammar compiler behind text/json_schema_grammar.h, split over
// json_schema_grammar.cpp (keywords, combinators, $ref, the public entry points) and json_schema_types.cpp
// (objects, arrays, strings, numbers, formats, any value, reasoning).
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "text/json_schema_grammar.h"

namespace essaim::schema_grammar {

using ojson = nlohmann::ordered_json;
using Seq = GrammarBuilder::Seq;

// A refusal found deep in the schema; caught at the public functions, never leaves text/.
struct Refusal {
  std::string message;
};
[[noreturn]] inline void refuse(std::string message) { throw Refusal{std::move(message)}; }

const std::set<std::string>& annotation_keywords();  // keywords that say nothing about which values are valid
std::string json_text(const ojson& v);               // compact, as a literal of the grammar
std::vector<std::string> constraining(const ojson& s);  // the keywords of s that constrain values

class Compiler {
 public:
  Compiler(const ojson& root, const GrammarLimits& limits) : b_(limits), root_(&root) {}
  // The document $ref points into from now on.
  void set_document(const ojson& root) {
    root_ = &root;
    refs_.clear();
  }

  GrammarBuilder& builder() { return b_; }
  Seq value(const ojson& schema, const std::string& path, int depth);
  Seq any_value(int depth);
  Seq any_object(int depth);
  Seq ws() { return {b_.ref(ws_rule())}; }
  Seq raw_string_value(const ojson& schema, const std::string& path);  // XML tool-call parameters
  Seq any_array(int depth);
  Seq think_prefix();

 private:
  uint32_t ws_rule();
  Seq typed(const std::string& type, const ojson& s, const std::string& path, int depth);
  Seq alternatives(const ojson& branches, const char* keyword, const std::string& path, int depth);
  Seq literals(const ojson& values, const ojson& s, const std::string& path);
  Seq object(const ojson& s, const std::string& path, int depth);
  // The members after "{": each declared member (key, value and trailing space) in order, required or not,
  // then any number of `extra` members when given; commas between those present.
  Seq members(const std::vector<Seq>& declared, const std::vector<bool>& required, const std::optional<Seq>& extra);
  Seq array(const ojson& s, const std::string& path, int depth);
  enum class CharKind : uint8_t { JSON, JSON_NO_ESCAPE, RAW };  // RAW: XML tool-call text, no '<'
  Seq string(const ojson& s, const std::string& path, CharKind kind);
  Seq ref(const std::string& target, const std::string& path, int depth);
  Seq format(const std::string& name, const std::string& path);
  uint32_t string_char(CharKind kind);
  uint32_t utf8_multibyte();
  Seq key_not_in(const std::set<std::string>& names);
  Seq number();
  Seq integer();
  Seq digits(int64_t min, int64_t max);
  static int64_t bound(const ojson& s, const char* keyword, int64_t cap, const std::string& path);

  GrammarBuilder b_;
  const ojson* root_;
  std::optional<uint32_t> ws_, utf8_, char_[3];
  std::map<int, Seq> any_;
  std::map<std::string, uint32_t> refs_;   // compiled $ref targets
  std::set<std::string> refs_open_;        // $ref targets being compiled (recursion)
};

}  // namespace essaim::schema_grammar
