// The architecture registry (model.h's load_model) and the parts of Model shared by all architectures.
#include <array>
#include <string>

#include "model/architectures.h"
#include "model/model.h"
#include "model/ops.h"

namespace essaim {
namespace {

struct ArchEntry {
  std::string_view name;  // general.architecture
  Result<std::unique_ptr<Model>> (*load)(std::unique_ptr<GgufFile> file);
};

constexpr std::array kArchitectures{
    ArchEntry{"qwen3moe", &load_qwen3moe},
    ArchEntry{"qwen35moe", &load_qwen35moe},
};

}  // namespace

std::vector<std::string_view> supported_architectures() {
  std::vector<std::string_view> names;
  for (const ArchEntry& a : kArchitectures) names.push_back(a.name);
  return names;
}

Result<std::unique_ptr<Model>> load_model(std::unique_ptr<GgufFile> file, const LoadOptions& options) {
  const GgufValue* v = file->find_kv("general.architecture");
  if (!v) return Status::error("required metadata key 'general.architecture' is missing");
  if (v->type != GgufValueType::STRING)
    return Status::error("metadata key 'general.architecture' has type " +
                         std::string(gguf_value_type_name(v->type)) + ", expected STRING");
  const std::string arch = v->str;
  for (const ArchEntry& a : kArchitectures) {
    if (a.name != arch) continue;
    if (options.mlock) ESSAIM_RETURN_IF_ERROR(file->mapping().lock().with_context("--mlock"));
    return a.load(std::move(file));
  }
  std::string known;
  for (const ArchEntry& a : kArchitectures) known += (known.empty() ? "" : ", ") + std::string(a.name);
  return Status::error("unsupported architecture " + gguf_quote_string(arch) + " (supported: " + known + ")");
}

Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& options) {
  Result<GgufFile> f = GgufFile::open(path);
  if (!f) return f.status();  // GgufFile::open's messages already name the file
  Result<std::unique_ptr<Model>> m = load_model(std::make_unique<GgufFile>(std::move(*f)), options);
  if (!m) return m.status().with_context(path);
  return m;
}

void Model::lm_head_forward(const ForwardArgs& args, const float* x, int64_t T, int64_t E,
                            const float* output_norm, float eps, const WeightMatrix& output, float* scratch) {
  const int64_t first = args.logits_mode == LogitsMode::ALL ? 0 : T - 1;
  const int64_t n_out = args.logits_mode == LogitsMode::ALL ? T : args.logits_mode == LogitsMode::LAST ? 1 : 0;
  if (n_out == 0) return;
  rms_norm_rows(x + first * E, output_norm, n_out, E, eps, scratch, args.pool);
  matmul(output, scratch, n_out, args.logits.data(), args.pool);  // [n_out][V]
}

Status Model::check_forward_args(const ForwardArgs& a) const {
  ESSAIM_CHECK(a.cache != nullptr && a.experts != nullptr);
  if (a.tokens.empty()) return Status::error("no tokens to evaluate");
  for (int32_t t : a.tokens)
    if (t < 0 || t >= info_.n_vocab)
      return Status::error("token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                           std::to_string(info_.n_vocab) + ")");
  ESSAIM_RETURN_IF_ERROR(a.cache->check_room(int64_t(a.tokens.size())));
  const size_t n_out = a.logits_mode == LogitsMode::ALL ? a.tokens.size() : a.logits_mode == LogitsMode::LAST ? 1 : 0;
  ESSAIM_CHECK(a.logits.size() == n_out * size_t(info_.n_vocab));
  return Status::ok();
}

Status Model::forward_batch(const BatchForwardArgs& args) const {
  std::vector<ForwardArgs> each;
  each.reserve(args.items.size());
  for (const BatchItem& item : args.items) {
    each.push_back({.tokens = item.tokens, .cache = item.cache, .experts = args.experts, .pool = args.pool,
                    .logits_mode = item.logits_mode, .logits = item.logits});
    ESSAIM_RETURN_IF_ERROR(check_forward_args(each.back()));
  }
  for (const ForwardArgs& a : each) ESSAIM_RETURN_IF_ERROR(forward(a));
  return Status::ok();
}

int32_t Model::resolve_n_ctx(const CacheOptions& options) const {
  if (options.n_ctx > 0) return options.n_ctx;
  return info_.n_ctx_train > 0 ? std::min(info_.n_ctx_train, kDefaultMaxContext) : kDefaultMaxContext;
}

}  // namespace essaim
