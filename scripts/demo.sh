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
echo "== essaim run: generate from the synthetic model (greedy; random weights, so the text is noise)"
"$bin" run -m "$out/tiny-q4k.gguf" -p "Once upon a time" -n 32 --temp 0
echo "== essaim eval: teacher-forced logits of every position as .npy"
"$bin" eval -m "$out/tiny-q4k.gguf" -p "Once upon a time" --logits-out "$out/tiny-q4k.logits.npy"
