// `essaim npy-diff A.npy B.npy [--tolerance T]`: compare two float32 .npy arrays (logits from `essaim eval`)
// and say how far apart they are. Exit status 0 when they are identical bit for bit (or, with --tolerance,
// when max |Δ| ≤ T), 1 when they differ, 2 when a file cannot be read or the shapes differ.
//
//   essaim eval -m model.gguf -p "Hello" --logits-out mono.npy
//   essaim eval -m model.gguf -p "Hello" --worker 127.0.0.1:9001 --logits-out swarm.npy
//   essaim npy-diff mono.npy swarm.npy          # "max |Δ| = 0 over 1536 values, 0 differ: identical"
#include <bit>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "cli/common_flags.h"
#include "core/npy.h"

namespace essaim::cli {
namespace {

struct NpyDiffArgs {
  std::string a, b;
  double tolerance = 0;
};

std::string shape_text(const NpyArray& x) {
  std::string t = "[";
  for (size_t i = 0; i < x.shape.size(); ++i) t += (i ? ", " : "") + std::to_string(x.shape[i]);
  return t + "]";
}

int run_npy_diff(const NpyDiffArgs& args) {
  Result<NpyArray> a = npy_read_f32(args.a);
  Result<NpyArray> b = npy_read_f32(args.b);
  for (const auto* r : {&a, &b})
    if (!*r) {
      std::fprintf(stderr, "essaim npy-diff: %s\n", r->status().message().c_str());
      return 2;
    }
  if (a->shape != b->shape) {
    std::fprintf(stderr, "essaim npy-diff: shapes differ: %s vs %s\n", shape_text(*a).c_str(), shape_text(*b).c_str());
    return 2;
  }
  // Bit patterns decide "identical" (so NaN == NaN and -0 != +0); max |Δ| is over the values that differ.
  double max_abs = 0;
  size_t differ = 0, first = 0;
  for (size_t i = 0; i < a->data.size(); ++i) {
    const float x = a->data[i], y = b->data[i];
    if (std::bit_cast<uint32_t>(x) == std::bit_cast<uint32_t>(y)) continue;
    if (differ++ == 0) first = i;
    const double d = std::fabs(double(x) - double(y));
    max_abs = std::isnan(d) ? INFINITY : std::max(max_abs, d);
  }
  const bool pass = args.tolerance > 0 ? max_abs <= args.tolerance : differ == 0;
  std::printf("max |Δ| = %.9g over %zu values %s, %zu differ%s: %s\n", max_abs, a->data.size(), shape_text(*a).c_str(),
              differ, differ ? (" (first at flat index " + std::to_string(first) + ")").c_str() : "",
              differ == 0 ? "identical" : (pass ? "within tolerance" : "DIFFERENT"));
  return pass ? 0 : 1;
}

}  // namespace

void register_npy_diff(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<NpyDiffArgs>();
  CLI::App* cmd = app.add_subcommand("npy-diff", "Compare two float32 .npy arrays (max |Δ|; exit 1 if they differ)");
  cmd->add_option("a", args->a, "First .npy file")->required();
  cmd->add_option("b", args->b, "Second .npy file")->required();
  cmd->add_option("--tolerance", args->tolerance, "Accept max |Δ| up to this (default 0: bit-identical)")
      ->check(kNonNegative);
  cmd->callback([args, &exit_code] { exit_code = run_npy_diff(*args); });
}

}  // namespace essaim::cli
