#!/usr/bin/env bash
# The whole test suite, from a fresh machine: install dependencies, build, run every test.
#   1. Release build + ctest (unit, model, multi-process tests)
#   2. one ASan + UBSan build (clang, libFuzzer-instrumented) running the tests labelled "sanitize"
#      (hostile-input tests), then every libFuzzer target of that build for a bounded time over its seed
#      corpus, one target per CPU at a time
#   3. one ThreadSanitizer build (clang) of only the listeners' concurrency stress tests (label "tsan": the
#      HTTP listener of serve and the coordinator, the relay), run under TSan
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

echo "== sanitizer build (ASan + UBSan, libFuzzer-instrumented): hostile-input tests and fuzz targets from one build"
CC=clang CXX=clang++ BUILD_DIR=build-asan BUILD_TARGETS="labelled_tests fuzz_targets" \
  scripts/build.sh -DESSAIM_SANITIZE=ON -DESSAIM_FUZZ=ON -DESSAIM_BENCH=OFF
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j "$jobs" -L sanitize --timeout 900

echo "== fuzzing (bounded, one target per CPU at a time)"
FUZZ_SECONDS=${FUZZ_SECONDS:-30} scripts/fuzz.sh build-asan
echo "== ThreadSanitizer build (clang): the listeners' concurrency stress tests (label tsan)"
CC=clang CXX=clang++ BUILD_DIR=build-tsan BUILD_TARGETS="tsan_tests" \
  scripts/build.sh -DESSAIM_TSAN=ON -DESSAIM_BENCH=OFF
TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan --output-on-failure -j "$jobs" -L tsan --timeout 600
echo "== all tests passed"
