// A bounded subset of Jinja2 for chat templates (the `tokenizer.chat_template` of a GGUF file), rendered
// the way Hugging Face's apply_chat_template renders it: trim_blocks and lstrip_blocks on, `tojson` as
// json.dumps(ensure_ascii=False) keeping key order, `raise_exception(msg)` an error. What it covers is what the
// Qwen3 / Qwen3.5 templates and the trained model's use (docs/serve.md, "Chat templates"): {{ }}, {% if / elif /
// else %}, {% for a[, b] in x %} with loop.*, {% set x = ... %} and {% set ns.x = ... %}, {% macro %}, comments,
// whitespace control; literals, names, attributes, subscripts and slices, calls, filters, tests, arithmetic,
// comparisons, `in`, `and/or/not`, `a if c else b`; the str methods templates call (startswith, split, strip...).
// Anything else is a parse error naming the line. Rendering is bounded: template size, output bytes, steps
// (loop iterations and calls), macro recursion and expression nesting each have a limit, and exceeding one is
// an error, never a crash or a hang (fuzz/fuzz_jinja.cpp).
//
//   ESSAIM_ASSIGN_OR_RETURN(jinja::Template t, jinja::Template::parse(vocab.chat_template));
//   nlohmann::ordered_json ctx = {{"messages", msgs}, {"add_generation_prompt", true}, {"enable_thinking", false}};
//   ESSAIM_ASSIGN_OR_RETURN(std::string prompt, t.render(ctx));
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "core/status.h"

namespace essaim::jinja {

struct Limits {
  size_t max_template_bytes = 256 * 1024;
  size_t max_output_bytes = 4 * 1024 * 1024;  // every byte the template writes, macro results included
  uint64_t max_steps = 2'000'000;  // loop iterations + calls + output writes, per render
  int max_call_depth = 32;         // nested macro calls
  int max_nesting = 64;            // nested blocks and expressions, at parse time
};

struct Node;  // the parsed template (text/jinja_ast.h)

class Template {
 public:
  static Result<Template> parse(std::string_view source, Limits limits = {});
  // `context`'s top-level keys are the template's variables (messages, tools, add_generation_prompt, ...).
  Result<std::string> render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const Node> root_;
  Limits limits_;
};

}  // namespace essaim::jinja
