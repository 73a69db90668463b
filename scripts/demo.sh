#!/usr/bin/env bash
# The main job, from a fresh machine: install dependencies, build, then run essaim on an embedded default —
# a synthetic model written by `essaim synth` (no weights can be downloaded here) — as a local swarm: the
# model cut into expert slices, three `essaim worker` processes each holding a third of every layer's
# experts, a backbone generating text through them, the sharded logits compared with the monolithic
# ones (max |Δ| must be 0; docs/dispatch.md), and `essaim serve` on the same swarm answering one
# OpenAI-style chat request (docs/serve.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD_DIR=build scripts/build.sh
bin=build/src/cli/essaim
out=${ESSAIM_DEMO_DIR:-out/demo}
mkdir -p "$out"

echo "== essaim synth: a tiny qwen3moe model (q4_k_m)"
"$bin" synth --arch qwen3moe --preset tiny --types q4_k_m --seed 1 -o "$out/tiny-q4k.gguf"
echo "== essaim inspect"
"$bin" inspect "$out/tiny-q4k.gguf" | head -n 60

echo "== essaim slice: cut every layer into slices of 2 experts (byte ranges of the source, + manifest)"
rm -rf "$out/slices"
"$bin" slice -m "$out/tiny-q4k.gguf" --plan 2 -o "$out/slices"

echo "== essaim worker x3: each serves experts 0-1, 2-3 or 4-5 of every layer (port 0: the OS picks)"
worker_pids=()
trap 'kill "${worker_pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
workers=()
for experts in 0-1 2-3 4-5; do
  "$bin" worker --slice "$out/slices/qwen3moe.L0.E$experts.gguf" --slice "$out/slices/qwen3moe.L1.E$experts.gguf" \
    --listen 127.0.0.1:0 --threads 1 --quiet > "$out/worker.E$experts.out" &
  worker_pids+=($!)
  for _ in $(seq 100); do grep -q '^listening on ' "$out/worker.E$experts.out" && break; sleep 0.1; done
  address=$(sed -n 's/^listening on //p' "$out/worker.E$experts.out")
  [ -n "$address" ] || { echo "worker for experts $experts did not start" >&2; exit 1; }
  echo "worker for experts $experts of each layer on $address"
  workers+=(--worker "$address")
done

echo "== essaim run: the backbone generates through the swarm (greedy; random weights, so the text is noise)"
"$bin" run -m "$out/tiny-q4k.gguf" -p "Once upon a time" -n 32 --temp 0 "${workers[@]}"

echo "== essaim eval: teacher-forced logits of every position, monolithic and sharded, as .npy"
"$bin" eval -m "$out/tiny-q4k.gguf" -p "Once upon a time" --logits-out "$out/tiny-q4k.logits.npy"
"$bin" eval -m "$out/tiny-q4k.gguf" -p "Once upon a time" --logits-out "$out/tiny-q4k.swarm.logits.npy" "${workers[@]}"
echo "== essaim npy-diff: the sharded logits equal the monolithic ones bit for bit"
"$bin" npy-diff "$out/tiny-q4k.logits.npy" "$out/tiny-q4k.swarm.logits.npy"

echo "== essaim serve: the OpenAI API on the same swarm (port 0: the OS picks), then one curl request"
"$bin" serve -m "$out/tiny-q4k.gguf" --host 127.0.0.1 --port 0 -np 4 -c 512 -t 1 "${workers[@]}" \
  > "$out/serve.out" 2> "$out/serve.err" &
worker_pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$out/serve.out" && break; sleep 0.1; done
server=$(sed -n 's/^listening on //p' "$out/serve.out")
[ -n "$server" ] || { echo "essaim serve did not start:" >&2; cat "$out/serve.err" >&2; exit 1; }
for _ in $(seq 100); do curl -sf "http://$server/health" > /dev/null && break; sleep 0.1; done
echo "essaim serve on $server"
curl -sS "http://$server/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"Hello, swarm!"}],"max_tokens":16,"temperature":0}'
echo
curl -sS "http://$server/metrics" | grep -E '^essaim_(serve_generated_tokens_total|dispatch_worker_pairs_served_total)'
