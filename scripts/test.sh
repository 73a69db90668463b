#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install dependencies, build, run every test.
#   1. Release build + ctest (unit, model, multi-process tests)
#   2. ASan + UBSan build (clang) running the tests labelled "sanitize" (hostile-input tests)
#   3. libFuzzer targets (clang), each for a bounded time over its seed corpus
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
jobs=$(nproc)

echo "== release build and tests"
BUILD_DIR=build scripts/build.sh
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
