// Structured output: grammars (text/grammar.h) for a JSON Schema, for any JSON object, and for tool calls in
// the model's own tool-call syntax. The schema subset and its limits are listed in docs/serve.md ("Structured
// output"); a keyword outside it is refused with its name and place, never ignored.
//
//   Result<std::shared_ptr<const Grammar>> g = json_schema_grammar(schema, {.in_reasoning = true});
//   if (!g) return bad_request(g.status().message());   // "unsupported JSON Schema keyword 'pattern' at #/properties/id"
//
// Every grammar here generates only text that satisfies its schema (where a keyword has a subset that is
// simpler to generate — a date's day up to 28 in February, property order as declared — the subset is used),
// and has no recursion, so the matcher's states stay finite.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "core/status.h"
#include "text/grammar.h"

namespace essaim {

// How a model writes a tool call (what its chat template renders and serve/chat_output.h parses).
enum class ToolCallSyntax : uint8_t {
  JSON,  // Qwen3: <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
  XML,   // Qwen3.5: <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n</function>\n</tool_call>
};

struct StructuredOutputOptions {
  // The prompt left the model inside <think>: the grammar first lets reasoning text through up to "</think>".
  bool in_reasoning = false;
  GrammarLimits limits;
};

// Bounds of the subset (each one a 400 when passed).
inline constexpr int64_t kSchemaMaxItems = 256;     // minItems / maxItems
inline constexpr int64_t kSchemaMaxLength = 4096;   // minLength / maxLength
inline constexpr size_t kSchemaMaxEnum = 1024;      // enum values
inline constexpr int kSchemaMaxDepth = 32;          // nested schemas, $ref followed
inline constexpr int kAnyJsonDepth = 6;             // nesting of a value the schema does not constrain

// The JSON text `schema` describes (response_format json_schema).
Result<std::shared_ptr<const Grammar>> json_schema_grammar(const nlohmann::ordered_json& schema,
                                                           const StructuredOutputOptions& options);
// Any JSON object (response_format json_object).
Result<std::shared_ptr<const Grammar>> json_object_grammar(const StructuredOutputOptions& options);
// One or more tool calls of the offered `tools` (OpenAI tool objects), or exactly one call of `only` when it is
// not empty (tool_choice naming a function), each with arguments valid against its parameters schema.
Result<std::shared_ptr<const Grammar>> tool_call_grammar(const nlohmann::ordered_json& tools, const std::string& only,
                                                         ToolCallSyntax syntax, const StructuredOutputOptions& options);

}  // namespace essaim
