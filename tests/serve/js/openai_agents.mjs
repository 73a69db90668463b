// The official openai npm client on what agents send, against `essaim serve` on a qwen35moe synth model whose
// template opens a <think> block, started with --reasoning-budget 3 (the server closes the reasoning after 3
// tokens, so every answer has both parts): reasoning split into reasoning_content, whole and streamed; the
// template's enable_thinking=false through chat_template_kwargs; a tool round trip (the assistant's
// tool_calls and the tool's result sent back, the model's answer); constrained decoding: tool_choice naming a
// function and "required" answer with well-formed calls whose arguments satisfy the tool's schema, a
// json_schema response_format answers JSON that satisfies the schema, json_object an object, and a schema
// keyword outside the supported subset is a 400 naming it. The unconstrained answers equal what the C++ test
// got from the same server (greedy).
//
//   node openai_agents.mjs http://127.0.0.1:PORT/v1 expected.json
import { readFileSync } from "node:fs";
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, expectedPath] = process.argv.slice(2);
const expected = JSON.parse(readFileSync(expectedPath, "utf8"));
const client = new OpenAI({ baseURL, apiKey: "none", maxRetries: 0, timeout: 60_000 });
const model = expected.model;
let checks = 0;

// Reasoning, whole answer.
const ask = { model, messages: [{ role: "user", content: "Why is the sky blue?" }], max_tokens: 12, temperature: 0 };
const whole = await client.chat.completions.create(ask);
const msg = whole.choices[0].message;
assert.equal(msg.reasoning_content, expected.reasoning);
assert.equal(msg.content, expected.content);
assert.ok(msg.reasoning_content.length > 0 && msg.content.length > 0, JSON.stringify(msg));
checks++;

// Reasoning, streamed: reasoning deltas come first, then content deltas; they add up to the whole answer.
let reasoning = "", content = "", order = [];
for await (const chunk of await client.chat.completions.create({ ...ask, stream: true })) {
  const d = chunk.choices[0]?.delta ?? {};
  if (d.reasoning_content) { reasoning += d.reasoning_content; if (order.at(-1) !== "r") order.push("r"); }
  if (d.content) { content += d.content; if (order.at(-1) !== "c") order.push("c"); }
}
assert.equal(reasoning, expected.reasoning);
assert.equal(content, expected.content);
assert.deepEqual(order, ["r", "c"]);
checks++;

// enable_thinking=false through the template: no reasoning at all.
const plain = await client.chat.completions.create({ ...ask, chat_template_kwargs: { enable_thinking: false } });
assert.equal(plain.choices[0].message.reasoning_content, undefined);
assert.equal(plain.choices[0].message.content, expected.no_thinking_content);
checks++;

// A tool round trip: the assistant's call and the tool's result go back; the model answers.
const tools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } } }];
const history = [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: null, tool_calls: [{ id: "call_1", type: "function",
    function: { name: "get_weather", arguments: JSON.stringify({ city: "Paris" }) } }] },
  { role: "tool", tool_call_id: "call_1", content: "sunny, 21 C" },
];
const answer = await client.chat.completions.create({ model, messages: history, tools, max_tokens: 10, temperature: 0 });
assert.equal(answer.choices[0].message.content, expected.tool_answer_content);
assert.equal(answer.choices[0].message.reasoning_content, expected.tool_answer_reasoning);
assert.equal(answer.usage.prompt_tokens, expected.tool_answer_prompt_tokens);
checks++;

// tool_choice naming a function: exactly one call of it, its arguments valid against the schema.
const cityTools = [{ type: "function", function: { name: "get_weather", description: "Weather in a city",
  parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Lyon"] }, days: { type: "integer" } },
    required: ["city"], additionalProperties: false } } }];
const checkArgs = (call) => {
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  const args = JSON.parse(call.function.arguments);
  assert.ok(["Paris", "Lyon"].includes(args.city), call.function.arguments);
  if ("days" in args) assert.ok(Number.isInteger(args.days), call.function.arguments);
  assert.deepEqual(Object.keys(args).filter((k) => k !== "city" && k !== "days"), []);
};
const weather = [{ role: "user", content: "Weather in Paris?" }];
const named = await client.chat.completions.create({ model, messages: weather, tools: cityTools, max_tokens: 120,
  temperature: 0, tool_choice: { type: "function", function: { name: "get_weather" } } });
assert.equal(named.choices[0].finish_reason, "tool_calls", JSON.stringify(named));
assert.equal(named.choices[0].message.tool_calls.length, 1);
checkArgs(named.choices[0].message.tool_calls[0]);
// "required", sampled: one or more calls, each well formed.
const required = await client.chat.completions.create({ model, messages: weather, tools: cityTools, max_tokens: 200,
  temperature: 0.8, seed: 5, tool_choice: "required" });
const calls = required.choices[0].message.tool_calls ?? [];
assert.ok(calls.length >= 1, JSON.stringify(required));
calls.forEach(checkArgs);
checks++;

// response_format json_schema: the content is JSON that satisfies the schema (checked here by hand). The schema
// bounds the answer (maxLength, maxItems, no other members; the grammar allows a newline and up to 16 spaces
// between tokens and numbers of at most 33 digits): under 800 characters even with every character of `answer`
// a 12-character surrogate-pair escape, so 1,000 tokens (reasoning and its forced close included) always reach
// its end. The trained model (a 4,096-token vocabulary) answers in ~220 tokens, most of them whitespace.
const schema = { type: "object", properties: { answer: { type: "string", maxLength: 24 }, confidence: { type: "number" },
  tags: { type: "array", items: { enum: ["sky", "light"] }, maxItems: 2 } }, required: ["answer", "confidence"],
  additionalProperties: false };
const structured = await client.chat.completions.create({ ...ask, max_tokens: 1000,
  response_format: { type: "json_schema", json_schema: { name: "answer", strict: true, schema } } });
assert.equal(structured.choices[0].finish_reason, "stop", JSON.stringify(structured));
const value = JSON.parse(structured.choices[0].message.content);
assert.equal(typeof value.answer, "string");
assert.ok([...value.answer].length <= 24);
assert.equal(typeof value.confidence, "number");
if ("tags" in value) assert.ok(value.tags.length <= 2 && value.tags.every((t) => t === "sky" || t === "light"));
assert.deepEqual(Object.keys(value).filter((k) => !(k in schema.properties)), []);
const object = await client.chat.completions.create({ ...ask, max_tokens: 150, temperature: 0.7, seed: 2,
  response_format: { type: "json_object" } });
if (object.choices[0].finish_reason === "stop") {
  const o = JSON.parse(object.choices[0].message.content);
  assert.ok(o !== null && typeof o === "object" && !Array.isArray(o), object.choices[0].message.content);
}
checks++;

// A keyword outside the supported subset: a 400 naming it, never ignored.
await assert.rejects(client.chat.completions.create({ ...ask, response_format: { type: "json_schema",
  json_schema: { name: "n", schema: { type: "object", properties: { id: { type: "string", pattern: "^[a-z]+$" } } } } } }),
  (e) => e instanceof OpenAI.BadRequestError && e.param === "response_format.json_schema.schema" &&
         /'pattern' at #\/properties\/id/.test(e.message));
checks++;

console.log(`openai agents: ${checks} checks passed`);
