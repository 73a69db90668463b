#!/usr/bin/env bash
# Cross-builds the ARM64 (aarch64) phone-class worker, statically linked, and the tests that run under
# qemu-user, into build-arm64/ (or $BUILD_DIR). Needs scripts/install-deps.sh (cross toolchain, arm64 -dev
# packages through multiarch, qemu-user). Extra args go to cmake; BUILD_TARGETS overrides what is built.
#   scripts/build-arm64.sh && qemu-aarch64 build-arm64/src/cli/essaim-worker --help
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-arm64}
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64.cmake \
  -DESSAIM_STATIC=ON -DESSAIM_BENCH=OFF -DESSAIM_COORD=OFF "$@" >/dev/null
ninja -C "$BUILD_DIR" ${NINJA_JOBS:+-j "$NINJA_JOBS"} ${BUILD_TARGETS:-essaim-worker kernels_test worker_exact_test}
