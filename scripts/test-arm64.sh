#!/usr/bin/env bash
# Runs the ARM64 build's tests under qemu-user (after scripts/build-arm64.sh): the kernel tests (every NEON
# and NEON+dotprod kernel against the scalar reference, every shape class; qemu's default CPU has the
# dot-product extension), the ISA detection on a CPU without it (Cortex-A53: plain NEON is chosen), and the
# worker's exactness test. The mixed x86-backbone / ARM64-worker swarm runs in the release ctest
# (backbone_mixed_isa_test, given ESSAIM_ARM64_WORKER).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-arm64}
export ESSAIM_TEST_EMULATOR=qemu-aarch64
qemu-aarch64 "$BUILD_DIR/tests/kernels/kernels_test"
QEMU_CPU=cortex-a53 ESSAIM_ISA_EXPECT=neon qemu-aarch64 "$BUILD_DIR/tests/kernels/kernels_test" \
  --gtest_filter='KernelTable.EnvChild:Dot.EveryVariantEqualsTheScalarReferenceBitForBit'
qemu-aarch64 "$BUILD_DIR/tests/worker/worker_exact_test"
