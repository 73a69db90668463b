// The architecture registry (model.h's load_model) and the parts of Model shared by all architectures.
#include <array>
#include <cstring>
#include <string>

#include "slice/backbone_experts.h"
#include "model/architectures.h"
#include "model/model.h"
#include "kernels/quantize.h"
#include "model/ops.h"
#include "model/tensor_binder.h"

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
  const bool backbone = is_backbone_file(*file);
  if (backbone && !options.backbone_file)
    return Status::error("this is an essaim backbone file (its routed experts were cut away): load it with "
                         "--backbone-file and a swarm (--worker, --expert-map or --coordinator), or load the full model");
  if (!backbone && options.backbone_file)
    return Status::error("not an essaim backbone file (cut one with `essaim slice -m MODEL --backbone -o FILE`); "
                         "a full model is loaded with -m");
  if (backbone) {
    // The experts become tensors without bytes, so the architecture binds them exactly as from a full file.
    ESSAIM_ASSIGN_OR_RETURN(const BackboneExperts experts, read_backbone_experts(*file));
    ESSAIM_RETURN_IF_ERROR(file->add_shape_only_tensors(experts.shape_tensors()));
  }
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
  Result<GgufFile> f = options.no_mmap ? GgufFile::read(path) : GgufFile::open(path);
  if (!f) return f.status();  // GgufFile::open's and read's messages already name the file
  Result<std::unique_ptr<Model>> m = load_model(std::make_unique<GgufFile>(std::move(*f)), options);
  if (!m) return m.status().with_context(path);
  return m;
}

namespace {

size_t logits_rows(LogitsMode mode, size_t n_tokens) {
  return mode == LogitsMode::ALL ? n_tokens : mode == LogitsMode::LAST ? 1 : 0;
}

}  // namespace

Result<Model::BatchRows> Model::prepare_batch(const BatchForwardArgs& args) const {
  ESSAIM_CHECK(args.experts != nullptr);
  if (args.items.empty()) return Status::error("a batched step needs at least one sequence");
  BatchRows rows;
  rows.row0.reserve(args.items.size() + 1);
  for (size_t i = 0; i < args.items.size(); ++i) {
    const BatchItem& item = args.items[i];
    ESSAIM_CHECK(item.cache != nullptr);
    const std::string which = args.items.size() > 1 ? "batch item " + std::to_string(i) + ": " : "";
    if (item.tokens.empty()) return Status::error(which + "no tokens to evaluate");
    for (size_t j = 0; j < i; ++j)
      if (args.items[j].cache == item.cache)
        return Status::error("batch items " + std::to_string(j) + " and " + std::to_string(i) +
                             " use the same cache (each sequence of a step needs its own)");
    for (int32_t t : item.tokens)
      if (t < 0 || t >= info_.n_vocab)
        return Status::error(which + "token id " + std::to_string(t) + " is outside the vocabulary [0, " +
                             std::to_string(info_.n_vocab) + ")");
    Status room = item.cache->check_room(int64_t(item.tokens.size()));
    if (!room) return Status::error(which + room.message());
    ESSAIM_CHECK(item.logits.size() == logits_rows(item.logits_mode, item.tokens.size()) * size_t(info_.n_vocab));
    rows.row0.push_back(rows.n_rows);
    const int32_t p0 = item.cache->n_past();
    for (size_t t = 0; t < item.tokens.size(); ++t) {
      rows.pos.push_back(p0 + int32_t(t));
      rows.tokens.push_back(item.tokens[t]);
    }
    rows.n_rows += int64_t(item.tokens.size());
  }
  rows.row0.push_back(rows.n_rows);
  return rows;
}

Status Model::forward_as_batch(const ForwardArgs& a) const {
  const BatchItem item{.tokens = a.tokens, .cache = a.cache, .logits_mode = a.logits_mode, .logits = a.logits,
                       .hidden = {}, .keep_row_states = false};
  return forward_batch({.items = std::span(&item, 1), .experts = a.experts, .pool = a.pool});
}

void Model::embed_rows(const WeightMatrix& tok_embd, std::span<const int32_t> tokens, int64_t E, float* x) {
  for (size_t t = 0; t < tokens.size(); ++t)
    dequantize_row(tok_embd.type, tok_embd.data + uint64_t(tokens[t]) * tok_embd.row_stride, x + int64_t(t) * E, E);
}

// An item's BatchItem::hidden: the normed rows its logits come from ([n_out][E], in `normed` from row
// `first`), or every row of the item ([T][E], normed here: RMSNorm is per row, so the same bits).
void Model::copy_hidden(const BatchItem& item, const BatchRows& rows, size_t i, const float* x, int64_t E,
                        const float* output_norm, float eps, std::span<const float> normed, size_t first,
                        ThreadPool* pool) {
  if (item.hidden.empty()) return;
  const int64_t r0 = rows.row0[i], T = rows.row0[i + 1] - r0;
  const size_t n_out = logits_rows(item.logits_mode, size_t(T));
  if (item.hidden.size() == size_t(T * E)) {
    rms_norm_rows(x + r0 * E, output_norm, T, E, eps, item.hidden.data(), pool);
    return;
  }
  ESSAIM_CHECK(item.hidden.size() == n_out * size_t(E));
  std::memcpy(item.hidden.data(), normed.data() + first * size_t(E), item.hidden.size() * sizeof(float));
}

void Model::lm_head_batch(const BatchForwardArgs& args, const BatchRows& rows, const float* x, int64_t E,
                          const float* output_norm, float eps, const WeightMatrix& output) {
  const int64_t V = output.rows;
  // The rows asked for, gathered in item order: normed[n_out][E]; dest[item] = its first gathered row.
  std::vector<int64_t> wanted;  // [n_out] batch row indices
  std::vector<size_t> first_out(args.items.size() + 1, 0);  // [n_items + 1]
  for (size_t i = 0; i < args.items.size(); ++i) {
    const int64_t r0 = rows.row0[i], r1 = rows.row0[i + 1];
    const size_t n = logits_rows(args.items[i].logits_mode, size_t(r1 - r0));
    for (int64_t r = r1 - int64_t(n); r < r1; ++r) wanted.push_back(r);
    first_out[i + 1] = wanted.size();
  }
  const int64_t n_out = int64_t(wanted.size());
  if (n_out == 0) {
    for (size_t i = 0; i < args.items.size(); ++i) copy_hidden(args.items[i], rows, i, x, E, output_norm, eps, {}, 0, args.pool);
    return;
  }
  std::vector<float> normed(size_t(n_out * E));  // [n_out][E]
  for (int64_t o = 0; o < n_out; ++o)
    std::memcpy(normed.data() + o * E, x + wanted[size_t(o)] * E, size_t(E) * sizeof(float));
  rms_norm_rows(normed.data(), output_norm, n_out, E, eps, normed.data(), args.pool);
  for (size_t i = 0; i < args.items.size(); ++i) copy_hidden(args.items[i], rows, i, x, E, output_norm, eps, normed,
                                                             first_out[i], args.pool);
  if (args.items.size() == 1) {  // straight into the caller's buffer
    matmul(output, normed.data(), n_out, args.items[0].logits.data(), args.pool);  // [n_out][V]
    return;
  }
  std::vector<float> logits(size_t(n_out * V));  // [n_out][V], then split by item
  matmul(output, normed.data(), n_out, logits.data(), args.pool);
  for (size_t i = 0; i < args.items.size(); ++i)
    if (first_out[i + 1] > first_out[i])
      std::memcpy(args.items[i].logits.data(), logits.data() + first_out[i] * size_t(V),
                  (first_out[i + 1] - first_out[i]) * size_t(V) * sizeof(float));
}

Status Model::forward_batch(const BatchForwardArgs& args) const {
  ESSAIM_RETURN_IF_ERROR(prepare_batch(args).status());
  for (const BatchItem& item : args.items)
    ESSAIM_RETURN_IF_ERROR(forward({.tokens = item.tokens, .cache = item.cache, .experts = args.experts,
                                    .pool = args.pool, .logits_mode = item.logits_mode, .logits = item.logits}));
  return Status::ok();
}

SequenceCache Model::new_nextn_cache(const CacheOptions& options) const {
  return SequenceCache({}, resolve_n_ctx(options));
}

Status Model::forward_nextn_batch(const NextnBatchArgs&) const {
  return Status::error("the model (" + info_.arch + ") has no MTP (nextn) block to draft with");
}

int32_t Model::resolve_n_ctx(const CacheOptions& options) const {
  if (options.n_ctx > 0) return options.n_ctx;
  return info_.n_ctx_train > 0 ? std::min(info_.n_ctx_train, kDefaultMaxContext) : kDefaultMaxContext;
}

void Model::drop_step_kv(const BatchForwardArgs& args, const BatchRows& rows, int32_t il) {
  for (size_t i = 0; i < args.items.size(); ++i)
    for (int32_t jl = 0; jl <= il; ++jl)
      if (auto* kv = std::get_if<KvCache>(&args.items[i].cache->layer(jl)))
        kv->truncate(rows.pos[size_t(rows.row0[i])]);
}

Result<Model::HeadTensors> Model::bind_embedding_and_head(TensorBinder& b, int64_t n_embd, int64_t n_vocab) {
  const int64_t E = n_embd, V = n_vocab;
  ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* embd, b.require(TensorName::TOKEN_EMBD, -1, {E, V}));
  ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* onorm, b.require(TensorName::OUTPUT_NORM, -1, {E}, TensorKind::F32));
  ESSAIM_ASSIGN_OR_RETURN(const GgufTensor* out, b.optional(TensorName::OUTPUT, -1, {E, V}));
  tok_embd_ = weight_matrix(*embd);
  output_norm_ = f32_data(*onorm);
  output_ = weight_matrix(out ? *out : *embd);
  return HeadTensors{.embd = embd, .out = out};
}

void Model::describe(ModelInfo shape, HeadTensors head, WeightBytes bytes) {
  info_ = std::move(shape);
  info_.name = file_->get_string("general.name").value_or("");
  for (const GgufTensor& t : file_->tensors()) info_.weight_bytes += t.nbytes;
  info_.expert_bytes = bytes.experts;
  // A decoded token reads every dense weight except the embedding table (one row) and the unread bytes, all
  // of the LM head, and K experts per layer.
  info_.active_bytes_per_token = info_.weight_bytes - bytes.experts - bytes.unread - head.embd->nbytes +
                                 head.embd->row_bytes() + (head.out ? 0 : head.embd->nbytes) +
                                 bytes.active_experts;
}

}  // namespace essaim
