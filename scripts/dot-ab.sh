#!/usr/bin/env bash
# Paired comparison of two versions of the AVX2 dot kernels (src/kernels/dot_quant_avx2.cpp, with the headers
# of the same version) in one process (bench/ab/dot_ab.cpp): for hosts where separate runs of the same binary
# differ by more than the change being measured. A and B are git revisions, or . for the working tree.
#   scripts/dot-ab.sh A B COLS ROWS ACT_ROWS q4_k|q5_k|q6_k COPIES [PAIRS]
#   scripts/dot-ab.sh HEAD~1 . 3072 1024 1 q4_k 64 60     # one activation row (decode), weights beyond L3
#   scripts/dot-ab.sh HEAD~1 . 3072 64 1 q4_k 1 400       # the same kernels with the weights in L2
# Each version is compiled in its own namespace; the former name of the Q6_K prepare (pairs16) is mapped to
# today's. Needs an x86-64 build in $BUILD_DIR (default build/) for the kernel and core libraries. Prints
# JSON; b_over_a_median < 1 means B is faster.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 7 ] || { sed -n 2,11p "$0" >&2; exit 2; }
BUILD_DIR=${BUILD_DIR:-build}
A=$1 B=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-O2 -std=c++20 -mavx2 -mfma -mf16c -ffp-contract=off)
for v in a b; do
  rev=$([ $v = a ] && echo "$A" || echo "$B")
  mkdir -p "$work/$v"
  if [ "$rev" = . ]; then cp -r src "$work/$v/"; else git archive "$rev" src | tar -x -C "$work/$v"; fi
  tu=$work/$v/src/kernels/dot_quant_avx2.cpp
  sed -i 's/prepare_q8k_pairs16_avx2/prepare_q8k_q6k_avx2/g' "$tu"
  grep -q "^void dot_q4k_w4_avx2(" "$tu" || { echo "dot-ab: $rev has no dot_q4k_w4_avx2" >&2; exit 2; }
  g++ "${flags[@]}" -I "$work/$v/src" -Dessaim=essaim_$v -c "$tu" -o "$work/$v.o"
done
g++ "${flags[@]}" -I src bench/ab/dot_ab.cpp "$work/a.o" "$work/b.o" \
  "$BUILD_DIR/src/kernels/libessaim_kernels.a" "$BUILD_DIR/src/core/libessaim_core.a" -lpthread -o "$work/dot_ab"
"$work/dot_ab" "$@"
