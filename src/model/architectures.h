// The architecture registry's entries: one loader per architecture file. Adding an architecture is adding
// its file, one declaration here and one row in registry.cpp's table.
//
//   Result<std::unique_ptr<Model>> m = load_qwen3moe(std::move(file));   // normally via load_model()
#pragma once

#include <memory>

#include "core/status.h"
#include "gguf/gguf_file.h"
#include "model/model.h"

namespace essaim {

Result<std::unique_ptr<Model>> load_qwen3moe(std::unique_ptr<GgufFile> file);  // qwen3moe.cpp
Result<std::unique_ptr<Model>> load_qwen35moe(std::unique_ptr<GgufFile> file);  // qwen35moe.cpp

}  // namespace essaim
