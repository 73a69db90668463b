// Float32 NumPy arrays (.npy, format version 1.0): the exchange format for logits (`essaim eval
// --logits-out`) and the llama.cpp reference fixtures.
//
//   ESSAIM_RETURN_IF_ERROR(npy_write_f32("logits.npy", {n_tokens, n_vocab}, logits));
//   ESSAIM_ASSIGN_OR_RETURN(NpyArray a, npy_read_f32("ref.logits.npy"));   // a.shape, a.data (C order)
//
// Only what these files need: little-endian '<f4', C order (fortran_order False), any rank ≥ 1. The
// reader treats the file as untrusted: the magic, version, header length, dictionary syntax, dtype, order
// and shape are checked, and the shape's element count must match the payload size exactly, before any
// allocation sized from the header.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace essaim {

struct NpyArray {
  std::vector<int64_t> shape;
  std::vector<float> data;  // C order, product(shape) values
};

// Writes data (product(shape) floats, C order) as a version 1.0 .npy file.
Status npy_write_f32(const std::string& path, std::span<const int64_t> shape, std::span<const float> data);
Status npy_write_f32(const std::string& path, std::initializer_list<int64_t> shape, std::span<const float> data);

// Parses a whole .npy file held in memory / read from disk.
Result<NpyArray> npy_parse_f32(std::span<const uint8_t> bytes);
Result<NpyArray> npy_read_f32(const std::string& path);

}  // namespace essaim
