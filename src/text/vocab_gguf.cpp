// vocab_from_gguf (text/vocab.h): the tokenizer.ggml.* keys with the exact types llama.cpp requires
// (docs/reference.md 7.1 and 9). Kept apart from the JSON import so code that never reads GGUF does not pull it in.
#include "gguf/gguf_file.h"
#include "text/vocab.h"

namespace essaim {
namespace {

std::string describe(const GgufValue& v) {
  if (v.type == GgufValueType::ARRAY) return "array of " + std::string(gguf_value_type_name(v.elem_type));
  return std::string(gguf_value_type_name(v.type));
}

Status wrong_type(std::string_view key, std::string_view expected, const GgufValue& found) {
  return Status::error(std::string(key) + ": expected " + std::string(expected) + ", found " + describe(found));
}

// Optional scalar of one exact type: absent -> nullopt, present with another type -> error.
Result<std::optional<std::string>> optional_string(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find_kv(key);
  if (v == nullptr) return std::optional<std::string>();
  if (v->type != GgufValueType::STRING) return wrong_type(key, "STRING", *v);
  return std::optional<std::string>(v->str);
}

Result<std::optional<uint32_t>> optional_u32(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find_kv(key);
  if (v == nullptr) return std::optional<uint32_t>();
  if (v->type != GgufValueType::UINT32) return wrong_type(key, "UINT32", *v);
  return std::optional<uint32_t>(uint32_t(v->u));
}

Result<std::optional<bool>> optional_bool(const GgufFile& f, std::string_view key) {
  const GgufValue* v = f.find_kv(key);
  if (v == nullptr) return std::optional<bool>();
  if (v->type != GgufValueType::BOOL) return wrong_type(key, "BOOL", *v);
  return std::optional<bool>(v->u != 0);
}

Result<const std::vector<std::string>*> string_array(const GgufFile& f, std::string_view key, bool required) {
  const GgufValue* v = f.find_kv(key);
  if (v == nullptr) {
    if (required) return Status::error("missing required key " + std::string(key));
    return static_cast<const std::vector<std::string>*>(nullptr);
  }
  if (v->type != GgufValueType::ARRAY || v->elem_type != GgufValueType::STRING) {
    return wrong_type(key, "array of STRING", *v);
  }
  return &v->strs;
}

}  // namespace

Result<Vocab> vocab_from_gguf(const GgufFile& file) {
  Vocab vocab;
  const GgufValue* model = file.find_kv("tokenizer.ggml.model");
  if (model == nullptr) return Status::error("missing required key tokenizer.ggml.model");
  if (model->type != GgufValueType::STRING) return wrong_type("tokenizer.ggml.model", "STRING", *model);
  if (model->str != "gpt2") {
    return Status::error("tokenizer.ggml.model is " + gguf_quote_string(model->str) +
                         ": only gpt2 (byte-level BPE) is supported");
  }
  vocab.model = model->str;

  ESSAIM_ASSIGN_OR_RETURN(const std::vector<std::string>* tokens, string_array(file, "tokenizer.ggml.tokens", true));
  if (tokens->empty()) return Status::error("tokenizer.ggml.tokens is empty");
  if (tokens->size() > size_t(INT32_MAX)) return Status::error("tokenizer.ggml.tokens: too many tokens");
  vocab.tokens = *tokens;
  const size_t n = vocab.tokens.size();

  vocab.types.assign(n, TokenType::NORMAL);
  if (const GgufValue* v = file.find_kv("tokenizer.ggml.token_type")) {
    if (v->type != GgufValueType::ARRAY || v->elem_type != GgufValueType::INT32) {
      return wrong_type("tokenizer.ggml.token_type", "array of INT32", *v);
    }
    if (v->ints.size() < n) {
      return Status::error("tokenizer.ggml.token_type has " + std::to_string(v->ints.size()) + " entries for " +
                           std::to_string(n) + " tokens");
    }
    for (size_t id = 0; id < n; ++id) {
      const int64_t t = v->ints[id];
      // llama.cpp maps a type it does not know to UNDEFINED rather than refusing the file.
      vocab.types[id] = (t >= 0 && t <= int64_t(TokenType::BYTE)) ? TokenType(t) : TokenType::UNDEFINED;
    }
  }

  ESSAIM_ASSIGN_OR_RETURN(const std::vector<std::string>* merges, string_array(file, "tokenizer.ggml.merges", true));
  vocab.merges = *merges;

  ESSAIM_ASSIGN_OR_RETURN(const std::optional<std::string> pre, optional_string(file, "tokenizer.ggml.pre"));
  if (pre) {
    vocab.pre = *pre;
  } else {
    vocab.pre = "default";
    vocab.warnings.push_back("tokenizer.ggml.pre missing: using the default pre-tokenizer (results may be poor)");
  }
  // llama.cpp skips normalisation; the models' own (Hugging Face) tokenizers NFC-normalise first. We follow the
  // model's tokenizer, so ids match it on text that is not already NFC (identical on NFC text).
  if (vocab.pre == "qwen2" || vocab.pre == "qwen35") vocab.normalizer = "NFC";

  const struct {
    const char* key;
    std::optional<uint32_t>* slot;
  } specials[] = {
      {"tokenizer.ggml.bos_token_id", &vocab.bos_id},     {"tokenizer.ggml.eos_token_id", &vocab.eos_id},
      {"tokenizer.ggml.padding_token_id", &vocab.pad_id}, {"tokenizer.ggml.unknown_token_id", &vocab.unk_id},
      {"tokenizer.ggml.eot_token_id", &vocab.eot_id},
  };
  for (const auto& special : specials) {
    ESSAIM_ASSIGN_OR_RETURN(const std::optional<uint32_t> id, optional_u32(file, special.key));
    if (id && *id < n) {
      *special.slot = id;
    } else if (id) {
      vocab.warnings.push_back(std::string(special.key) + " = " + std::to_string(*id) + " is out of range, ignored");
    }
  }
  // Checked for its type only: llama.cpp refuses a mistyped one, and we keep no separator id.
  ESSAIM_ASSIGN_OR_RETURN(const std::optional<uint32_t> sep, optional_u32(file, "tokenizer.ggml.seperator_token_id"));
  (void)sep;

  ESSAIM_ASSIGN_OR_RETURN(const std::optional<bool> add_bos, optional_bool(file, "tokenizer.ggml.add_bos_token"));
  ESSAIM_ASSIGN_OR_RETURN(const std::optional<bool> add_eos, optional_bool(file, "tokenizer.ggml.add_eos_token"));
  vocab.add_bos = add_bos.value_or(false);  // gpt2 + qwen2/qwen35 default to false
  vocab.add_eos = add_eos.value_or(false);

  ESSAIM_ASSIGN_OR_RETURN(const std::optional<std::string> tmpl, optional_string(file, "tokenizer.chat_template"));
  vocab.chat_template = tmpl.value_or("");
  return vocab;
}

}  // namespace essaim
