// Slicing throughput: `essaim slice --plan N` on a one-layer Qwen3.5-122B-shaped file, beside a plain
// copy of the same byte count and `cp` of the source file, measured in the same run. Prints one JSON document.
//
//   essaim synth --arch qwen3moe --preset q35-122b --layers 1 --types q4_k_m -o /tmp/essaim-q35-122b-1l.gguf
//   build/bench/slice_bench --model /tmp/essaim-q35-122b-1l.gguf --experts 32 --reps 3
//
// Without the model file the bench writes it itself through the synth library with those same options.
// Every run is warm (the source sits in the page cache after the first read) and nothing is fsync'ed inside
// the timings: all variants see the same cache, so the ratio isolates what slicing adds to a copy (headers,
// slab arithmetic, and the SHA-256 of every output, computed on a second thread while the file is written).
#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "slice/gguf_slice.h"
#include "slice/model_identity.h"
#include "synth/synth.h"
#include "median.h"

namespace essaim {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// CPU seconds (user + system) of this process and its waited-for children (cp).
double cpu_s() {
  rusage self{}, kids{};
  ::getrusage(RUSAGE_SELF, &self);
  ::getrusage(RUSAGE_CHILDREN, &kids);
  const auto sec = [](const timeval& t) { return double(t.tv_sec) + double(t.tv_usec) * 1e-6; };
  return sec(self.ru_utime) + sec(self.ru_stime) + sec(kids.ru_utime) + sec(kids.ru_stime);
}

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// The machine's 1-minute load average: wall-clock figures from a shared machine mean little without it.
double load_average() {
  double l[1] = {0};
  return ::getloadavg(l, 1) == 1 ? l[0] : -1;
}

using bench::median;

// read() + write() of `bytes` bytes from `src` at `offset` into a new file, 8 MiB at a time: what any
// copy costs through the page cache, with the slicer's chunk size.
bool plain_copy(const std::string& src, uint64_t offset, uint64_t bytes, const std::string& dst) {
  const int in = ::open(src.c_str(), O_RDONLY);
  const int out = ::open(dst.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  std::vector<char> buf(size_t(8) << 20);
  bool ok = in >= 0 && out >= 0;
  for (uint64_t done = 0; ok && done < bytes;) {
    const ssize_t n = ::pread(in, buf.data(), size_t(std::min<uint64_t>(buf.size(), bytes - done)), off_t(offset + done));
    ok = n > 0 && ::write(out, buf.data(), size_t(n)) == n;
    done += n > 0 ? uint64_t(n) : 0;
  }
  if (in >= 0) ::close(in);
  if (out >= 0) ::close(out);
  return ok;
}

int run(const std::string& model, uint32_t experts, int reps, const std::string& out_dir) {
  if (!fs::exists(model)) {
    std::fprintf(stderr, "slice_bench: writing %s with the synth library (qwen3moe q35-122b, 1 layer, q4_k_m)\n",
                 model.c_str());
    Result<SynthPlan> plan = synth_plan({.arch = SynthArch::QWEN3MOE, .preset = SynthPreset::Q35_122B, .layers = 1,
                                         .types = SynthTypeMix::Q4_K_M});
    if (!plan) return std::fprintf(stderr, "slice_bench: %s\n", plan.status().message().c_str()), 1;
    Result<SynthSummary> s = synth_write(*plan, model);
    if (!s) return std::fprintf(stderr, "slice_bench: %s\n", s.status().message().c_str()), 1;
  }
  Result<GgufFile> src = GgufFile::open(model);
  if (!src) return std::fprintf(stderr, "slice_bench: %s\n", src.status().message().c_str()), 1;
  Result<MoeLayout> moe = moe_layout(*src);
  if (!moe) return std::fprintf(stderr, "slice_bench: %s\n", moe.status().message().c_str()), 1;
  Result<SliceManifest> plan = plan_manifest(*src, *moe, {.experts_per_slice = experts});
  if (!plan) return std::fprintf(stderr, "slice_bench: %s\n", plan.status().message().c_str()), 1;
  uint64_t bytes = 0;
  for (const ManifestSlice& s : plan->slices) bytes += s.bytes;
  // The copy reference reads the same number of bytes from the start of the first expert tensor on.
  const GgufTensor* first = moe->layers.front().tensors[size_t(ExpertTensorKind::DOWN)];
  for (const GgufTensor* t : moe->layers.front().tensors)
    if (t != nullptr && t->file_offset < first->file_offset) first = t;
  const uint64_t copy_offset = std::min<uint64_t>(first->file_offset, src->file_size() - bytes);

  // Four ways to move the same bytes. Before each: the previous outputs deleted and sync() (untimed), so
  // every variant starts without dirty pages to flush; the order rotates from rep to rep so that no variant
  // always runs right after another's writeback.
  const std::string cp_cmd = "cp '" + model + "' '" + out_dir + "/cp.gguf'";
  const auto slice_plan = [&]() -> bool { return write_plan(*src, *moe, *plan, out_dir).is_ok(); };
  const auto slice_nohash = [&]() -> bool {
    for (const ManifestSlice& s : plan->slices) {
      Result<OutFile> f = expert_slice_file(*src, *moe, {s.layer_first, s.layer_count, s.expert_first, s.expert_count});
      if (!f || !write_out_file(*f, out_dir + "/" + s.file, /*hash=*/false)) return false;
    }
    return true;
  };
  const auto copy = [&]() -> bool { return plain_copy(model, copy_offset, bytes, out_dir + "/copy.bin"); };
  const auto cp = [&]() -> bool { return std::system(cp_cmd.c_str()) == 0; };
  struct Variant {
    const char* name;
    std::function<bool()> run;
    std::vector<double> seconds;
    std::vector<double> cpu_seconds;
  };
  std::vector<Variant> variants = {{"slice_plan", slice_plan, {}, {}}, {"slice_nohash", slice_nohash, {}, {}},
                                   {"plain_copy", copy, {}, {}}, {"cp", cp, {}, {}}};
  for (int rep = -1; rep < reps; ++rep) {  // rep -1 warms the page cache and is not counted
    for (size_t k = 0; k < variants.size(); ++k) {
      Variant& v = variants[(k + size_t(std::max(rep, 0))) % variants.size()];
      fs::remove_all(out_dir);
      fs::create_directories(out_dir);
      ::sync();
      const double t0 = now_s(), c0 = cpu_s();
      if (!v.run()) return std::fprintf(stderr, "slice_bench: %s failed\n", v.name), 1;
      if (rep >= 0) {
        v.seconds.push_back(now_s() - t0);
        v.cpu_seconds.push_back(cpu_s() - c0);
      }
    }
  }
  fs::remove_all(out_dir);
  // SHA-256 alone over the same bytes, in memory, one thread: the floor under slice_plan's second thread.
  std::vector<double> t_hash;
  for (int rep = 0; rep < reps; ++rep) {
    const double t0 = now_s();
    Sha256 h;
    for (const MoeLayer& l : moe->layers)
      for (const GgufTensor* t : l.tensors)
        if (t != nullptr) h.update(t->bytes());
    (void)h.finish();
    t_hash.push_back(now_s() - t0);
  }
  const std::vector<double>& t_slice = variants[0].seconds;
  const std::vector<double>& t_nohash = variants[1].seconds;
  const std::vector<double>& t_copy = variants[2].seconds;
  const std::vector<double>& t_cp = variants[3].seconds;

  const auto mbps = [](double b, double s) { return b / s / 1e6; };
  const double slice = mbps(double(bytes), median(t_slice));
  const double nohash = mbps(double(bytes), median(t_nohash));
  const double copy_mbps = mbps(double(bytes), median(t_copy));
  const double cp_mbps = mbps(double(src->file_size()), median(t_cp));
  const json out = {
      {"bench", "slice"},
      {"model", model},
      {"model_bytes", src->file_size()},
      {"layers", moe->layers.size()},
      {"experts", moe->expert_count},
      {"experts_per_slice", experts},
      {"slices", plan->slices.size()},
      {"slice_bytes", bytes},
      {"reps", reps},
      {"slice_plan_MBps", slice},
      {"slice_nohash_MBps", nohash},
      {"plain_copy_MBps", copy_mbps},
      {"cp_MBps", cp_mbps},
      {"slice_vs_plain_copy", slice / copy_mbps},
      {"slice_vs_cp", slice / cp_mbps},
      {"sha256_only_MBps", mbps(double(bytes), median(t_hash))},
      {"load_average_1min", load_average()},
      {"seconds_median", {{"slice_plan", median(t_slice)}, {"slice_nohash", median(t_nohash)},
                          {"plain_copy", median(t_copy)}, {"cp", median(t_cp)}}},
      {"cpu_seconds_median", {{"slice_plan", median(variants[0].cpu_seconds)},
                              {"slice_nohash", median(variants[1].cpu_seconds)},
                              {"plain_copy", median(variants[2].cpu_seconds)}, {"cp", median(variants[3].cpu_seconds)}}},
  };
  std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

}  // namespace
}  // namespace essaim

int main(int argc, char** argv) {
  CLI::App app{"Slicing throughput vs a plain copy and cp of the same bytes (JSON)"};
  std::string model = "/tmp/essaim-q35-122b-1l.gguf";
  std::string out = "/tmp/essaim-slice-bench";
  uint32_t experts = 32;
  int reps = 3;
  app.add_option("--model", model, "Source model (written with the synth library when missing)");
  app.add_option("--experts", experts, "Experts per slice")->check(CLI::Range(1u, 1u << 20));
  app.add_option("--reps", reps, "Timed repetitions (median reported)")->check(CLI::Range(1, 100));
  app.add_option("--out", out, "Scratch directory (removed afterwards)");
  CLI11_PARSE(app, argc, argv);
  return essaim::run(model, experts, reps, out);
}
