#!/usr/bin/env bash
# Reproduces models/: installs the training dependencies (Debian packages; never part of CI), trains the
# model, exports its tensors, writes the three shipped GGUF files with `essaim synth --weights`, and prints
# their SHA-256 and the PyTorch perplexity of the held-out text. About an hour on 2 cores.
#   models/train/train.sh [RUN_DIR]        (default /var/tmp/essaim-train)
set -euo pipefail
cd "$(dirname "$0")/../.."
run=${1:-/var/tmp/essaim-train}
export DEBIAN_FRONTEND=noninteractive
pkgs=(python3-torch python3-numpy python3-regex python3-matplotlib libopenblas0-pthread bible-kjv bible-kjv-text)
missing=()
for p in "${pkgs[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p"); done
if ((${#missing[@]})); then apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; fi
# Debian's torch calls whatever libblas.so.3 provides: OpenBLAS instead of the reference BLAS is ~20x faster.
# One thread (torch and OpenBLAS): on a shared 2-core machine OpenMP's spinning threads cost more than they give.
export OPENBLAS_NUM_THREADS=1 MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=2000000000
py=/usr/bin/python3   # Debian's interpreter, the one python3-torch is installed for
mkdir -p "$run"
$py models/train/train.py --out "$run" --steps 400 --seed 1 | tee "$run/log.txt"
$py models/train/export.py --run "$run"
$py models/train/plot.py "$run/loss.csv" models/train/loss.png
BUILD_DIR=build BUILD_TARGETS=essaim scripts/build.sh
for t in bf16 q8_0 q4_k_m; do
  build/src/cli/essaim synth --arch qwen35moe --preset small --nextn 1 --types "$t" --weights "$run/npy" \
    --tokenizer "$run/tokenizer.json" --name "essaim kjv-moe" -o "models/kjv-moe-$t.gguf"
done
cp "$run/heldout.txt" models/heldout.txt
cp "$run/loss.csv" "$run/train.json" models/train/
sha256sum models/kjv-moe-*.gguf
$py models/train/export.py --run "$run" --perplexity models/heldout.txt --ctx 256 --bf16
