#!/usr/bin/env bash
# Installs the pinned openai and @anthropic-ai/sdk npm clients into a build directory (once; reruns reuse it) and runs
# openai_client.mjs against a running `essaim serve`.
#   run.sh BUILD_DIR/serve-js BASE_URL EXPECTED.json [SCRIPT.mjs]   (default openai_client.mjs)
# Fails with a message naming what is missing; the test that calls it skips only when ESSAIM_SKIP_NPM=1.
set -euo pipefail
dir=$1 base_url=$2 expected=$3 script=${4:-openai_client.mjs}
src=$(cd "$(dirname "$0")" && pwd)
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "error: '$tool' not found: install Node.js >= 20 with npm" >&2; exit 2; }
done
mkdir -p "$dir"
exec 9>"$dir/.lock"
flock 9  # several test processes may get here at once
if ! cmp -s "$src/package-lock.json" "$dir/package-lock.json" || [ ! -d "$dir/node_modules/openai" ] ||
   [ ! -d "$dir/node_modules/@anthropic-ai/sdk" ]; then
  cp "$src/package.json" "$src/package-lock.json" "$dir/"
  if ! (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error); then
    rm -f "$dir/package-lock.json"  # do not mistake a failed install for a cached one
    echo "error: 'npm ci' of the clients failed in $dir (is the npm registry reachable?)" >&2
    exit 3
  fi
fi
cp "$src/$script" "$dir/"  # next to node_modules, so node resolves the package
exec node "$dir/$script" "$base_url" "$expected"
