// vocab_from_hf_tokenizer_json and vocab_pad_to (text/vocab.h): a Hugging Face tokenizer.json turned into the
// vocabulary llama.cpp's convert_hf_to_gguf.py would have written.
#include <algorithm>
#include <filesystem>
#include <functional>
#include <fstream>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "text/pre_tokenizer.h"
#include "text/vocab.h"

namespace essaim {
namespace {

using json = nlohmann::json;

// Ids are bounded before anything is sized by them: a hostile file must not make us allocate gigabytes.
constexpr int64_t MAX_TOKEN_ID = (int64_t(1) << 24) - 1;

// The GGUF converter marks an added token CONTROL when it is flagged special or merely looks special
// (convert_hf_to_gguf.py: does_token_look_special); Qwen's <|fim_prefix|> etc. are not flagged but look special.
bool looks_special(const std::string& text) {
  const auto wrapped = [&](std::string_view open, std::string_view close) {
    return text.size() >= open.size() + close.size() && text.compare(0, open.size(), open) == 0 &&
           text.compare(text.size() - close.size(), close.size(), close) == 0;
  };
  return wrapped("<|", "|>") || wrapped("<\xEF\xBD\x9C", "\xEF\xBD\x9C>");  // also <｜...｜> (full-width bars)
}

Result<json> read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot open " + path);
  std::ostringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::error(path + ": not valid JSON");
  return j;
}

Result<int64_t> token_id(const json& value, const std::string& where) {
  if (!value.is_number_integer()) return Status::error(where + ": token id is not an integer");
  const int64_t id = value.get<int64_t>();
  if (id < 0 || id > MAX_TOKEN_ID) return Status::error(where + ": token id " + std::to_string(id) + " out of range");
  return id;
}

// Recognises the pre-tokenizer: a Split regex we know followed by a regex-less ByteLevel (Qwen), or a bare
// ByteLevel with its built-in GPT-2 regex.
Result<std::string> detect_pre(const json& pre) {
  if (!pre.is_object()) return Status::error("pre_tokenizer missing: cannot tell how to split words");
  const auto byte_level_ok = [](const json& b, bool want_regex) -> bool {
    if (b.value("add_prefix_space", false)) return false;  // llama.cpp never adds a prefix space
    return b.value("use_regex", true) == want_regex;
  };
  const std::string type = pre.value("type", "");
  if (type == "ByteLevel") {
    if (!byte_level_ok(pre, true)) return Status::error("pre_tokenizer ByteLevel with add_prefix_space or no regex");
    return std::string("gpt-2");
  }
  if (type == "Sequence" && pre.contains("pretokenizers") && pre["pretokenizers"].is_array()) {
    const json& seq = pre["pretokenizers"];
    if (seq.size() == 2 && seq[0].value("type", "") == "Split" && seq[1].value("type", "") == "ByteLevel" &&
        byte_level_ok(seq[1], false) && seq[0].value("behavior", "") == "Isolated" &&
        !seq[0].value("invert", false) && seq[0].contains("pattern") && seq[0]["pattern"].is_object() &&
        seq[0]["pattern"].contains("Regex") && seq[0]["pattern"]["Regex"].is_string()) {
      const std::string regex = seq[0]["pattern"]["Regex"].get<std::string>();
      const std::string name = PreTokenizer::name_for_hf_regex(regex);
      if (name.empty()) return Status::error("pre_tokenizer Split regex not recognised: " + regex);
      return name;
    }
  }
  return Status::error("unsupported pre_tokenizer: " + pre.dump().substr(0, 200));
}

// A special-token field of tokenizer_config.json: a string, {"content": ...}, or null.
std::optional<std::string> config_token_text(const json& config, const char* key) {
  if (!config.contains(key)) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  return std::nullopt;
}

// The tokenizer.json shape essaim reads: a byte-level BPE model with a vocab object, NFC or no normalizer.
Status check_model(const json& j, const std::string& path) {
  if (!j.is_object() || !j.contains("model") || !j["model"].is_object()) {
    return Status::error(path + ": no \"model\" object");
  }
  const json& model = j["model"];
  if (model.contains("type") && model["type"] != "BPE") {
    return Status::error(path + ": model.type is " + model["type"].dump() + ", only BPE is supported");
  }
  if (model.value("byte_fallback", false)) return Status::error(path + ": byte_fallback BPE is not byte-level BPE");
  if (!model.contains("vocab") || !model["vocab"].is_object()) return Status::error(path + ": model.vocab missing");
  if (j.contains("normalizer") && !j["normalizer"].is_null() && j["normalizer"].value("type", "") != "NFC") {
    return Status::error(path + ": unsupported normalizer " + j["normalizer"].dump().substr(0, 100));
  }
  return Status::ok();
}

// The largest token id of model.vocab and added_tokens. Ids size the tables: sparse ones are refused first, so
// a small hostile file cannot make us allocate millions of entries. Real files number their tokens densely (at
// most a few padding gaps).
Result<int64_t> dense_max_id(const json& j, const std::string& path) {
  int64_t max_id = -1;
  size_t n_entries = 0;
  for (const auto& [text, value] : j["model"]["vocab"].items()) {
    ESSAIM_ASSIGN_OR_RETURN(const int64_t id, token_id(value, "model.vocab[\"" + text + "\"]"));
    max_id = std::max(max_id, id);
    ++n_entries;
  }
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& added : j["added_tokens"]) {
      if (!added.is_object() || !added.contains("id")) continue;  // reported by import_tokens
      ESSAIM_ASSIGN_OR_RETURN(const int64_t id, token_id(added["id"], "added_tokens"));
      max_id = std::max(max_id, id);
      ++n_entries;
    }
  }
  if (max_id >= int64_t(2 * n_entries + 65536)) {
    return Status::error(path + ": token ids reach " + std::to_string(max_id) + " for only " +
                         std::to_string(n_entries) + " tokens");
  }
  return max_id;
}

// vocab.tokens and vocab.types from model.vocab and added_tokens (which override an entry of the same id, as in
// Hugging Face; their text stays raw); ids no entry names become "[PADn]".
Status import_tokens(const json& j, const std::string& path, Vocab& vocab) {
  ESSAIM_ASSIGN_OR_RETURN(const int64_t max_id, dense_max_id(j, path));
  std::vector<std::optional<std::string>> texts(size_t(max_id + 1));
  std::vector<TokenType> types(size_t(max_id + 1), TokenType::UNUSED);
  const auto place = [&](int64_t id, std::string text, TokenType type, bool may_replace) -> Status {
    if (size_t(id) >= texts.size()) {
      texts.resize(size_t(id) + 1);
      types.resize(size_t(id) + 1, TokenType::UNUSED);
    }
    if (texts[size_t(id)] && !may_replace) return Status::error(path + ": token id " + std::to_string(id) + " twice");
    texts[size_t(id)] = std::move(text);
    types[size_t(id)] = type;
    return Status::ok();
  };
  for (const auto& [text, value] : j["model"]["vocab"].items()) {
    ESSAIM_ASSIGN_OR_RETURN(const int64_t id, token_id(value, "model.vocab[\"" + text + "\"]"));
    ESSAIM_RETURN_IF_ERROR(place(id, text, TokenType::NORMAL, false));
  }
  if (j.contains("added_tokens")) {
    if (!j["added_tokens"].is_array()) return Status::error(path + ": added_tokens is not an array");
    for (const json& added : j["added_tokens"]) {
      if (!added.is_object() || !added.contains("id") || !added.contains("content") ||
          !added["content"].is_string()) {
        return Status::error(path + ": malformed added_tokens entry " + added.dump().substr(0, 100));
      }
      ESSAIM_ASSIGN_OR_RETURN(const int64_t id, token_id(added["id"], "added_tokens"));
      std::string content = added["content"].get<std::string>();
      const bool special = added.value("special", false) || looks_special(content);
      ESSAIM_RETURN_IF_ERROR(place(id, std::move(content), special ? TokenType::CONTROL : TokenType::USER_DEFINED,
                                   true));
    }
  }
  if (texts.empty()) return Status::error(path + ": empty vocabulary");
  vocab.tokens.reserve(texts.size());
  for (size_t id = 0; id < texts.size(); ++id) {
    vocab.tokens.push_back(texts[id] ? std::move(*texts[id]) : "[PAD" + std::to_string(id) + "]");
  }
  vocab.types = std::move(types);
  return Status::ok();
}

// model.merges: "a b" strings or ["a", "b"] pairs.
Status import_merges(const json& model, const std::string& path, Vocab& vocab) {
  if (!model.contains("merges") || !model["merges"].is_array()) return Status::error(path + ": model.merges missing");
  vocab.merges.reserve(model["merges"].size());
  for (const json& merge : model["merges"]) {
    if (merge.is_string()) {
      vocab.merges.push_back(merge.get<std::string>());
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      vocab.merges.push_back(merge[0].get<std::string>() + " " + merge[1].get<std::string>());
    } else {
      return Status::error(path + ": malformed merge " + merge.dump().substr(0, 100));
    }
  }
  return Status::ok();
}

// tokenizer_config.json beside the tokenizer: special tokens (by text, among the non-NORMAL tokens),
// add_bos/add_eos, and the chat template (a string, or the "default" one of a named list).
Status import_config(const std::filesystem::path& config_path,
                     const std::function<std::optional<uint32_t>(const std::string&)>& special_id, Vocab& vocab) {
  ESSAIM_ASSIGN_OR_RETURN(const json config, read_json(config_path.string()));
  if (!config.is_object()) return Status::error(config_path.string() + ": not a JSON object");
  for (auto [key, slot] : {std::pair{"eos_token", &vocab.eos_id}, std::pair{"bos_token", &vocab.bos_id},
                           std::pair{"pad_token", &vocab.pad_id}}) {
    if (const std::optional<std::string> text = config_token_text(config, key)) {
      if (const std::optional<uint32_t> id = special_id(*text)) *slot = id;
    }
  }
  if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
    vocab.add_bos = config["add_bos_token"].get<bool>();
  }
  if (config.contains("add_eos_token") && config["add_eos_token"].is_boolean()) {
    vocab.add_eos = config["add_eos_token"].get<bool>();
  }
  if (config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      vocab.chat_template = t.get<std::string>();
    } else if (t.is_array()) {  // named templates: [{"name": "default", "template": "..."}, ...]
      for (const json& named : t) {
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
            named["template"].is_string()) {
          vocab.chat_template = named["template"].get<std::string>();
        }
      }
    }
  }
  return Status::ok();
}

Result<Vocab> import(const json& j, const std::string& path) {
  ESSAIM_RETURN_IF_ERROR(check_model(j, path));
  Vocab vocab;
  vocab.model = "gpt2";
  ESSAIM_ASSIGN_OR_RETURN(vocab.pre, detect_pre(j.contains("pre_tokenizer") ? j["pre_tokenizer"] : json()));
  if (j.contains("normalizer") && !j["normalizer"].is_null()) vocab.normalizer = "NFC";  // the only one accepted
  ESSAIM_RETURN_IF_ERROR(import_tokens(j, path, vocab));
  ESSAIM_RETURN_IF_ERROR(import_merges(j["model"], path, vocab));

  std::unordered_map<std::string, uint32_t> ids;
  for (size_t id = 0; id < vocab.tokens.size(); ++id) {
    if (vocab.types[id] != TokenType::NORMAL) ids.emplace(vocab.tokens[id], uint32_t(id));
  }
  const auto special_id = [&](const std::string& text) -> std::optional<uint32_t> {
    const auto it = ids.find(text);
    return it == ids.end() ? std::nullopt : std::optional<uint32_t>(it->second);
  };
  // Qwen conventions (docs/reference.md 7.1); the config file may override them.
  vocab.bos_id = special_id("<|endoftext|>");
  vocab.pad_id = special_id("<|endoftext|>");
  vocab.eos_id = special_id("<|im_end|>");
  if (!vocab.eos_id) vocab.eos_id = special_id("<|endoftext|>");
  const std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) ESSAIM_RETURN_IF_ERROR(import_config(config_path, special_id, vocab));
  return vocab;
}

}  // namespace

Result<Vocab> vocab_from_hf_tokenizer_json(const std::string& path) {
  ESSAIM_ASSIGN_OR_RETURN(const json j, read_json(path));
  // The checks above test every type before reading it; this only keeps a library exception from crossing the
  // module seam should one slip through.
  try {
    return import(j, path);
  } catch (const json::exception& e) {
    return Status::error(path + ": " + e.what());
  }
}

void vocab_pad_to(Vocab& vocab, size_t n_tokens) {
  while (vocab.tokens.size() < n_tokens) {
    vocab.tokens.push_back("[PAD" + std::to_string(vocab.tokens.size()) + "]");
    vocab.types.push_back(TokenType::UNUSED);
  }
}

}  // namespace essaim
