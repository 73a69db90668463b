// The official @anthropic-ai/sdk npm client against `essaim serve` POST /v1/messages, on a qwen35moe synth model
// whose template opens a <think> block, started with --reasoning-budget 3 (every answer thinks, then answers):
// a message with a system prompt (thinking block, then text block), the same streamed (message_start …
// message_stop, reassembled by the SDK's own stream helper), thinking disabled through `thinking`, a tool_use
// / tool_result round trip, errors as the SDK's typed exceptions, and tool_choice {type: "tool"} constraining
// the answer to a call of that tool. Every answer equals what the C++ test
// got from the same server with its own HTTP client (greedy).
//
//   node anthropic_client.mjs http://127.0.0.1:PORT expected.json
import { readFileSync } from "node:fs";
import assert from "node:assert/strict";
import Anthropic from "@anthropic-ai/sdk";

const [baseURL, expectedPath] = process.argv.slice(2);
const expected = JSON.parse(readFileSync(expectedPath, "utf8"));
const client = new Anthropic({ baseURL, apiKey: "none", maxRetries: 0, timeout: 60_000 });
const model = expected.model;
let checks = 0;

const ask = { model, max_tokens: 12, temperature: 0, system: "Be brief.",
  messages: [{ role: "user", content: "Why is the sky blue?" }] };

// A whole message: a thinking block, then a text block.
const m = await client.messages.create(ask);
assert.equal(m.type, "message");
assert.equal(m.role, "assistant");
assert.match(m.id, /^msg_/);
assert.equal(m.model, model);
assert.deepEqual(m.content.map((b) => b.type), ["thinking", "text"]);
assert.equal(m.content[0].thinking, expected.thinking);
assert.equal(m.content[1].text, expected.text);
assert.equal(m.stop_reason, expected.stop_reason);
assert.equal(m.usage.input_tokens, expected.input_tokens);
assert.equal(m.usage.output_tokens, 12);
checks++;

// Streamed: the SDK's stream helper sees every event and assembles the same message.
const events = [];
const stream = client.messages.stream(ask);
stream.on("streamEvent", (e) => events.push(e.type));
const streamed = await stream.finalMessage();
assert.deepEqual(streamed.content, m.content.map((b) => (b.type === "thinking" ? { ...b, signature: b.signature ?? "" } : b)));
assert.equal(streamed.stop_reason, m.stop_reason);
assert.equal(streamed.usage.output_tokens, 12);
assert.equal(events[0], "message_start");
assert.equal(events.at(-1), "message_stop");
assert.deepEqual(events.filter((t) => t === "content_block_start").length, 2);
checks++;

// Thinking disabled through the template: one text block.
const plain = await client.messages.create({ ...ask, thinking: { type: "disabled" } });
assert.deepEqual(plain.content.map((b) => b.type), ["text"]);
assert.equal(plain.content[0].text, expected.no_thinking_text);
checks++;

// A tool round trip: the assistant's tool_use and the user's tool_result go back; the model answers.
const tools = [{ name: "get_weather", description: "Weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } }];
const answer = await client.messages.create({ model, max_tokens: 10, temperature: 0, tools, messages: [
  { role: "user", content: "Weather in Paris?" },
  { role: "assistant", content: [{ type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Paris" } }] },
  { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_1", content: "sunny, 21 C" }] },
] });
assert.equal(answer.content.map((b) => b.text ?? b.thinking).join("|"), expected.tool_answer);
assert.equal(answer.usage.input_tokens, expected.tool_input_tokens);
checks++;

// Errors: the SDK's typed BadRequestError with Anthropic's error body.
await assert.rejects(client.messages.create({ model, messages: ask.messages }), (e) => {
  assert.ok(e instanceof Anthropic.BadRequestError, `got ${e?.constructor?.name}: ${e}`);
  assert.equal(e.status, 400);
  assert.equal(e.error.type, "error");
  assert.equal(e.error.error.type, "invalid_request_error");
  assert.match(e.error.error.message, /max_tokens/);
  return true;
});
checks++;

// tool_choice "tool": decoding is constrained to a call of that tool, its input valid against its schema.
const cityTools = [{ name: "get_weather", description: "Weather in a city",
  input_schema: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Lyon"] } }, required: ["city"] } }];
const forced = await client.messages.create({ model, max_tokens: 250, temperature: 0, tools: cityTools,
  tool_choice: { type: "tool", name: "get_weather" }, messages: [{ role: "user", content: "Weather in Paris?" }] });
assert.equal(forced.stop_reason, "tool_use", JSON.stringify(forced));
const use = forced.content.find((b) => b.type === "tool_use");
assert.equal(use.name, "get_weather");
assert.ok(["Paris", "Lyon"].includes(use.input.city), JSON.stringify(use));
checks++;

console.log(`anthropic client: ${checks} checks passed`);
