#include "backbone_test_util.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <cctype>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include "temp_dir.h"

extern char** environ;

namespace essaim::backbone::testing {
namespace {

// Removes the models' directories once the test program ends.
class ModelDirCleanup : public ::testing::Environment {
 public:
  void TearDown() override {
    for (const std::string& d : dirs) std::filesystem::remove_all(d);
  }
  std::vector<std::string> dirs;
};
ModelDirCleanup* const g_cleanup =
    static_cast<ModelDirCleanup*>(::testing::AddGlobalTestEnvironment(new ModelDirCleanup));

}  // namespace

std::string spec_name(const ModelSpec& s) {
  if (!s.file.empty()) {
    std::string stem = std::filesystem::path(s.file).stem().string();  // "kjv-moe-q4_k_m" -> "kjv_moe_q4_k_m"
    for (char& c : stem)
      if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
    return stem;
  }
  return std::string(s.arch == SynthArch::QWEN3MOE ? "qwen3moe" : "qwen35moe") +
         (s.types == SynthTypeMix::F32 ? "_f32" : "_q4km") + (s.nextn ? "_mtp" : "");
}

std::vector<ModelSpec> exactness_specs() {
  return {{SynthArch::QWEN3MOE, SynthTypeMix::Q4_K_M},
          {SynthArch::QWEN3MOE, SynthTypeMix::F32},
          {SynthArch::QWEN35MOE, SynthTypeMix::Q4_K_M}};
}

const SwarmModel& SwarmModel::get(const ModelSpec& spec) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<SwarmModel>> cache;
  std::lock_guard lock(mu);
  const std::string name = spec_name(spec);
  if (auto it = cache.find(name); it != cache.end()) return *it->second;

  auto m = std::make_unique<SwarmModel>();
  m->spec = spec;
  m->dir = essaim::testing::make_temp_dir("essaim-dispatch-" + name);
  g_cleanup->dirs.push_back(m->dir);
  m->path = spec.file.empty() ? m->dir + "/model.gguf" : spec.file;
  if (spec.file.empty()) {
    Result<SynthPlan> plan = synth_plan({.arch = spec.arch, .preset = SynthPreset::TINY, .types = spec.types,
                                         .seed = 1, .nextn = spec.nextn, .threads = 2});
    EXPECT_TRUE(plan.is_ok()) << plan.status().message();
    Result<SynthSummary> written = synth_write(*plan, m->path);
    EXPECT_TRUE(written.is_ok()) << written.status().message();
  }
  Result<std::unique_ptr<Model>> model = load_model(m->path);
  EXPECT_TRUE(model.is_ok()) << model.status().message();
  m->model = std::move(*model);
  Result<ModelIdentity> id = source_model_identity(m->model->file());
  EXPECT_TRUE(id.is_ok()) << id.status().message();
  m->identity = *id;
  const ExpertStore& store = m->model->expert_store();
  for (int32_t l = 0; l < store.n_layers(); ++l)
    if (const ExpertLayer* e = store.any(l)) {
      m->moe_layers.push_back(uint32_t(l));
      m->n_expert = uint32_t(e->n_experts);
    }
  EXPECT_FALSE(m->moe_layers.empty());
  return *(cache[name] = std::move(m));
}

std::string SwarmModel::slice(uint32_t layer, uint32_t first, uint32_t count) const {
  const std::string out = dir + "/slice.L" + std::to_string(layer) + ".E" + std::to_string(first) + "+" +
                          std::to_string(count) + ".gguf";
  if (std::filesystem::exists(out)) return out;
  Result<MoeLayout> moe = moe_layout(model->file());
  EXPECT_TRUE(moe.is_ok()) << moe.status().message();
  if (!moe) return out;
  Result<OutFile> f = expert_slice_file(model->file(), *moe,
                                        {.layer_first = layer, .layer_count = 1, .expert_first = first, .expert_count = count});
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  if (!f) return out;
  // Written under another name and renamed: tests of one binary may share a slice.
  const std::string tmp = out + ".tmp" + std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()));
  Result<WrittenFile> w = write_out_file(*f, tmp, /*hash=*/false);
  EXPECT_TRUE(w.is_ok()) << w.status().message();
  std::filesystem::rename(tmp, out);
  return out;
}

std::vector<std::vector<std::string>> SwarmModel::split_experts(uint32_t parts) const {
  std::vector<std::vector<std::string>> out(parts);
  for (uint32_t layer : moe_layers)
    for (uint32_t p = 0; p < parts; ++p) {
      const uint32_t first = n_expert * p / parts, end = n_expert * (p + 1) / parts;
      if (end > first) out[p].push_back(slice(layer, first, end - first));
    }
  return out;
}

std::string backbone_file_path(const SwarmModel& m) {
  // m.dir is this process's; write_out_file renames a finished file into place, so rewriting it per test
  // never changes bytes a mapping sees.
  const std::string path = m.dir + "/lean.backbone.gguf";
  Result<MoeLayout> moe = moe_layout(m.model->file());
  EXPECT_TRUE(moe) << moe.status().message();
  if (!moe) return path;
  Result<WrittenFile> w = write_out_file(backbone_file(m.model->file(), *moe), path, /*hash=*/false);
  EXPECT_TRUE(w) << w.status().message();
  return path;
}

std::unique_ptr<Model> backbone_only_model(const SwarmModel& m) {
  Result<std::unique_ptr<Model>> b = load_model(backbone_file_path(m), {.backbone_file = true});
  EXPECT_TRUE(b) << b.status().message();
  if (!b) return nullptr;
  EXPECT_TRUE((*b)->expert_store().shape_only());
  return std::move(*b);
}

std::vector<int32_t> SwarmModel::tokens(size_t n, uint64_t seed) const {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& id : t) id = int32_t(rng() % uint64_t(model->info().n_vocab));
  return t;
}

std::vector<float> eval_logits(const SwarmModel& m, std::span<const int32_t> tokens, ExpertExecutor& experts,
                               size_t batch) {
  ThreadPool pool(2);
  SequenceCache cache = m.model->new_cache({.kv_type = KvType::F16, .n_ctx = int32_t(tokens.size())});
  const size_t V = size_t(m.model->info().n_vocab);
  std::vector<float> logits(tokens.size() * V);  // [n][V]
  const size_t chunk = batch > 0 ? batch : tokens.size();
  for (size_t b = 0; b < tokens.size(); b += chunk) {
    const size_t n = std::min(chunk, tokens.size() - b);
    Status s = m.model->forward({.tokens = tokens.subspan(b, n), .cache = &cache, .experts = &experts, .pool = &pool,
                                 .logits_mode = LogitsMode::ALL, .logits = std::span<float>(logits).subspan(b * V, n * V)});
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  return logits;
}

std::vector<float> mono_logits(const SwarmModel& m, std::span<const int32_t> tokens, size_t batch) {
  ThreadPool pool(2);
  LocalExpertExecutor local(m.model->expert_store(), &pool);
  return eval_logits(m, tokens, local, batch);
}

std::vector<int32_t> greedy(const SwarmModel& m, std::span<const int32_t> prompt, int n, ExpertExecutor& experts,
                            const std::function<void(int)>& after_token) {
  ThreadPool pool(2);
  SequenceCache cache = m.model->new_cache({.kv_type = KvType::F16, .n_ctx = int32_t(prompt.size()) + n});
  std::vector<float> logits(size_t(m.model->info().n_vocab));
  std::vector<int32_t> out;
  Status s = m.model->forward({.tokens = prompt, .cache = &cache, .experts = &experts, .pool = &pool,
                               .logits_mode = LogitsMode::LAST, .logits = logits});
  EXPECT_TRUE(s.is_ok()) << s.message();
  for (int i = 0; i < n && s.is_ok(); ++i) {
    const int32_t id = int32_t(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(id);
    if (after_token) after_token(i);
    if (i + 1 == n) break;
    s = m.model->forward({.tokens = std::span<const int32_t>(&id, 1), .cache = &cache, .experts = &experts,
                          .pool = &pool, .logits_mode = LogitsMode::LAST, .logits = logits});
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  return out;
}

void expect_same_bits(std::span<const float> got, std::span<const float> want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  if (std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0) return;
  for (size_t i = 0; i < got.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0) {
      ADD_FAILURE() << what << ": value " << i << " is " << got[i] << ", monolithic gives " << want[i];
      return;
    }
}

struct PipeWorker::Slot {
  std::mutex mu;
  net::PipeHub* hub = nullptr;                  // owned by server; null while down
  std::unique_ptr<net::StreamServer> server;
};

PipeWorker::PipeWorker(std::vector<std::string> slices, worker::WorkerOptions options)
    : slot_(std::make_shared<Slot>()) {
  Result<worker::WorkerState> s = worker::WorkerState::open(slices);
  EXPECT_TRUE(s.is_ok()) << s.status().message();
  state_ = std::make_unique<worker::WorkerState>(std::move(*s));
  if (options.threads == 0) options.threads = 1;
  worker_ = std::make_unique<worker::Worker>(*state_, std::move(options));
  up();
}

PipeWorker::~PipeWorker() { down(); }

void PipeWorker::up() {
  auto hub = std::make_unique<net::PipeHub>();
  net::PipeHub* raw = hub.get();
  auto server = std::make_unique<net::StreamServer>(std::move(hub),
                                                    [w = worker_.get()](net::ByteStream& st) { w->serve_connection(st); });
  std::lock_guard lock(slot_->mu);
  slot_->hub = raw;
  slot_->server = std::move(server);
}

void PipeWorker::down() {
  std::unique_ptr<net::StreamServer> server;
  {
    std::lock_guard lock(slot_->mu);
    slot_->hub = nullptr;
    server = std::move(slot_->server);
  }
  if (server) server->stop();
}

DispatchEndpoint PipeWorker::endpoint(std::string name, std::optional<std::vector<proto::Holding>> declared) {
  std::shared_ptr<Slot> slot = slot_;
  Connector c = [slot](net::Deadline) -> net::NetResult<std::unique_ptr<net::ByteStream>> {
    std::lock_guard lock(slot->mu);
    if (slot->hub == nullptr) return net::net_error(net::NetErrorKind::IO, "connection refused (worker down)");
    return slot->hub->connect();
  };
  return DispatchEndpoint{.name = std::move(name), .connect = std::move(c), .declared = std::move(declared)};
}

std::string WorkerProcess::worker_binary() { return std::string(ESSAIM_BINARY_DIR) + "/src/cli/essaim-worker"; }

WorkerProcess::WorkerProcess(const std::vector<std::string>& slices, const std::string& binary,
                             const std::vector<std::string>& launcher) {
  std::vector<std::string> args = launcher;
  args.insert(args.end(), {binary, "--listen", "127.0.0.1:0", "--threads", "1", "--quiet"});
  for (const std::string& s : slices) args.insert(args.end(), {"--slice", s});
  start(std::move(args));
}

bool WorkerSwarm::ok() const {
  for (const auto& p : processes)
    if (!p->ok()) return false;
  return !processes.empty();
}

WorkerSwarm start_worker_swarm(const SwarmModel& m, uint32_t n) {
  WorkerSwarm s;
  for (const std::vector<std::string>& part : m.split_experts(n)) {
    s.processes.push_back(std::make_unique<WorkerProcess>(part));
    s.map.workers.push_back({.address = s.processes.back()->address(), .label = {}, .holdings = std::nullopt});
  }
  return s;
}

DispatchOptions patient_options() {
  DispatchOptions o;
  o.timeout = 60s;
  o.link.connect_timeout = 20s;
  o.link.backoff_initial = 20ms;
  o.link.backoff_max = 500ms;
  return o;
}

}  // namespace essaim::backbone::testing
