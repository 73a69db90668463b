#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install dependencies, build, run every test.
#   1. Release build + ctest (unit, model, multi-process tests)
#   2. ASan + UBSan build (clang) running the tests labelled "sanitize" (hostile-input tests)
#   3. libFuzzer targets (clang), each for a bounded time over its seed corpus
#   The ARM64 worker is cross-built before the release tests: its kernel and worker tests run under
#   qemu-user, and the release ctest's mixed swarm (x86 backbone, ARM64 workers) uses its binary.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --arm64
jobs=$(nproc)

echo "== release build"
BUILD_DIR=build scripts/build.sh

echo "== ARM64 cross build (static worker + kernel/worker tests) and its tests under qemu-user"
BUILD_DIR=build-arm64 scripts/build-arm64.sh
BUILD_DIR=build-arm64 scripts/test-arm64.sh

echo "== release tests"
ESSAIM_ARM64_WORKER="$PWD/build-arm64/src/cli/essaim-worker" \
  ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900

echo "== sanitizer build (ASan + UBSan) and hostile-input tests"
CC=clang CXX=clang++ BUILD_DIR=build-asan BUILD_TARGETS=labelled_tests \
  scripts/build.sh -DESSAIM_SANITIZE=ON -DESSAIM_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L sanitize --timeout 900

echo "== fuzzing (bounded)"
CC=clang CXX=clang++ BUILD_DIR=build-fuzz BUILD_TARGETS=fuzz_targets \
  scripts/build.sh -DESSAIM_FUZZ=ON -DESSAIM_TESTS=OFF -DESSAIM_BENCH=OFF
FUZZ_SECONDS=${FUZZ_SECONDS:-30} scripts/fuzz.sh build-fuzz
echo "== all tests passed"
