#!/usr/bin/env bash
# Paired comparison of two versions of src/kernels/matmul_lanes_avx2.cpp — or of
# src/kernels/matmul_rowlanes_avx512.cpp, told apart by the function they define — in one process
# (bench/ab/lanes_ab.cpp): for hosts where separate runs of the same binary differ by more than the change
# being measured.
#   scripts/lanes-ab.sh A.cpp B.cpp COLS ROWS ACT_ROWS q4_k|q6_k COPIES [PAIRS]
#   git show HEAD~1:src/kernels/matmul_lanes_avx2.cpp > /tmp/old.cpp
#   scripts/lanes-ab.sh /tmp/old.cpp src/kernels/matmul_lanes_avx2.cpp 1024 3072 16 q6_k 16 60
# Needs an x86-64 build in $BUILD_DIR (default build/) for the kernel and core libraries. Prints JSON;
# b_over_a_median < 1 means B is faster. A version compared with itself reads 0.98-1.02 on a noisy host.
# AB_THREADS=2 runs each call's weight rows as two halves on two threads at once (a decode's two threads
# sharing the memory bus); the default is one thread.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 7 ] || { sed -n 2,8p "$0" >&2; exit 2; }
BUILD_DIR=${BUILD_DIR:-build}
A=$1 B=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
flags=(-O2 -std=c++20 -mavx2 -mfma -mf16c -ffp-contract=off -I src)
fn=lanes_matmul_rows
if grep -q "^void rowlanes_matmul_rows(" "$A"; then
  fn=rowlanes_matmul_rows
  flags+=(-mavx512f -mavx512bw -mavx512vl -mavx512vnni -DAB_ROWLANES)
fi
for v in a b; do
  src=$([ $v = a ] && echo "$A" || echo "$B")
  sed 's/^void '$fn'(const WeightMatrix/void lanes_'$v'(const WeightMatrix/' "$src" > "$work/$v.cpp"
  grep -q "^void lanes_$v(" "$work/$v.cpp" || { echo "lanes-ab: $src defines no $fn" >&2; exit 2; }
  g++ "${flags[@]}" -c "$work/$v.cpp" -o "$work/$v.o"
done
g++ "${flags[@]}" bench/ab/lanes_ab.cpp "$work/a.o" "$work/b.o" \
  "$BUILD_DIR/src/kernels/libessaim_kernels.a" "$BUILD_DIR/src/core/libessaim_core.a" -lpthread -o "$work/lanes_ab"
"$work/lanes_ab" "$@"
