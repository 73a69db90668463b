#include "worker_test_util.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>

#include "kernels/matmul.h"
#include "temp_dir.h"

namespace essaim::worker::testing {

using namespace std::chrono_literals;

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

std::string spec_name(const ModelSpec& s) {
  return std::string(s.arch == SynthArch::QWEN3MOE ? "qwen3moe" : "qwen35moe") +
         (s.types == SynthTypeMix::F32 ? "-f32" : "-q4km") + (s.fused_gate_up ? "-fused" : "") + "-s" +
         std::to_string(s.seed);
}

ExpertLayer::Tensor3d view(const GgufTensor* t) {
  return {.type = t->type, .cols = t->ne[0], .rows = t->ne[1], .n_experts = t->ne[2], .data = t->data};
}

}  // namespace

const TestModel& TestModel::get(const ModelSpec& spec) {
  static std::map<std::string, std::unique_ptr<TestModel>> cache;
  const std::string name = spec_name(spec);
  if (auto it = cache.find(name); it != cache.end()) return *it->second;

  auto m = std::make_unique<TestModel>();
  m->dir = essaim::testing::make_temp_dir("essaim-worker-" + name);
  g_cleanup->dirs.push_back(m->dir);
  m->path = m->dir + "/model.gguf";
  SynthOptions o{.arch = spec.arch, .preset = SynthPreset::TINY, .types = spec.types, .seed = spec.seed,
                 .fused_gate_up = spec.fused_gate_up, .threads = 2};
  Result<SynthPlan> plan = synth_plan(o);
  EXPECT_TRUE(plan.is_ok()) << plan.status().message();
  Result<SynthSummary> written = synth_write(*plan, m->path);
  EXPECT_TRUE(written.is_ok()) << written.status().message();
  Result<GgufFile> f = GgufFile::open(m->path);
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  m->file = std::move(*f);
  Result<MoeLayout> moe = moe_layout(m->file);
  EXPECT_TRUE(moe.is_ok()) << moe.status().message();
  m->moe = std::move(*moe);
  EXPECT_EQ(m->moe.gate_up_fused, spec.fused_gate_up);
  // The backbone's replica, bound the way the model files bind it (model/qwen3moe.cpp, qwen35moe.cpp).
  for (const MoeLayer& l : m->moe.layers) {
    const GgufTensor* down = l.tensor(ExpertTensorKind::DOWN);
    ExpertLayer el = m->moe.gate_up_fused
                         ? ExpertLayer::fused(view(l.tensor(ExpertTensorKind::GATE_UP)), view(down))
                         : ExpertLayer::separate(view(l.tensor(ExpertTensorKind::GATE)),
                                                 view(l.tensor(ExpertTensorKind::UP)), view(down));
    Status s = m->full.add(int32_t(l.layer), el);
    EXPECT_TRUE(s.is_ok()) << s.message();
  }
  return *(cache[name] = std::move(m));
}

std::string TestModel::slice(uint32_t layer_first, uint32_t layer_count, uint32_t expert_first,
                             uint32_t expert_count) const {
  const std::string out = dir + "/slice.L" + std::to_string(layer_first) + "+" + std::to_string(layer_count) + ".E" +
                          std::to_string(expert_first) + "+" + std::to_string(expert_count) + ".gguf";
  if (std::filesystem::exists(out)) return out;
  Result<OutFile> f = expert_slice_file(file, moe, {.layer_first = layer_first, .layer_count = layer_count,
                                                    .expert_first = expert_first, .expert_count = expert_count});
  EXPECT_TRUE(f.is_ok()) << f.status().message();
  if (!f) return out;
  Result<WrittenFile> w = write_out_file(*f, out, /*hash=*/false);
  EXPECT_TRUE(w.is_ok()) << w.status().message();
  return out;
}

proto::ExpertRequest random_request(const TestModel& m, const Held& held, std::mt19937_64& rng,
                                    const RequestShape& shape) {
  const ExpertLayer* l = m.full.any(int32_t(held.layer));
  EXPECT_NE(l, nullptr);
  const int64_t E = l->n_embd;
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(shape.n_rows) * size_t(E));  // [n_rows][E]
  for (float& v : x) v = normal(rng);

  proto::ExpertRequest r;
  r.request_id = shape.request_id;
  r.layer = held.layer;
  std::vector<uint32_t> experts(held.count);
  for (uint32_t i = 0; i < held.count; ++i) experts[i] = held.first + i;
  const uint32_t max_k = std::min(shape.max_k, held.count);
  for (uint32_t row = 0; row < shape.n_rows; ++row) {
    std::shuffle(experts.begin(), experts.end(), rng);
    const uint32_t min_k = std::min(shape.min_k, max_k);
    const uint32_t k = row == 0 ? max_k : min_k + uint32_t(rng() % (max_k - min_k + 1));
    r.row_expert_counts.push_back(k);
    r.expert_ids.insert(r.expert_ids.end(), experts.begin(), experts.begin() + k);
  }
  if (shape.f32) {
    r.act_type = GgmlType::F32;
    r.act_row_bytes = uint64_t(E) * sizeof(float);
    r.activations.resize(x.size() * sizeof(float));
    std::memcpy(r.activations.data(), x.data(), r.activations.size());
  } else {
    r.act_type = l->activation_type();
    r.act_row_bytes = l->activation_row_bytes();
    r.activations.resize(size_t(shape.n_rows) * r.act_row_bytes);
    quantize_activations(l->gate.type, x.data(), shape.n_rows, E, r.activations.data());
  }
  return r;
}

std::vector<float> reference_outputs(const TestModel& m, const proto::ExpertRequest& r) {
  const ExpertLayer* l = m.full.any(int32_t(r.layer));
  EXPECT_NE(l, nullptr);
  const int64_t n_rows = int64_t(r.n_rows());
  const size_t E = size_t(l->n_embd);
  std::vector<uint8_t> xq = r.activations;
  if (r.act_type == GgmlType::F32 && l->activation_type() != GgmlType::F32) {
    std::vector<float> x(size_t(n_rows) * E);
    std::memcpy(x.data(), r.activations.data(), x.size() * sizeof(float));
    xq.resize(size_t(n_rows) * l->activation_row_bytes());
    quantize_activations(l->gate.type, x.data(), n_rows, int64_t(E), xq.data());
  }
  int32_t K = 1;
  for (uint32_t c : r.row_expert_counts) K = std::max(K, int32_t(c));
  std::vector<int32_t> ids(size_t(n_rows) * size_t(K), -1);  // [n_rows][K], -1 = slot not requested
  size_t pair = 0;
  for (int64_t row = 0; row < n_rows; ++row)
    for (uint32_t j = 0; j < r.row_expert_counts[size_t(row)]; ++j)
      ids[size_t(row) * size_t(K) + j] = int32_t(r.expert_ids[pair++]);
  std::vector<float> out(ids.size() * E, 0.0f);  // [n_rows][K][E]
  ThreadPool pool(2);
  LocalExpertExecutor local(m.full, &pool);
  Status s = local.compute({.layer = int32_t(r.layer), .n_rows = n_rows, .k = K, .act_type = l->activation_type(),
                            .act = xq, .ids = ids},
                           out);
  EXPECT_TRUE(s.is_ok()) << s.message();
  std::vector<float> want;
  want.reserve(r.n_pairs() * E);
  for (int64_t row = 0; row < n_rows; ++row)
    for (uint32_t j = 0; j < r.row_expert_counts[size_t(row)]; ++j) {
      const float* o = out.data() + (size_t(row) * size_t(K) + j) * E;
      want.insert(want.end(), o, o + E);
    }
  return want;
}

void expect_bits_equal(std::span<const float> got, std::span<const float> want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(want[i])) {
      ADD_FAILURE() << what << ": output " << i << " is " << got[i] << ", the backbone computes " << want[i];
      return;
    }
  }
}

proto::Hello backbone_hello(const proto::ModelId& model) {
  proto::Hello h;
  h.role = proto::Role::BACKBONE;
  h.fingerprint = build_fingerprint();
  h.model = model;
  h.label = "test backbone";
  return h;
}

ServedWorker::ServedWorker(const std::vector<std::string>& slices, WorkerOptions options, size_t pipe_capacity) {
  Result<WorkerState> s = WorkerState::open(slices);
  EXPECT_TRUE(s.is_ok()) << s.status().message();
  state_ = std::make_unique<WorkerState>(std::move(*s));
  worker_ = std::make_unique<Worker>(*state_, std::move(options));
  auto hub = std::make_unique<net::PipeHub>(pipe_capacity);
  hub_ = hub.get();
  server_ = std::make_unique<net::StreamServer>(std::move(hub),
                                                [this](net::ByteStream& st) { worker_->serve_connection(st); });
}

ServedWorker::~ServedWorker() { stop(); }

void ServedWorker::stop() {
  if (server_) server_->stop();
}

std::unique_ptr<net::FrameConnection> ServedWorker::connect_raw(uint64_t max_payload) {
  return std::make_unique<net::FrameConnection>(hub_->connect(), net::ConnectionOptions{.max_payload_bytes = max_payload});
}

std::unique_ptr<net::FrameConnection> ServedWorker::connect(uint64_t max_payload) {
  auto c = connect_raw(max_payload);
  net::NetResult<proto::Hello> peer = net::handshake(*c, backbone_hello(state_->model()), net::deadline_in(5s));
  EXPECT_TRUE(peer.is_ok()) << peer.error().message;
  if (peer) {
    EXPECT_EQ(peer->holdings, state_->holdings());
  }
  return c;
}

std::vector<proto::ExpertResponse> exchange_all(net::FrameConnection& c, const std::vector<proto::ExpertRequest>& reqs) {
  std::thread sender([&] {
    for (const proto::ExpertRequest& r : reqs) {
      net::NetStatus s = c.send(r, net::deadline_in(5s));
      EXPECT_TRUE(s.is_ok()) << s.error().message;
      if (!s) return;
    }
  });
  std::map<uint64_t, proto::ExpertResponse> got;
  while (got.size() < reqs.size()) {
    net::NetResult<proto::Message> m = c.receive(net::deadline_in(10s));
    if (!m) {
      ADD_FAILURE() << "receive: " << m.error().message;
      break;
    }
    if (auto* e = std::get_if<proto::ExpertError>(&*m)) {
      ADD_FAILURE() << "ERROR " << proto::error_code_name(e->code) << " for request " << e->request_id << ": "
                    << e->message;
      break;
    }
    auto* resp = std::get_if<proto::ExpertResponse>(&*m);
    if (resp == nullptr) {
      ADD_FAILURE() << "unexpected " << proto::frame_type_name(proto::message_frame_type(*m));
      break;
    }
    got[resp->request_id] = std::move(*resp);
  }
  sender.join();
  std::vector<proto::ExpertResponse> out;
  for (const proto::ExpertRequest& r : reqs) out.push_back(got.count(r.request_id) ? got[r.request_id] : proto::ExpertResponse{});
  return out;
}

WorkerStats stats_after(Worker& w, uint64_t requests) {
  for (int i = 0; i < 500 && w.stats().requests < requests; ++i) std::this_thread::sleep_for(10ms);
  WorkerStats s = w.stats();
  EXPECT_EQ(s.requests, requests);
  return s;
}

proto::Message receive_message(net::FrameConnection& c) {
  net::NetResult<proto::Message> m = c.receive(net::deadline_in(5s));
  EXPECT_TRUE(m.is_ok()) << m.error().message;
  return m ? std::move(*m) : proto::Message(proto::Goodbye{"receive failed"});
}

}  // namespace essaim::worker::testing
