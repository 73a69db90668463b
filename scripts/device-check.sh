#!/usr/bin/env bash
# The GPU worker's device check, in one run (docs/worker.md, "GPU workers"): on a machine with an NVIDIA
# GPU (planned for one H200 and 16 cores, well under 8 minutes), configures a CUDA build, builds only the
# CUDA targets, their tests and the benchmark, runs the tests (none may be skipped: a GPU is expected
# here), runs gpu_expert_bench and prints its table. Exits non-zero on the first failure.
#   scripts/device-check.sh                  # build-cuda/, bench output in $OUT (or build-cuda/) as JSON
#   BENCH_ARGS="--experts 64" scripts/device-check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build-cuda}
OUT_DIR=${OUT:-$BUILD_DIR}
JOBS=${JOBS:-$(nproc)}
NVCC=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$BUILD_DIR" "$OUT_DIR"
start=$(date +%s)
step() { echo "== [$(( $(date +%s) - start )) s] $*"; }
fail() { echo "device-check: FAILED: $*" >&2; exit 1; }

step "machine"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader \
  || echo "(no nvidia-smi)"
grep -m1 "model name" /proc/cpuinfo || true
echo "cores: $(nproc)"
missing=()
for tool in cmake ninja g++ "$NVCC"; do command -v "$tool" >/dev/null 2>&1 || missing+=("$tool"); done
((${#missing[@]} == 0)) || fail "missing tools: ${missing[*]} (scripts/install-deps.sh installs the Debian ones)"

step "configure ($BUILD_DIR, ESSAIM_CUDA=ON)"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DESSAIM_CUDA=ON -DCMAKE_CUDA_COMPILER="$NVCC" \
  "${launcher[@]}" >"$OUT_DIR/device-check-configure.log" 2>&1 \
  || { tail -30 "$OUT_DIR/device-check-configure.log"; fail "configure"; }
grep "essaim: CUDA" "$OUT_DIR/device-check-configure.log"

step "build (CUDA targets, their tests, the benchmark; -j$JOBS)"
targets=(essaim_gpu gpu_dot_host_test gpu_pipeline_host_test gpu_matmul_test gpu_worker_test gpu_expert_bench essaim-worker)
timeout 300 ninja -C "$BUILD_DIR" -j "$JOBS" "${targets[@]}" >"$OUT_DIR/device-check-build.log" 2>&1 \
  || { tail -40 "$OUT_DIR/device-check-build.log"; fail "build"; }

step "tests"
# The three refusal-path tests skip by design on a CUDA build with a device; everything else must run.
filter='-GpuDeviceSpecTest.CudaIsRefusedClearlyWithoutCudaSupport:GpuDeviceSpecTest.WorkerBinaryRefusesCudaWithoutSupport:GpuDeviceSpecTest.NoVisibleDeviceIsAnErrorNotACrash'
for t in gpu_dot_host_test gpu_pipeline_host_test gpu_matmul_test gpu_worker_test; do
  log="$OUT_DIR/device-check-$t.log"
  timeout 180 "$BUILD_DIR/tests/gpu/$t" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) +\]|skipped: " "$log" | head -20
  ((rc == 0)) || { tail -40 "$log"; fail "$t (exit $rc)"; }
  ! grep -q "^\[  SKIPPED \]" "$log" || fail "$t skipped tests on a machine that should have a GPU"
done

step "essaim-worker offers --device"
"$BUILD_DIR/src/cli/essaim-worker" --help | grep -- "--device" || fail "essaim-worker has no --device option"

step "benchmark"
timeout 240 "$BUILD_DIR/bench/gpu_expert_bench" ${BENCH_ARGS:-} >"$OUT_DIR/gpu_expert_bench.json" \
  2>"$OUT_DIR/gpu_expert_bench.log" || { tail -20 "$OUT_DIR/gpu_expert_bench.log"; fail "gpu_expert_bench"; }
if command -v python3 >/dev/null; then
  python3 - "$OUT_DIR/gpu_expert_bench.json" <<'EOF'
import json, sys
d = json.load(open(sys.argv[1]))
if "skipped" in d:
    sys.exit("benchmark skipped: " + d["skipped"])
print(f"GPU {d['gpu']} ({d['isa_class']}); CPU {d['cpu']} x {d['cpu_threads']} threads ({d['cpu_isa']})")
print(f"{d['shapes']}; {d['experts']} experts, k = {d['k']}; slice {d['slice_bytes']/2**20:.0f} MiB uploaded in "
      f"{d['upload_s']:.2f} s ({d['upload_gb_per_s']:.1f} GB/s), verified in {d['verify_s']:.2f} s; "
      f"GPU memory used {d['gpu_memory_used_bytes']/2**20:.0f} MiB (scratch {d['gpu_scratch_bytes']/2**20:.0f} MiB)")
print("| rows | pairs | GPU pairs/s | GPU GOPS | CPU pairs/s | GPU/CPU | bit-identical |")
print("|---|---|---|---|---|---|---|")
ok = True
for r in d["results"]:
    ok = ok and r.get("bit_identical", True)
    print(f"| {r['rows']} | {r['pairs']} | {r['gpu_pairs_per_s']:,.0f} | {r['gpu_gops']:,.0f} | "
          f"{r.get('cpu_pairs_per_s', 0):,.0f} | {r.get('gpu_vs_cpu', 0):.2f}x | {r.get('bit_identical', '-')} |")
sys.exit(0 if ok else "GPU and CPU outputs differ")
EOF
  [[ $? -eq 0 ]] || fail "benchmark table"
else
  cat "$OUT_DIR/gpu_expert_bench.json"
fi
step "device check passed"
