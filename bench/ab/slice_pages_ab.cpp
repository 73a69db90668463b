// A worker's expert products over a slice mapped in 4 KiB pages against the same slice in 2 MiB pages, in one
// process, call by call (docs/worker.md, "The slices in 2 MiB pages"). The slice is copied by 4 KiB writes to
// a temporary file (its page cache then holds it in 4 KiB pages, as a download may leave it); the original is
// read again in 2 MiB pages (map_in_huge_pages, what the worker does at start). Then expert_ffn alternates
// between the two on the same random experts of the first layer, and the results must be the same bits.
// Prints JSON: the median ratio huge / small of the per-pair times with its quartiles.
//
//   build/bench/slice_pages_ab --slice s.gguf [--rows 1] [--pairs 400] [-t 2] [--tmp /var/tmp]
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include <unistd.h>

#include "ab_pairs.h"
#include "core/huge_pages.h"
#include "core/thread_pool.h"
#include "slice/expert_slice.h"
#include "kernels/matmul.h"
#include "moe/expert_ffn.h"

namespace essaim {
namespace {

using Clock = std::chrono::steady_clock;

ExpertLayer::Tensor3d view(const GgufTensor& t) {
  return ExpertLayer::Tensor3d{.type = t.type, .cols = t.ne[0], .rows = t.ne[1], .n_experts = t.ne[2],
                               .data = t.data};
}

Result<ExpertLayer> first_layer(const ExpertSlice& s) {
  if (s.layers().empty() || s.gate_up_fused()) return Status::error("needs a slice with separate gate and up");
  const MoeLayer& l = s.layers().front();
  return ExpertLayer::separate(view(*l.tensor(ExpertTensorKind::GATE)), view(*l.tensor(ExpertTensorKind::UP)),
                               view(*l.tensor(ExpertTensorKind::DOWN)), int32_t(s.expert_first()));
}

// Copies src to dst 4 KiB at a time.
bool copy_in_small_writes(const std::string& src, const std::string& dst) {
  std::ifstream in(src, std::ios::binary);
  std::ofstream out(dst, std::ios::binary | std::ios::trunc);
  std::vector<char> buf(4096);
  while (in.read(buf.data(), std::streamsize(buf.size())) || in.gcount() > 0) {
    out.write(buf.data(), in.gcount());
    out.flush();
  }
  return bool(out);
}

double pmd_share(const ExpertSlice& s) {
  const MappedFile& m = s.gguf().mapping();
  return double(file_pmd_mapped_bytes(m.bytes().data(), m.size())) / double(m.size());
}

int run(int argc, char** argv) {
  CLI::App app{"expert_ffn over a slice in 4 KiB pages against the same slice in 2 MiB pages (JSON on stdout)"};
  std::string path, tmp_dir = "/var/tmp";
  int rows = 1, pairs = 400, threads = 2;
  app.add_option("--slice", path, "expert slice (essaim slice)")->required();
  app.add_option("--rows", rows, "activation rows per expert call")->check(CLI::Range(1, 512));
  app.add_option("--pairs", pairs, "call pairs timed")->check(CLI::Range(1, 100000));
  app.add_option("-t,--threads", threads, "threads")->check(CLI::Range(1, 1024));
  app.add_option("--tmp", tmp_dir, "directory for the copy written in 4 KiB writes");
  CLI11_PARSE(app, argc, argv);

  const std::string copy = tmp_dir + "/slice_pages_ab." + std::to_string(getpid()) + ".gguf";
  if (!copy_in_small_writes(path, copy)) {
    std::fprintf(stderr, "slice_pages_ab: cannot write %s\n", copy.c_str());
    return 1;
  }
  Result<ExpertSlice> huge = ExpertSlice::open(path), small = ExpertSlice::open(copy);
  unlink(copy.c_str());  // the mapping keeps the bytes
  if (!huge || !small) {
    std::fprintf(stderr, "slice_pages_ab: %s\n", (!huge ? huge : small).status().message().c_str());
    return 1;
  }
  map_in_huge_pages(huge->gguf().mapping());
  touch_pages(small->gguf().mapping().bytes(), 4096);
  Result<ExpertLayer> lh = first_layer(*huge), ls = first_layer(*small);
  if (!lh || !ls) {
    std::fprintf(stderr, "slice_pages_ab: %s\n", (!lh ? lh : ls).status().message().c_str());
    return 1;
  }
  const ExpertLayer* layer[2] = {&*ls, &*lh};  // 0: 4 KiB pages, 1: 2 MiB pages

  ThreadPool pool{size_t(threads)};
  const int k = std::min<int>(8, lh->n_experts);
  std::mt19937 rng(1);
  std::vector<float> f(size_t(rows) * size_t(lh->n_embd));
  std::normal_distribution<float> normal;
  for (float& v : f) v = normal(rng);
  std::vector<uint8_t> fq(size_t(rows) * lh->activation_row_bytes());
  quantize_activations(lh->gate.type, f.data(), rows, lh->n_embd, fq.data());
  std::vector<float> out[2];
  for (auto& o : out) o.assign(size_t(rows) * size_t(k) * size_t(lh->n_embd), 0.0f);
  std::vector<int32_t> order(size_t(lh->n_experts));
  std::vector<double> ratios;
  for (int p = -8; p < pairs; ++p) {  // eight pairs warm up
    std::vector<int32_t> ids(size_t(rows) * size_t(k));
    for (int r = 0; r < rows; ++r) {
      for (size_t e = 0; e < order.size(); ++e) order[e] = lh->expert_begin + int32_t(e);
      std::shuffle(order.begin(), order.end(), rng);
      std::copy_n(order.begin(), k, ids.begin() + r * k);
    }
    double seconds[2];
    for (int i = 0; i < 2; ++i) {
      const int side = (p & 1) ? 1 - i : i;
      const auto t0 = Clock::now();
      const Status st = expert_ffn(*layer[side], fq.data(), rows, k, ids.data(), out[side].data(), &pool);
      seconds[side] = std::chrono::duration<double>(Clock::now() - t0).count();
      if (!st.is_ok()) {
        std::fprintf(stderr, "slice_pages_ab: %s\n", st.message().c_str());
        return 1;
      }
    }
    if (std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) != 0) {
      std::fprintf(stderr, "slice_pages_ab: the two mappings gave different bits\n");
      return 1;
    }
    if (p >= 0) ratios.push_back(seconds[1] / seconds[0]);
  }
  const nlohmann::json doc = {{"benchmark", "slice_pages_ab"},
                              {"slice", path},
                              {"rows", rows},
                              {"experts_per_row", k},
                              {"threads", threads},
                              {"pairs", pairs},
                              {"small_pages_share_in_2mib", pmd_share(*small)},
                              {"huge_pages_share_in_2mib", pmd_share(*huge)},
                              {"huge_over_small_median", ab::quantile(ratios, 0.5)},
                              {"huge_over_small_q1", ab::quantile(ratios, 0.25)},
                              {"huge_over_small_q3", ab::quantile(ratios, 0.75)}};
  std::printf("%s\n", doc.dump().c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) { return essaim::run(argc, argv); }
