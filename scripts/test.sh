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
#   When nvcc is present (/usr/local/cuda/bin/nvcc, or $NVCC), the CUDA worker is built in build-cuda/ (only the
#   GPU targets and their tests) and its tests run: without a GPU the device cases skip, the host-side ones run.
# Every dependency scripts/install-deps.sh installs is required here: a test that would skip for lack of one
# fails instead (ESSAIM_REQUIRE_DEPS=1, tests/support/skip.h; CI=true does the same). Missing hardware (a GPU,
# a CPU feature) still skips.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --arm64
jobs=$(nproc)
export ESSAIM_REQUIRE_DEPS=1

# Through ccache: the CUDA build below compiles most files exactly as the release build does (same compiler,
# flags and sources), so it takes them from the cache instead of compiling them a second time.
launcher=()
command -v ccache >/dev/null 2>&1 && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

echo "== release build"
BUILD_DIR=build scripts/build.sh "${launcher[@]}"

echo "== ARM64 cross build (static worker + kernel/worker tests) and its tests under qemu-user"
BUILD_DIR=build-arm64 scripts/build-arm64.sh
BUILD_DIR=build-arm64 scripts/test-arm64.sh

echo "== release tests"
ESSAIM_ARM64_WORKER="$PWD/build-arm64/src/cli/essaim-worker" \
  ctest --test-dir build --output-on-failure -j "$jobs" --timeout 900

NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
if command -v "$NVCC" >/dev/null 2>&1; then
  echo "== CUDA worker build (ESSAIM_CUDA=ON, GPU targets only) and its tests (device cases skip without a GPU)"
  cuda_start=$SECONDS
  BUILD_DIR=build-cuda BUILD_TARGETS="essaim_gpu essaim-worker gpu_worker_test gpu_matmul_test" \
    scripts/build.sh -DESSAIM_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" -DESSAIM_BENCH=OFF -DESSAIM_COORD=OFF "${launcher[@]}"
  # Only the binaries built above (the other test binaries of build-cuda are the release build's, unbuilt here).
  ctest --test-dir build-cuda --output-on-failure -j "$jobs" --timeout 900 --no-tests=error \
    -R '^(Models/)?Gpu(DeviceSpec|WorkerExact|Matmul)Test\.'
  echo "   (CUDA stage: $((SECONDS - cuda_start)) s)"
else
  echo "== no nvcc ($NVCC): the CUDA worker is not built"
fi

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
