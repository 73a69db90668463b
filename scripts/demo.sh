#!/usr/bin/env bash
# The main job, from a fresh machine: install dependencies, build, then run essaim on an embedded default —
# a synthetic model written by `essaim synth` (no weights can be downloaded here).
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
