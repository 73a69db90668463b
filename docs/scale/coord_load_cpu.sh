#!/bin/bash
# CPU seconds of coord_load_bench (coordinator and clients) and of the PostgreSQL server's processes over
# 10 s of a 20 s, 10,000-node run (docs/scale.md, "The coordinator at 10,000 nodes"). Run from the
# repository root after building build/bench/coord_load_bench (or BENCH=another build of it); as root (the
# server runs as postgres).
set -e
out=$(mktemp)
"${BENCH:-build/bench/coord_load_bench}" --nodes 10000 --heartbeat-s 10 --seconds 20 --clients 8 --store postgres >"$out" &
bench=$!
sleep 12
ticks() {  # utime + stime of the given pids, in clock ticks
  local s=0 t
  for p in "$@"; do
    t=$(awk '{print $14 + $15}' "/proc/$p/stat" 2>/dev/null || echo 0)
    s=$((s + t))
  done
  echo "$s"
}
pg=$(pgrep -u postgres | tr '\n' ' ')
hz=$(getconf CLK_TCK)
b0=$(ticks $bench); p0=$(ticks $pg); read -r _ u n sy id _ </proc/stat; t0=$((u + n + sy + id)); i0=$id
sleep 10
b1=$(ticks $bench); p1=$(ticks $pg); read -r _ u n sy id _ </proc/stat; t1=$((u + n + sy + id)); i1=$id
wait $bench
echo "over 10 s: bench $(((b1 - b0) * 100 / hz))/100 CPU-s, postgres $(((p1 - p0) * 100 / hz))/100 CPU-s, machine idle $((100 * (i1 - i0) / (t1 - t0)))%"
cat "$out"
rm -f "$out"
