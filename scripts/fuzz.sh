#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR/fuzz for FUZZ_SECONDS each, starting from fuzz/corpus/<target>,
# FUZZ_JOBS targets at a time (default: one per CPU; each target is one process on one core).
# A crash, leak or sanitizer report fails the run, prints that target's log and leaves the reproducer in
# BUILD_DIR/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-asan}
seconds=${FUZZ_SECONDS:-30}
jobs=${FUZZ_JOBS:-$(nproc)}
mkdir -p "$BUILD_DIR/artifacts" "$BUILD_DIR/fuzz-logs"
shopt -s nullglob
targets=("$BUILD_DIR"/fuzz/fuzz_*)
if ((${#targets[@]} == 0)); then echo "no fuzz targets built in $BUILD_DIR/fuzz"; exit 1; fi

fuzz_one() {  # target path; writes BUILD_DIR/fuzz-logs/<name>.log, returns the fuzzer's status
  local t=$1 name corpus
  name=$(basename "$t")
  corpus="$BUILD_DIR/corpus/$name"
  mkdir -p "$corpus"
  if [[ -d fuzz/corpus/$name ]]; then cp -n fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true; fi
  "$t" -max_total_time="$seconds" -rss_limit_mb=2048 -artifact_prefix="$BUILD_DIR/artifacts/$name-" \
       -print_final_stats=0 "$corpus" >"$BUILD_DIR/fuzz-logs/$name.log" 2>&1
}

declare -A running=()  # pid -> target name
failed=()
reap() {  # waits for one running target and reports it
  local pid status=0
  wait -n -p pid "${!running[@]}" || status=$?
  local name=${running[$pid]}
  unset "running[$pid]"
  if ((status == 0)); then
    echo "-- $name: ${seconds}s, $(grep -c . "$BUILD_DIR/fuzz-logs/$name.log") log lines, no finding"
  else
    echo "-- $name FAILED (status $status); its log:"
    tail -n 40 "$BUILD_DIR/fuzz-logs/$name.log"
    failed+=("$name")
  fi
}
for t in "${targets[@]}"; do
  while ((${#running[@]} >= jobs)); do reap; done
  fuzz_one "$t" &
  running[$!]=$(basename "$t")
done
while ((${#running[@]} > 0)); do reap; done
if ((${#failed[@]} > 0)); then echo "fuzzing found problems in: ${failed[*]}"; exit 1; fi
echo "fuzzing: ${#targets[@]} targets, ${seconds}s each, $jobs at a time, no finding"
