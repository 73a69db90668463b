// `--json` on run, eval and slice: stdout is one JSON document holding the fields docs/cli.md lists, and
// every file it names has the size and SHA-256 it says (recomputed here from the file on disk).
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "gguf/gguf_file.h"
#include "slice/model_identity.h"
#include "model_fixture.h"
#include "text/chat_template.h"
#include "text/tokenizer.h"
#include "text/vocab.h"

namespace essaim::cli_test {
namespace {

nlohmann::json parse_stdout(const CliRun& r) {
  EXPECT_EQ(r.code, 0) << r.err;
  try {
    return nlohmann::json::parse(r.out);  // the whole of stdout: nothing else may be printed there
  } catch (const std::exception& e) {
    ADD_FAILURE() << "stdout is not one JSON document (" << e.what() << "): " << r.out;
    return nlohmann::json::object();
  }
}

void expect_fields(const nlohmann::json& j, std::initializer_list<const char*> keys) {
  for (const char* k : keys) EXPECT_TRUE(j.contains(k)) << "missing \"" << k << "\" in " << j.dump();
}

void expect_files_match_disk(const nlohmann::json& files, size_t n) {
  ASSERT_TRUE(files.is_array());
  ASSERT_EQ(files.size(), n) << files.dump();
  for (const nlohmann::json& f : files) {
    const std::string path = f.at("path");
    const std::string bytes = read_text(path);
    EXPECT_EQ(f.at("bytes").get<uint64_t>(), bytes.size()) << path;
    Sha256 h;
    h.update({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()});
    EXPECT_EQ(f.at("sha256").get<std::string>(), digest_hex(h.finish())) << path;
  }
}

TEST(Json, Run) {
  const nlohmann::json j = parse_stdout(run_cli("essaim run -m " + tiny_model() + " -p Hello -n 5 --temp 0 --json"));
  expect_fields(j, {"command", "model", "arch", "seed", "threads", "n_ctx", "batch", "sampling", "load_s",
                    "prompt_tokens", "prompt_s", "prompt_tok_s", "generated_tokens", "generation_s",
                    "generation_tok_s", "tokens", "text", "files", "dispatch"});
  EXPECT_EQ(j["command"], "run");
  EXPECT_EQ(j["arch"], "qwen3moe");
  EXPECT_GT(j["prompt_tokens"].get<int>(), 0);
  EXPECT_LE(j["generated_tokens"].get<int>(), 5);
  EXPECT_EQ(j["tokens"].size(), j["generated_tokens"].get<size_t>());
  EXPECT_TRUE(j["dispatch"].is_null());
  // The text is what the human form streams (after the prompt it echoes).
  const CliRun human = run_cli("essaim run -m " + tiny_model() + " -p Hello -n 5 --temp 0");
  EXPECT_EQ(human.out, "Hello" + j["text"].get<std::string>() + "\n");
}

// `run --chat` sends the model's own template (the synth file's Qwen3 one) rendered around --system and -p:
// the prompt it counts is that rendering's token count, and --no-think takes the template's own branch.
TEST(Json, RunChatRendersTheModelsOwnTemplate) {
  Result<GgufFile> file = GgufFile::open(tiny_model());
  ASSERT_TRUE(file.is_ok()) << file.status().message();
  Result<Vocab> vocab = vocab_from_gguf(*file);
  ASSERT_TRUE(vocab.is_ok()) << vocab.status().message();
  const std::string source = vocab->chat_template;
  ASSERT_NE(source.find("enable_thinking"), std::string::npos);
  Result<Tokenizer> tok = Tokenizer::create(std::move(*vocab));
  ASSERT_TRUE(tok.is_ok());
  Result<ChatTemplate> tmpl = ChatTemplate::create(source, *tok);
  ASSERT_TRUE(tmpl.is_ok()) << tmpl.status().message();
  for (const bool think : {true, false}) {
    ChatTemplateInput in;
    in.messages.push_back({{"role", "system"}, {"content", "Be brief."}});
    in.messages.push_back({{"role", "user"}, {"content", "Hello"}});
    if (!think) in.kwargs["enable_thinking"] = false;
    const size_t expected = tok->encode(*tmpl->render(in), /*parse_special=*/true).size();
    const nlohmann::json j = parse_stdout(run_cli("essaim run -m " + tiny_model() +
                                                  " --chat --system 'Be brief.' -p Hello -n 2 --temp 0 --json" +
                                                  (think ? "" : " --no-think")));
    EXPECT_EQ(j["prompt_tokens"].get<size_t>(), expected) << (think ? "thinking" : "--no-think");
  }
}

TEST(Json, Eval) {
  const std::string npy = make_temp_dir("json-eval") + "/l.npy";
  const nlohmann::json j =
      parse_stdout(run_cli("essaim eval -m " + tiny_model() + " --tokens 1,2,3,4 -b 2 --json --logits-out " + npy));
  expect_fields(j, {"command", "model", "arch", "threads", "load_s", "n_tokens", "n_vocab", "eval_s", "eval_tok_s",
                    "files", "dispatch"});
  EXPECT_EQ(j["command"], "eval");
  EXPECT_EQ(j["n_tokens"], 4);
  // The .npy holds float32 [n_tokens, n_vocab] after its header.
  EXPECT_GT(j["files"][0]["bytes"].get<uint64_t>(), 4u * 4u * j["n_vocab"].get<uint64_t>());
  expect_files_match_disk(j["files"], 1);
}

// bench --json: one row per test; with --mlock the model was pinned (the field says so).
TEST(Json, BenchWithMlock) {
  const nlohmann::json j =
      parse_stdout(run_cli("essaim bench -m " + tiny_model() + " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --mlock --json"));
  expect_fields(j, {"model", "arch", "threads", "reps", "mlock", "read_gb_per_s"});
  EXPECT_EQ(j["mlock"], true) << j.dump();
  EXPECT_EQ(j["threads"], 1) << j.dump();
  // The tg row gives the weight bytes a token reads and, apart, the recurrent state it moves (none here).
  ASSERT_EQ(j["tests"].size(), 2u) << j.dump();
  EXPECT_GT(j["tests"][1]["bytes_per_token"].get<uint64_t>(), 0u) << j.dump();
  EXPECT_EQ(j["tests"][1]["recurrent_state_bytes"], 0) << j.dump();
}

// bench --json says whether the Q4_K / Q6_K products of several rows ran on the AVX2 lanes (only under the
// AVX2 kernels); ESSAIM_LANES=0 turns them off, and the logits of a 12-token prompt (Q4_K products of 12
// rows: one group of eight in the lanes, four on the dot kernels) are the same bits either way.
TEST(Json, BenchSaysWhetherTheLanesRanAndTheyChangeNoLogit) {
  const nlohmann::json off = parse_stdout(run_cli("ESSAIM_ISA=avx2 ESSAIM_LANES=0 essaim bench -m " + tiny_model() +
                                                  " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --json"));
  expect_fields(off, {"lanes", "isa"});
  EXPECT_EQ(off["lanes"], false) << off.dump();
  const nlohmann::json on = parse_stdout(
      run_cli("ESSAIM_ISA=avx2 essaim bench -m " + tiny_model() + " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --json"));
  EXPECT_EQ(on["lanes"], on["isa"] == "avx2") << on.dump();
  const std::string dir = make_temp_dir("json-lanes");
  const std::string eval = "essaim eval -m " + tiny_model() + " --tokens 1,2,3,4,5,6,7,8,9,10,11,12 --logits-out ";
  const CliRun lanes = run_cli("ESSAIM_ISA=avx2 " + eval + dir + "/lanes.npy");
  const CliRun dots = run_cli("ESSAIM_ISA=avx2 ESSAIM_LANES=0 " + eval + dir + "/dots.npy");
  ASSERT_EQ(lanes.code, 0) << lanes.err;
  ASSERT_EQ(dots.code, 0) << dots.err;
  const std::string a = read_text(dir + "/lanes.npy"), b = read_text(dir + "/dots.npy");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the lanes must not change a logit (lanes in use: " << on["lanes"] << ")";
}

// bench --json says whether the Q4_K products of several rows ran on the AVX-512 row lanes (only under the
// AVX-512 kernels); ESSAIM_LANES=0 turns them off, and the logits of a 12-token prompt (Q4_K products of 12
// rows, all in the row lanes) are the same bits either way. The tiles are off: they would take the rows first.
TEST(Json, BenchSaysWhetherTheRowLanesRanAndTheyChangeNoLogit) {
  const std::string env = "ESSAIM_ISA=avx512 ESSAIM_AMX=0 ";
  const nlohmann::json off = parse_stdout(run_cli(env + "ESSAIM_LANES=0 essaim bench -m " + tiny_model() +
                                                  " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --json"));
  expect_fields(off, {"row_lanes", "isa"});
  EXPECT_EQ(off["row_lanes"], false) << off.dump();
  const nlohmann::json on = parse_stdout(
      run_cli(env + "essaim bench -m " + tiny_model() + " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --json"));
  EXPECT_EQ(on["row_lanes"], on["isa"] == "avx512") << on.dump();
  const std::string dir = make_temp_dir("json-rowlanes");
  const std::string eval = "essaim eval -m " + tiny_model() + " --tokens 1,2,3,4,5,6,7,8,9,10,11,12 --logits-out ";
  const CliRun lanes = run_cli(env + eval + dir + "/lanes.npy");
  const CliRun dots = run_cli(env + "ESSAIM_LANES=0 " + eval + dir + "/dots.npy");
  ASSERT_EQ(lanes.code, 0) << lanes.err;
  ASSERT_EQ(dots.code, 0) << dots.err;
  const std::string a = read_text(dir + "/lanes.npy"), b = read_text(dir + "/dots.npy");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the row lanes must not change a logit (in use: " << on["row_lanes"] << ")";
}

// bench --json says whether the Q4_K products of several rows ran on AMX tiles; ESSAIM_AMX=0 turns them off,
// and the logits of a 12-token prompt (Q4_K products of 12 rows) are the same bits either way.
TEST(Json, BenchSaysWhetherTheTilesRanAndTheyChangeNoLogit) {
  const nlohmann::json off = parse_stdout(
      run_cli("ESSAIM_AMX=0 essaim bench -m " + tiny_model() + " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --json"));
  expect_fields(off, {"amx", "isa", "prefetch_bytes"});
  EXPECT_EQ(off["amx"], false) << off.dump();
  const nlohmann::json on =
      parse_stdout(run_cli("essaim bench -m " + tiny_model() + " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --json"));
  expect_fields(on, {"amx"});
  const std::string dir = make_temp_dir("json-amx");
  const std::string eval = "essaim eval -m " + tiny_model() + " --tokens 1,2,3,4,5,6,7,8,9,10,11,12 --logits-out ";
  const CliRun tiles = run_cli(eval + dir + "/tiles.npy");
  const CliRun dots = run_cli("ESSAIM_AMX=0 " + eval + dir + "/dots.npy");
  ASSERT_EQ(tiles.code, 0) << tiles.err;
  ASSERT_EQ(dots.code, 0) << dots.err;
  const std::string a = read_text(dir + "/tiles.npy"), b = read_text(dir + "/dots.npy");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "the tiles must not change a logit (amx in use: " << on["amx"] << ")";
}

// bench --no-mmap: the model read into private memory (the field says so); eval --no-mmap gives the mapped
// model's logits bit for bit (the same bytes, read instead of mapped).
TEST(Json, BenchAndEvalWithNoMmap) {
  const nlohmann::json j =
      parse_stdout(run_cli("essaim bench -m " + tiny_model() + " -p 8 -n 2 -r 1 -t 1 --bandwidth-mb 16 --no-mmap --json"));
  expect_fields(j, {"model", "no_mmap", "mlock", "prefetch_bytes"});
  EXPECT_EQ(j["no_mmap"], true) << j.dump();
  const std::string dir = make_temp_dir("json-no-mmap");
  const std::string eval = "essaim eval -m " + tiny_model() + " --tokens 1,2,3,4,5 --logits-out ";
  const CliRun mapped = run_cli(eval + dir + "/mapped.npy");
  const CliRun copied = run_cli(eval + dir + "/copied.npy --no-mmap");
  ASSERT_EQ(mapped.code, 0) << mapped.err;
  ASSERT_EQ(copied.code, 0) << copied.err;
  const std::string a = read_text(dir + "/mapped.npy"), b = read_text(dir + "/copied.npy");
  ASSERT_FALSE(a.empty());
  EXPECT_TRUE(a == b) << "--no-mmap must not change a logit";
  const CliRun missing = run_cli("essaim eval -m " + dir + "/absent.gguf --tokens 1 --no-mmap --logits-out " + dir + "/x.npy");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("cannot open"), std::string::npos) << missing.err;
}

TEST(Json, SlicePlanWriteOneAndVerify) {
  const std::string dir = make_temp_dir("json-slice");
  nlohmann::json j = parse_stdout(run_cli("essaim slice -m " + tiny_model() + " --plan 3 --backbone --json"));
  expect_fields(j, {"command", "mode", "model", "written", "bytes", "files"});
  EXPECT_EQ(j["written"], false);
  EXPECT_EQ(j["files"].size(), 5u);  // backbone + 2 layers x 2 slices

  j = parse_stdout(run_cli("essaim slice -m " + tiny_model() + " --plan 3 --backbone -o " + dir + "/p --json"));
  expect_fields(j, {"command", "mode", "model", "written", "seconds", "bytes", "files"});
  EXPECT_EQ(j["written"], true);
  expect_files_match_disk(j["files"], 6);  // + manifest.json

  j = parse_stdout(run_cli("essaim slice -m " + tiny_model() + " --layers 0 --experts 1-2 -o " + dir + "/one.gguf --json"));
  expect_fields(j, {"command", "mode", "model", "seconds", "bytes", "files"});
  expect_files_match_disk(j["files"], 1);

  j = parse_stdout(run_cli("essaim slice --verify " + dir + "/p/manifest.json --json"));
  expect_fields(j, {"command", "mode", "manifest", "ok", "model", "files"});
  EXPECT_EQ(j["ok"], true);
  EXPECT_EQ(j["files"].size(), 5u);
}

}  // namespace
}  // namespace essaim::cli_test
