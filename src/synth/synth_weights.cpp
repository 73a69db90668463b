#include "synth/synth_weights.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <set>

#include "kernels/quantize.h"

namespace essaim {
namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + (shape.size() == 1 ? ",)" : ")");
}

Status check_no_strays(const SynthPlan& plan, const std::string& dir) {
  std::set<std::string> known;
  for (const SynthTensor& t : plan.tensors) known.insert(t.name + ".npy");
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() == ".npy" && !known.count(name))
      return Status::error(dir + "/" + name + ": no tensor of this plan has that name");
  }
  if (ec) return Status::error("cannot list " + dir + ": " + ec.message());
  return Status::ok();
}

}  // namespace

Result<SynthWeights> SynthWeights::load(const SynthPlan& plan, const std::string& dir) {
  ESSAIM_RETURN_IF_ERROR(check_no_strays(plan, dir));
  SynthWeights w;
  w.tensors_.reserve(plan.tensors.size());
  for (const SynthTensor& t : plan.tensors) {
    const std::string path = dir + "/" + t.name + ".npy";
    ESSAIM_ASSIGN_OR_RETURN(NpyArray values, npy_read_f32(path));
    std::vector<int64_t> want(t.ne.rbegin(), t.ne.rend());
    if (values.shape != want)
      return Status::error(path + ": shape " + shape_text(values.shape) + ", the plan needs " + shape_text(want));
    if (!std::all_of(values.data.begin(), values.data.end(), [](float v) { return std::isfinite(v); }))
      return Status::error(path + ": holds a value that is not finite");
    const uint64_t row_bytes = t.nbytes / t.rows();
    w.tensors_.push_back({std::move(values), t.type, t.ne[0], row_bytes});
  }
  return w;
}

void SynthWeights::fill_rows(size_t tensor, uint64_t row_begin, uint64_t row_end, uint8_t* out) const {
  const Tensor& t = tensors_.at(tensor);
  for (uint64_t r = row_begin; r < row_end; ++r)
    quantize_row(t.type, t.values.data.data() + r * uint64_t(t.row_length), out + (r - row_begin) * t.row_bytes,
                 t.row_length);
}

}  // namespace essaim
