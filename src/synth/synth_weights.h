// Given weights for a planned file (`essaim synth --weights DIR`): the trained model of models/ is written
// through the same plan as a synthetic one (keys, names, order, type mix), with each tensor's values read from
// DIR/<tensor name>.npy instead of drawn at random.
//
//   ESSAIM_ASSIGN_OR_RETURN(SynthWeights w, SynthWeights::load(plan, "run/npy"));
//   w.fill_rows(i, row_begin, row_end, out);   // rows of plan.tensors[i], converted to its type
//
// Each .npy is float32 in C order with the tensor's ne reversed (numpy's last axis is ggml's ne[0]), so a row
// of the array is a row of the tensor. Conversion uses the reference quantisers (kernels/quantize.h), which
// write llama.cpp's bytes. Loading checks every tensor of the plan has its file with the right shape and that
// the directory holds no .npy the plan does not name, so a misspelt name is an error, not a random tensor.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/npy.h"
#include "core/status.h"
#include "synth/synth.h"

namespace essaim {

class SynthWeights {
 public:
  static Result<SynthWeights> load(const SynthPlan& plan, const std::string& dir);

  // Rows [row_begin, row_end) of plan.tensors[tensor], each ne[0] values converted to the tensor's type.
  void fill_rows(size_t tensor, uint64_t row_begin, uint64_t row_end, uint8_t* out) const;

 private:
  struct Tensor {
    NpyArray values;
    GgmlType type = GgmlType::F32;
    int64_t row_length = 0;
    uint64_t row_bytes = 0;
  };
  std::vector<Tensor> tensors_;  // in plan order
};

}  // namespace essaim
