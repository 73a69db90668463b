// The official openai npm client against a running `essaim serve`: a chat completion, the same streamed, a
// completion, models.list() and an error case, each checked for shape and for content against the answers
// the C++ test got from the same server with its own HTTP client (greedy, so they must be equal).
//
//   node openai_client.mjs http://127.0.0.1:PORT/v1 expected.json
import { readFileSync } from "node:fs";
import assert from "node:assert/strict";
import OpenAI from "openai";

const [baseURL, expectedPath] = process.argv.slice(2);
const expected = JSON.parse(readFileSync(expectedPath, "utf8"));
const client = new OpenAI({ baseURL, apiKey: expected.api_key, maxRetries: 0, timeout: 60_000 });
const messages = [{ role: "system", content: "Be brief." }, { role: "user", content: "Hello there" }];

// Chat, whole answer.
const chat = await client.chat.completions.create({ model: expected.model, messages, max_tokens: 8, temperature: 0 });
assert.equal(chat.object, "chat.completion");
assert.match(chat.id, /^chatcmpl-/);
assert.equal(chat.model, expected.model);
assert.equal(chat.choices.length, 1);
assert.equal(chat.choices[0].message.role, "assistant");
assert.equal(chat.choices[0].message.content, expected.chat_content);
assert.equal(chat.choices[0].finish_reason, expected.chat_finish_reason);
assert.equal(chat.usage.total_tokens, chat.usage.prompt_tokens + chat.usage.completion_tokens);
assert.equal(chat.usage.completion_tokens, expected.chat_completion_tokens);

// Chat, streamed: the deltas add up to the same answer; usage arrives in the last chunk.
const stream = await client.chat.completions.create({
  model: expected.model, messages, max_tokens: 8, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = "", finish = null, usage = null, chunks = 0, role = null;
for await (const chunk of stream) {
  assert.equal(chunk.object, "chat.completion.chunk");
  chunks++;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta.role) role = c.delta.role;
    if (c.delta.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
assert.ok(chunks >= 3, `only ${chunks} chunks`);
assert.equal(role, "assistant");
assert.equal(text, expected.chat_content);
assert.equal(finish, expected.chat_finish_reason);
assert.deepEqual(usage, chat.usage);

// Completion.
const completion = await client.completions.create({ model: expected.model, prompt: "Once upon a time", max_tokens: 6, temperature: 0 });
assert.equal(completion.object, "text_completion");
assert.equal(completion.choices[0].text, expected.completion_text);
assert.equal(completion.choices[0].finish_reason, "length");
assert.equal(completion.usage.completion_tokens, 6);

// Models.
const models = [];
for await (const m of client.models.list()) models.push(m);
assert.equal(models.length, 1);
assert.equal(models[0].id, expected.model);
assert.equal(models[0].object, "model");

// An error: the client raises its typed BadRequestError carrying our error object.
await assert.rejects(
  client.chat.completions.create({ model: expected.model, messages, max_tokens: -1 }),
  (e) => {
    assert.ok(e instanceof OpenAI.BadRequestError, `got ${e?.constructor?.name}: ${e}`);
    assert.equal(e.status, 400);
    assert.equal(e.code, "invalid_value");
    assert.equal(e.param, "max_tokens");
    assert.equal(e.type, "invalid_request_error");
    assert.match(e.message, /max_tokens/);
    return true;
  });
// A wrong key: AuthenticationError.
const stranger = new OpenAI({ baseURL, apiKey: "wrong", maxRetries: 0 });
await assert.rejects(stranger.models.list(), (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);

console.log("openai client: 6 checks passed");
