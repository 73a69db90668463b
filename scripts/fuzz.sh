#!/usr/bin/env bash
# Runs every libFuzzer target in BUILD_DIR/fuzz for FUZZ_SECONDS each, starting from fuzz/corpus/<target>.
# A crash, leak or sanitizer report fails the run and leaves the reproducer in build-fuzz/artifacts/.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-fuzz}
seconds=${FUZZ_SECONDS:-30}
mkdir -p "$BUILD_DIR/artifacts"
shopt -s nullglob
targets=("$BUILD_DIR"/fuzz/fuzz_*)
if ((${#targets[@]} == 0)); then echo "no fuzz targets built"; exit 0; fi
for t in "${targets[@]}"; do
  name=$(basename "$t")
  corpus="$BUILD_DIR/corpus/$name"
  mkdir -p "$corpus"
  [[ -d fuzz/corpus/$name ]] && cp -n fuzz/corpus/"$name"/* "$corpus"/ 2>/dev/null || true
  echo "-- $name for ${seconds}s"
  "$t" -max_total_time="$seconds" -rss_limit_mb=2048 -artifact_prefix="$BUILD_DIR/artifacts/$name-" \
       -print_final_stats=0 "$corpus" 2>&1 | tail -n 3
done
