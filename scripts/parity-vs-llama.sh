#!/usr/bin/env bash
# essaim against llama.cpp on the shipped trained model (models/README.md): the same token ids for a text,
# teacher-forced logits of every position compared (per-position cosine, max |Δ|, argmax), and greedy
# continuations of 64 tokens compared as text. A measuring tool, never part of CI: it needs the reference
# build of ../shared/tools/llama-cpp-reference (LLAMA_DUMP_LOGITS, LLAMA_TOKENIZE, LLAMA_COMPLETION) and Debian's
# python3-numpy for /usr/bin/python3.
#   eval "$(../shared/tools/llama-cpp-reference --env)"; scripts/parity-vs-llama.sh [FILE.gguf ...]
# llama.cpp runs with its plain CPU kernels (DUMP_LOGITS_NO_REPACK=1, --no-repack): on a CPU with AMX its AMX
# path crashes (SIGSEGV in ggml_backend_amx_mul_mat) on every small qwen35moe file, its own fixture
# ../shared/fixtures/qwen35moe-small-q4k.gguf included; the BF16 file never takes that path.
set -euo pipefail
cd "$(dirname "$0")/.."
export DUMP_LOGITS_NO_REPACK=1
bin=build/src/cli/essaim
: "${LLAMA_DUMP_LOGITS:?run: eval \"\$(../shared/tools/llama-cpp-reference --env)\"}"
files=("$@")
((${#files[@]})) || files=(models/kjv-moe-bf16.gguf models/kjv-moe-q8_0.gguf models/kjv-moe-q4_k_m.gguf)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
text=$(head -c 1200 models/heldout.txt)
prompt="And the LORD spake unto Moses, saying,"
for f in "${files[@]}"; do
  echo "== $f"
  "$bin" tokenize -m "$f" -p "$text" > "$work/ids.txt"
  "$LLAMA_TOKENIZE" -m "$f" -p "$text" --ids --log-disable 2>/dev/null | tr -d '[],' | tr ' ' '\n' | grep -v '^$' > "$work/llama_ids.txt" || true
  tr ',' '\n' < "$work/ids.txt" | tr -d ' []' | grep -v '^$' > "$work/essaim_ids.txt"
  if cmp -s "$work/essaim_ids.txt" "$work/llama_ids.txt"; then echo "tokens: identical ($(wc -l < "$work/essaim_ids.txt") ids)";
  else echo "tokens: DIFFER"; fi
  "$LLAMA_DUMP_LOGITS" -m "$f" --tokens-file "$work/essaim_ids.txt" -o "$work/llama.bin" --kv f32 -t 2 2>/dev/null
  "$bin" eval -m "$f" --tokens "$(paste -sd, "$work/essaim_ids.txt")" --kv-type f32 --logits-out "$work/essaim.npy" 2>/dev/null
  /usr/bin/python3 - "$work/llama.bin" "$work/essaim.npy" <<'PY'
import struct, sys
import numpy as np
raw = open(sys.argv[1], "rb").read()
magic, n, v, _ = struct.unpack("<iiii", raw[:16])
ref = np.frombuffer(raw[16 + 4 * n:], dtype="<f4").reshape(n, v).astype(np.float64)
got = np.load(sys.argv[2]).astype(np.float64)
cos = (ref * got).sum(1) / np.linalg.norm(ref, axis=1) / np.linalg.norm(got, axis=1)
print(f"logits: {n} positions, min cosine {cos.min():.9f}, max |d| {np.abs(ref - got).max():.3g}, "
      f"argmax agrees at {(ref.argmax(1) == got.argmax(1)).sum()}/{n}")
PY
  a=$("$bin" run -m "$f" -p "$prompt" -n 64 --temp 0 -s 1 2>/dev/null)
  b=$("$LLAMA_COMPLETION" -m "$f" -p "$prompt" -n 64 --temp 0 -s 1 -no-cnv --no-repack --simple-io \
    --no-display-prompt 2>/dev/null || true)
  if [[ "$a" == "$prompt$b" || "$a" == "$prompt$b"$'\n' ]]; then echo "greedy 64: identical (prompt + 64 tokens)"; else
    echo "greedy 64: DIFFER"; echo "  essaim:    $a" | head -3; echo "  llama.cpp: $b" | head -3; fi
done
