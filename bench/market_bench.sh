#!/usr/bin/env bash
# The coverage market's figures on one machine, all processes on loopback: time to full coverage for a swarm
# built from nothing (coordinator + 4 self-joining workers whose budgets hold one slice each), time to
# re-coverage after kill -9 of one worker (a spare with free budget takes its range), slice download speed
# vs reading the same file from disk, and the adaptive audit's overhead (median eval time with audits vs
# --no-audit on the same swarm, same run). Prints one JSON document.
#
#   bench/market_bench.sh [BUILD_DIR] [EVAL_REPEATS]      # default build, 7
set -euo pipefail
BUILD=${1:-build}
REPEATS=${2:-7}
E=$(realpath "$BUILD/src/cli/essaim")
W=$(realpath "$BUILD/src/cli/essaim-worker")
T=$(mktemp -d)
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT
cd "$T"
now() { date +%s.%N; }
ADM=market-bench-admin-token
HB=1

"$E" synth --arch qwen3moe --preset tiny --types q4_k_m --seed 3 -o tiny.gguf >/dev/null 2>&1
"$E" slice -m tiny.gguf --plan 3 -o slices >/dev/null 2>&1
"$E" coordinator --model tiny.gguf --slices slices --db coord.sqlite --listen 127.0.0.1:0 --admin-token $ADM \
  --replicas 1 --heartbeat-s $HB >coord.out 2>coord.err &
PIDS+=($!)
for _ in $(seq 100); do grep -q listening coord.out 2>/dev/null && break; sleep 0.1; done
URL=http://$(sed -n 's/listening on //p' coord.out)
api() { curl -sf -H "Authorization: Bearer $ADM" "$@"; }
node() { api -X POST -d "{\"name\":\"$1\"}" "$URL/api/nodes" | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["node_id"], j["token"])'; }
# "ranges held" and the holders' node ids, from the live map
cover() { api "$URL/api/expert-map" | python3 -c 'import json,sys; m=json.load(sys.stdin); print(len({(h["layer"],h["expert_first"]) for w in m["workers"] for h in w["holdings"]}), " ".join(w["label"] for w in m["workers"]))'; }
wait_full() {  # [must-hold node id] -> seconds
  local t0; t0=$(now)
  for _ in $(seq 600); do
    local c; c=$(cover)
    if [[ $c == 4* && ( -z ${1:-} || $c == *"$1"* ) ]]; then python3 -c "print(round($(now)-$t0,3))"; return; fi
    sleep 0.05
  done
  echo -1
}

t0=$(now)
WPIDS=()
for i in 0 1 2 3; do
  read -r id tok < <(node "w$i")
  "$W" --coordinator "$URL" --token "$tok" --budget-mb 0.4 --data-dir "d$i" --listen 127.0.0.1:0 -q >"w$i.out" 2>"w$i.err" &
  PIDS+=($!); WPIDS+=($!)
done
full=$(wait_full)
full_total=$(python3 -c "print(round($(now)-$t0,3))")

# Audit overhead: the same prompt, alternating with and without audits; eval_s of the --json summary (the
# evaluation itself: no process start, no model load). Batches of 4 tokens: many layer calls, so the
# adaptive schedule gets past a new worker's audit-everything start.
PROMPT=$(python3 -c "print(' '.join(['the swarm organises itself and heals when a device disappears'] * 40))")
evals() { "$E" eval -m tiny.gguf -p "$PROMPT" -b 4 --logits-out "$1.npy" --coordinator "$URL" --token $ADM $2 --json 2>/dev/null \
  | python3 -c 'import json,sys; j=json.load(sys.stdin); print(j["eval_s"], j["dispatch"]["audits"], j["dispatch"]["responses"])'; }
with=(); without=(); audits=""
for r in $(seq "$REPEATS"); do
  read -r s a n < <(evals audit ""); with+=("$s"); audits="$a of $n"
  read -r s a n < <(evals noaudit --no-audit); without+=("$s")
done
"$E" eval -m tiny.gguf -p "$PROMPT" -b 4 --logits-out mono.npy >/dev/null 2>&1
same=$(cmp -s mono.npy audit.npy && cmp -s mono.npy noaudit.npy && echo true || echo false)
median() { printf '%s\n' "$@" | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
mw=$(median "${with[@]}"); mo=$(median "${without[@]}")

# Slice download speed vs the disk: one slice through GET /slices (curl, like the worker's client) and cat.
SL=$(ls slices/*.gguf | head -1); NAME=$(basename "$SL")
read -r _ tokd < <(node dl)
dl=$(curl -sf -o /dev/null -w '%{speed_download}' -H "Authorization: Bearer $tokd" "$URL/slices/$NAME")
disk_t0=$(now); for _ in $(seq 50); do cat "$SL" >/dev/null; done; disk_s=$(python3 -c "print(($(now)-$disk_t0)/50)")
bytes=$(stat -c %s "$SL")

# Churn: a spare waits with free budget; kill -9 worker 0.
read -r spare_id spare_tok < <(node spare)
"$W" --coordinator "$URL" --token "$spare_tok" --budget-mb 0.4 --data-dir spare --listen 127.0.0.1:0 -q >spare.out 2>spare.err &
PIDS+=($!)
sleep 2
kill -9 "${WPIDS[0]}"; wait "${WPIDS[0]}" 2>/dev/null || true
recover=$(wait_full "$spare_id")

cpu=$(grep -m1 "model name" /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')
cat <<JSON
{"bench": "market", "cpu": "$cpu", "heartbeat_s": $HB,
 "full_coverage_s": $full, "full_coverage_from_first_start_s": $full_total,
 "recoverage_after_kill_s": $recover,
 "eval_median_s_with_audits": $mw, "eval_median_s_without_audits": $mo,
 "audit_overhead_ratio": $(python3 -c "print(round($mw/$mo,3))"), "audited_responses": "$audits", "eval_repeats": $REPEATS, "bit_identical": $same,
 "slice_bytes": $bytes, "download_bytes_per_s": $dl, "disk_read_bytes_per_s": $(python3 -c "print(round($bytes/$disk_s))"),
 "download_vs_disk_ratio": $(python3 -c "print(round($dl/($bytes/$disk_s),4))")}
JSON
