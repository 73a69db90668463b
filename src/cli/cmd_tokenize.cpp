// `essaim tokenize -m FILE (-p TEXT | -f FILE | --jsonl FILE) [--json] [--no-special]`: text -> token ids with
// the model's tokenizer (a GGUF file, or a Hugging Face tokenizer.json).
//
//   essaim tokenize -m tokenizer.json -p "Hello world"     # 9707,1879 with Qwen3's (pastes into eval --tokens)
//   essaim tokenize -m tokenizer.json -p "<|im_start|>" --json  # {"ids":[151644],"pieces":["<|im_start|>"]}
//   essaim tokenize -m tokenizer.json --jsonl texts.jsonl  # one JSON string per line in, one id array per line out
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "gguf/gguf_file.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace essaim::cli {
namespace {

struct TokenizeArgs {
  std::string model;
  std::string prompt;
  std::string prompt_file;
  std::string jsonl_file;
  bool json = false;
  bool no_special = false;
};

Result<Tokenizer> load_tokenizer(const std::string& path) {
  Vocab vocab;
  if (path.size() >= 5 && path.compare(path.size() - 5, 5, ".json") == 0) {
    ESSAIM_ASSIGN_OR_RETURN(vocab, vocab_from_hf_tokenizer_json(path));
  } else {
    ESSAIM_ASSIGN_OR_RETURN(GgufFile file, GgufFile::open(path));
    ESSAIM_ASSIGN_OR_RETURN(vocab, vocab_from_gguf(file));
  }
  for (const std::string& w : vocab.warnings) std::fprintf(stderr, "essaim tokenize: warning: %s\n", w.c_str());
  return Tokenizer::create(std::move(vocab));
}

Result<std::string> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::error("cannot open " + path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string ids_csv(const std::vector<TokenId>& ids) {
  std::string out;
  for (TokenId id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
  return out;
}

// Pieces are raw bytes and may end inside a UTF-8 character; JSON output replaces such bytes with U+FFFD.
std::string ids_json(const Tokenizer& tok, const std::vector<TokenId>& ids) {
  nlohmann::json pieces = nlohmann::json::array();
  for (TokenId id : ids) pieces.push_back(tok.token_to_piece(id, /*render_special=*/true));
  const nlohmann::json out = {{"ids", ids}, {"pieces", pieces}};
  return out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

Status run_tokenize(const TokenizeArgs& args) {
  ESSAIM_ASSIGN_OR_RETURN(const Tokenizer tok, load_tokenizer(args.model));
  const bool parse_special = !args.no_special;
  std::string out;
  if (!args.jsonl_file.empty()) {
    ESSAIM_ASSIGN_OR_RETURN(const std::string text, read_file(args.jsonl_file));
    std::istringstream lines(text);
    std::string line;
    for (size_t n = 1; std::getline(lines, line); ++n) {
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_string()) return Status::error(args.jsonl_file + ":" + std::to_string(n) + ": not a JSON string");
      const std::vector<TokenId> ids = tok.encode(j.get<std::string>(), parse_special);
      out += args.json ? ids_json(tok, ids) : nlohmann::json(ids).dump();
      out += '\n';
    }
  } else {
    std::string text = args.prompt;
    if (!args.prompt_file.empty()) {
      ESSAIM_ASSIGN_OR_RETURN(text, read_file(args.prompt_file));
    }
    const std::vector<TokenId> ids = tok.encode(text, parse_special);
    out = (args.json ? ids_json(tok, ids) : ids_csv(ids)) + "\n";
  }
  if (std::fwrite(out.data(), 1, out.size(), stdout) != out.size() || std::fflush(stdout) != 0) {
    return Status::error("cannot write the output");
  }
  return Status::ok();
}

}  // namespace

void register_tokenize(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<TokenizeArgs>();
  CLI::App* cmd = app.add_subcommand("tokenize", "Print the token ids of a text");
  cmd->add_option("-m,--model", args->model, "GGUF model, or a Hugging Face tokenizer.json")->required();
  auto* prompt = cmd->add_option("-p,--prompt", args->prompt, "Text to tokenize");
  auto* file = cmd->add_option("-f,--file", args->prompt_file, "Tokenize the contents of this file");
  auto* jsonl = cmd->add_option("--jsonl", args->jsonl_file, "File with one JSON string per line: one id array each");
  prompt->excludes(file)->excludes(jsonl);
  file->excludes(jsonl);
  cmd->add_flag("--json", args->json, "Print {\"ids\": [...], \"pieces\": [...]}");
  cmd->add_flag("--no-special", args->no_special,
                "Treat control-token texts such as <|im_start|> as plain text (<think> still matches)");
  cmd->callback([args, &exit_code] {
    const Status s = run_tokenize(*args);
    if (!s.is_ok()) std::fprintf(stderr, "essaim tokenize: %s\n", s.message().c_str());
    exit_code = s.is_ok() ? 0 : 1;
  });
}

}  // namespace essaim::cli
