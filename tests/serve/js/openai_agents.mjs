// The official openai npm client on what agents send, against `essaim serve` on a qwen35moe synth model whose
// template opens a <think> block, started with --reasoning-budget 3 (the server closes the reasoning after 3
// tokens, so every answer has both parts): reasoning split into reasoning_content, whole and streamed; the
// template's enable_thinking=false through chat_template_kwargs; a tool round trip (the assistant's
// tool_calls and the tool's result sent back, the model's answer); tool_choice "required" refused by name.
// Every answer equals what the C++ test got from the same server (greedy).
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

// tool_choice "required" needs constrained decoding: refused by name, not silently treated as "auto".
await assert.rejects(
  client.chat.completions.create({ model, messages: history, tools, tool_choice: "required" }),
  (e) => e instanceof OpenAI.BadRequestError && e.code === "unsupported_value" && e.param === "tool_choice");
checks++;

console.log(`openai agents: ${checks} checks passed`);
