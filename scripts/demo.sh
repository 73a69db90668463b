#!/usr/bin/env bash
# The main job, from a fresh machine: install dependencies, build, then run essaim on its embedded default —
# kjv-moe, the qwen35moe model trained in this repository (models/README.md: Gated DeltaNet + gated attention,
# 32 experts top-8 per layer, an MTP block; trained on the King James Bible) — as a local swarm: the model cut
# into expert slices, served by `essaim coordinator`, four `essaim worker` processes that join the coverage
# market by themselves (each volunteers, downloads and serves its slices; one has no listening port and serves
# through `essaim relay`, the phone's path), a backbone that maps only the
# backbone file (the dense path, no expert bytes) writing text through the coordinator's live expert map, its
# logits compared with the monolithic full-model ones (max |Δ| must be 0; docs/dispatch.md), and `essaim serve`
# from the same backbone file on the same swarm answering one OpenAI-style chat request (docs/serve.md); then
# the 122B shapes (`essaim synth`): one layer with Qwen3.5-122B-A10B's attention and 256 experts, its backbone
# file (2 % of the model) over 4 workers giving the full model's logits bit for bit.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
BUILD_DIR=build scripts/build.sh
bin=build/src/cli/essaim
out=${ESSAIM_DEMO_DIR:-out/demo}
mkdir -p "$out"
model=models/kjv-moe-q4_k_m.gguf

echo "== the model: $model (trained here; models/README.md)"
"$bin" inspect "$model" > "$out/inspect.txt"   # (no pipe into head: with pipefail its early exit would fail the script)
head -n 40 "$out/inspect.txt"
echo "== essaim run: one machine, greedy"
"$bin" run -m "$model" -p "In the beginning" -n 48 --temp 0

echo "== essaim slice: cut every layer into slices of 8 experts (byte ranges of the source, + manifest) and the backbone file"
rm -rf "$out/slices"
"$bin" slice -m "$model" --plan 8 --backbone -o "$out/slices"
backbone="$out/slices/qwen35moe.backbone.gguf"
echo "backbone file: $(wc -c < "$backbone") bytes of the full model's $(wc -c < "$model") (no routed expert)"
n_slices=$(grep -o '"expert_first"' "$out/slices/manifest.json" | wc -l)

echo "== essaim coordinator: the coverage market for these slices (SQLite; port 0: the OS picks)"
admin=demo-admin-token-0123456789
pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true' EXIT
rm -rf "$out/market" && mkdir -p "$out/market"
"$bin" coordinator --model "$model" --slices "$out/slices" --db "$out/market/coord.sqlite" \
  --listen 127.0.0.1:0 --admin-token "$admin" --replicas 1 --heartbeat-s 2 > "$out/market/coord.out" 2> "$out/market/coord.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$out/market/coord.out" && break; sleep 0.1; done
coordinator="http://$(sed -n 's/^listening on //p' "$out/market/coord.out")"
[ "$coordinator" != "http://" ] || { echo "the coordinator did not start:" >&2; cat "$out/market/coord.err" >&2; exit 1; }
echo "coordinator on $coordinator"

# register NAME [ROLE]: a node at the coordinator; prints its token.
register() {
  curl -sf -X POST "$coordinator/api/nodes" -H "Authorization: Bearer $admin" -d "{\"name\":\"$1\",\"role\":\"${2:-worker}\"}" \
    | sed -n 's/.*"token":"\([0-9a-f]*\)".*/\1/p'
}

echo "== essaim relay: workers behind NAT dial out to it; it checks every token with the coordinator (plain ws:// on loopback)"
"$bin" relay --listen 127.0.0.1:0 --coordinator "$coordinator" --quiet > "$out/market/relay.out" 2> "$out/market/relay.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$out/market/relay.out" && break; sleep 0.1; done
relay="ws://$(sed -n 's/^listening on //p' "$out/market/relay.out")"
[ "$relay" != "ws://" ] || { echo "the relay did not start:" >&2; cat "$out/market/relay.err" >&2; exit 1; }
echo "relay on $relay"

echo "== the phone's path: a worker with no listening port joins the market and serves through the relay"
start=$(date +%s.%N)
token=$(register demo-phone)
[ -n "$token" ] || { echo "could not register the phone" >&2; exit 1; }
"$bin" worker --coordinator "$coordinator" --relay "$relay" --token "$token" --budget-mb 2 \
  --data-dir "$out/market/phone" --threads 1 --quiet > "$out/market/phone.out" 2> "$out/market/phone.err" &
pids+=($!)
phone=""
for _ in $(seq 300); do
  # (first, so that it takes a third of the slices before the others join: its address is its relay path)
  phone=$({ curl -sf "$coordinator/api/expert-map" -H "Authorization: Bearer $admin" || true; } | { grep -o "\"$relay/node/[^\"]*\"" || true; })
  [ -n "$phone" ] && break
  sleep 0.1
done
[ -n "$phone" ] || { echo "the phone did not join:" >&2; cat "$out/market/phone.err" >&2; exit 1; }
echo "the phone serves at $phone"

echo "== essaim worker x3: each joins by itself with a 2 MiB budget (a third of the slices): volunteers, downloads, serves"
for i in 1 2 3; do
  token=$(register "demo-$i")
  [ -n "$token" ] || { echo "could not register worker $i" >&2; exit 1; }
  "$bin" worker --coordinator "$coordinator" --token "$token" --budget-mb 2 --data-dir "$out/market/worker$i" \
    --listen 127.0.0.1:0 --threads 1 --quiet > "$out/market/worker$i.out" 2> "$out/market/worker$i.err" &
  pids+=($!)
done
held=0
for _ in $(seq 300); do
  # (an empty map, or a coordinator still busy, is not an error yet: grep finding nothing would end the script)
  held=$({ curl -sf "$coordinator/api/expert-map" -H "Authorization: Bearer $admin" || true; } | { grep -o '"expert_first"' || true; } | wc -l)
  [ "$held" -ge "$n_slices" ] && break
  sleep 0.1
done
[ "$held" -ge "$n_slices" ] || { echo "the swarm did not cover the model:" >&2; cat "$out"/market/worker*.err >&2; exit 1; }
echo "full coverage ($n_slices slices on 4 workers, one behind the relay) in $(awk "BEGIN {printf \"%.2f\", $(date +%s.%N) - $start}") s:"
curl -sf "$coordinator/api/expert-map" -H "Authorization: Bearer $admin"; echo
# The backbone's own node token: the coordinator's map and reports, and the relay's check when it dials the phone.
backbone_token=$(register demo-backbone backbone)
[ -n "$backbone_token" ] || { echo "could not register the backbone" >&2; exit 1; }
workers=(--coordinator "$coordinator" --token "$backbone_token")

echo "== essaim run: the backbone file (dense path only) writes through the swarm (greedy: the same text as on one machine)"
"$bin" run --backbone-file "$backbone" -p "In the beginning" -n 48 --temp 0 "${workers[@]}"

echo "== essaim eval: teacher-forced logits of every position, monolithic (full model) and from the backbone file over the swarm, as .npy"
"$bin" eval -m "$model" -p "And God said unto Noah" --logits-out "$out/kjv.logits.npy"
"$bin" eval --backbone-file "$backbone" -p "And God said unto Noah" --logits-out "$out/kjv.swarm.logits.npy" "${workers[@]}"
echo "== essaim npy-diff: the sharded logits equal the monolithic ones bit for bit"
"$bin" npy-diff "$out/kjv.logits.npy" "$out/kjv.swarm.logits.npy"

echo "== essaim serve: the OpenAI API on the same swarm (port 0: the OS picks), then one curl request"
"$bin" serve --backbone-file "$backbone" --host 127.0.0.1 --port 0 -np 4 -c 512 -t 1 "${workers[@]}" \
  > "$out/serve.out" 2> "$out/serve.err" &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening on ' "$out/serve.out" && break; sleep 0.1; done
server=$(sed -n 's/^listening on //p' "$out/serve.out")
[ -n "$server" ] || { echo "essaim serve did not start:" >&2; cat "$out/serve.err" >&2; exit 1; }
for _ in $(seq 100); do curl -sf "http://$server/health" > /dev/null && break; sleep 0.1; done
echo "essaim serve on $server"
curl -sS "http://$server/v1/chat/completions" -H 'Content-Type: application/json' \
  -d '{"messages":[{"role":"user","content":"And the LORD spake unto Moses, saying,"}],"max_tokens":48,"temperature":0}'
echo
curl -sS "http://$server/metrics" | grep -E '^essaim_(serve_generated_tokens_total|dispatch_worker_pairs_served_total)'
echo "== the market's ledger: the pairs each worker's answers were accepted for (a backbone without the experts audits nothing)"
sleep 6  # the backbones report every 5 s
curl -sS "$coordinator/api/rewards" -H "Authorization: Bearer $admin"; echo

echo "== the 122B shapes: one qwen3moe layer with Qwen3.5-122B-A10B's attention and experts (256 of 3072 x 1024, Q4_K_M)"
big="$out/q122"
rm -rf "$big" && mkdir -p "$big"
"$bin" synth --arch qwen3moe --preset q35-122b --layers 1 --types q4_k_m --seed 2 -o "$big/q122.gguf"
"$bin" slice -m "$big/q122.gguf" --plan 64 --backbone --stem q122 -o "$big/slices"
echo "backbone file: $(wc -c < "$big/slices/q122.backbone.gguf") bytes of the full model's $(wc -c < "$big/q122.gguf")"
big_workers=()
for r in 0-63 64-127 128-191 192-255; do
  "$bin" worker --slices "$big/slices" --experts "$r" --listen 127.0.0.1:0 --threads 1 --quiet \
    > "$big/worker-$r.out" 2> "$big/worker-$r.err" &
  pids+=($!)
done
for r in 0-63 64-127 128-191 192-255; do
  for _ in $(seq 300); do grep -q '^listening on ' "$big/worker-$r.out" && break; sleep 0.1; done
  w=$(sed -n 's/^listening on //p' "$big/worker-$r.out")
  [ -n "$w" ] || { echo "the worker for experts $r did not start:" >&2; cat "$big/worker-$r.err" >&2; exit 1; }
  big_workers+=(--worker "$w")
done
echo "4 workers hold experts 0-63, 64-127, 128-191, 192-255 of the layer: ${big_workers[*]}"
prompt="The swarm holds the experts; the backbone holds the rest."
"$bin" eval -m "$big/q122.gguf" -p "$prompt" -t 2 --logits-out "$big/mono.npy"
"$bin" eval --backbone-file "$big/slices/q122.backbone.gguf" -p "$prompt" -t 2 --require-workers \
  --logits-out "$big/swarm.npy" "${big_workers[@]}"
echo "== essaim npy-diff: the backbone file over 4 workers equals the full 122B-shaped model bit for bit"
"$bin" npy-diff "$big/mono.npy" "$big/swarm.npy"
rm -f "$big/q122.gguf" "$big"/slices/*.gguf  # 3 GB of synthetic weights
