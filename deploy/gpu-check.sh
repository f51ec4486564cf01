#!/usr/bin/env bash
# `make gpu-check`, run on the GPU machine: builds the kernels with CUDA and
# without gRPC, runs the GPU tests (ctest -L gpu, then the test binary under
# compute-sanitizer memcheck), nibble-gpu-bench (u4b8, fp4, mxfp4 and nvfp4)
# and the PyTorch baselines, and prints bench/kernels/cuda/gpu_report.py's tables of
# the targets and of the formats side by side last.
#
# Usage: deploy/gpu-check.sh [BUILD_DIR]   (default build-gpu)
#
# Environment:
#   OUT                     logs, JSON lines and the report (default
#                           BUILD_DIR/gpu-check)
#   JOBS                    build jobs (default: nproc)
#   GPU_CHECK_QUICK=1       two shapes and 50 repeats for the benchmarks
#   BENCH_REPEATS=N         timed launches per point for both benchmarks
#   SANITIZER_GTEST_FILTER  the tests compute-sanitizer runs (default *)
#   SANITIZER_TIMEOUT       seconds before the sanitizer run is stopped
#                           (default 180)
#   PYTHON                  a python3 with torch (default: python3, else
#                           /opt/torch/.venv/bin/python3)
#
# The machine has no abseil: `make gpu-deps` on a Debian machine copies
# Debian's into .gpu-deps/usr, which this script uses when it is there.
# A failed step does not stop the steps that do not need it; the script ends
# with the passed, failed and skipped steps, the report, and exit status 1
# when any step failed or was skipped.
set -uo pipefail

cd "$(dirname "$0")/.." || exit 1
BUILD_DIR=${1:-build-gpu}
OUT=${OUT:-$BUILD_DIR/gpu-check}
JOBS=${JOBS:-$(nproc)}
SANITIZER_TIMEOUT=${SANITIZER_TIMEOUT:-180}
mkdir -p "$OUT" || exit 1

passed=()
failed=()
skipped=()

# step NAME LOG COMMAND...: runs COMMAND with its output in $OUT/LOG and
# records NAME as passed or failed; on failure shows the log's tail.
step() {
  local name=$1 log=$OUT/$2
  shift 2
  local start=$SECONDS
  echo "== $name"
  "$@" >"$log" 2>&1
  local rc=$?
  if ((rc == 0)); then
    echo "   ok in $((SECONDS - start)) s ($log)"
    passed+=("$name")
    return 0
  fi
  tail -n 25 "$log" | sed 's/^/   | /'
  if ((rc == 124)); then
    echo "   FAILED: stopped after $((SECONDS - start)) s ($log)"
  else
    echo "   FAILED with status $rc in $((SECONDS - start)) s ($log)"
  fi
  failed+=("$name")
  return 1
}

skip() {
  echo "== $1: skipped, $2"
  skipped+=("$1")
}

# The summary, then the report; the exit status.
finish() {
  echo "== passed: ${passed[*]:-none}"
  echo "== failed: ${failed[*]:-none}"
  echo "== skipped: ${skipped[*]:-none}"
  if [[ -f $OUT/report.txt ]]; then
    echo "== report ($OUT/report.txt, markdown in $OUT/report.md)"
    cat "$OUT/report.txt"
  fi
  ((${#failed[@]} == 0 && ${#skipped[@]} == 0))
  exit $?
}

source deploy/gpu_build_env.sh "$BUILD_DIR"

PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import torch' 2>/dev/null &&
  [[ -x /opt/torch/.venv/bin/python3 ]]; then
  PYTHON=/opt/torch/.venv/bin/python3
fi

bench_flags=()
if [[ ${GPU_CHECK_QUICK:-0} == 1 ]]; then bench_flags+=(--quick); fi
if [[ -n ${BENCH_REPEATS:-} ]]; then
  bench_flags+=("--repeats=$BENCH_REPEATS")
fi

step configure configure.log \
  cmake -S . -B "$BUILD_DIR" "${gpu_cmake_args[@]}" ||
  finish
tests_built=0
bench_built=0
step "build tests" build-tests.log \
  cmake --build "$BUILD_DIR" -j "$JOBS" --target nibble_cuda_test \
    nibble_cuda_backend_test &&
  tests_built=1
step "build bench" build-bench.log \
  cmake --build "$BUILD_DIR" -j "$JOBS" --target nibble-gpu-bench &&
  bench_built=1

if ((tests_built)); then
  step "gpu tests" ctest.log ctest --test-dir "$BUILD_DIR" -L gpu \
    --no-tests=error --output-on-failure --timeout 300 -j 4
  sanitizer=$(command -v compute-sanitizer ||
    echo /usr/local/cuda/bin/compute-sanitizer)
  if [[ -x $sanitizer ]]; then
    step "compute-sanitizer" sanitizer.log timeout "$SANITIZER_TIMEOUT" \
      "$sanitizer" --tool memcheck --error-exitcode 1 \
      "$BUILD_DIR/bin/nibble_cuda_test" \
      "--gtest_filter=${SANITIZER_GTEST_FILTER:-*}"
  else
    skip compute-sanitizer "not on PATH nor in /usr/local/cuda/bin"
  fi
else
  skip "gpu tests" "their build failed"
  skip compute-sanitizer "the tests' build failed"
fi

rm -f "$OUT/nibble_gpu.jsonl" "$OUT/torch.jsonl" "$OUT/report.txt" \
  "$OUT/report.md"
if ((bench_built)); then
  step nibble-gpu-bench bench.log "$BUILD_DIR/bin/nibble-gpu-bench" \
    "${bench_flags[@]}" "--json=$OUT/nibble_gpu.jsonl"
else
  skip nibble-gpu-bench "its build failed"
fi
step "torch baselines" torch.log "$PYTHON" bench/kernels/cuda/torch_baselines.py \
  "${bench_flags[@]}" "--json=$OUT/torch.jsonl"

# The report is printed last by finish, so its step shows no log tail.
if [[ -s $OUT/nibble_gpu.jsonl ]]; then
  echo "== targets"
  "$PYTHON" bench/kernels/cuda/gpu_report.py --markdown "$OUT/nibble_gpu.jsonl" \
    "$OUT/torch.jsonl" >"$OUT/report.md" 2>/dev/null
  if "$PYTHON" bench/kernels/cuda/gpu_report.py "$OUT/nibble_gpu.jsonl" \
    "$OUT/torch.jsonl" >"$OUT/report.txt" 2>&1; then
    passed+=(targets)
  else
    echo "   FAILED: targets missed or without data (the report follows)"
    failed+=(targets)
  fi
else
  skip targets "nibble-gpu-bench wrote no results"
fi
finish
