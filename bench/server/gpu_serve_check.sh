#!/usr/bin/env bash
# `make gpu-serve-bench`, on the GPU machine, in one go: unpacks the portable
# bundle when only its .tar.xz is there, builds the kernels with CUDA and
# without gRPC (as deploy/gpu-check.sh does, abseil from .gpu-deps/usr when
# present), runs the gpu-labelled tests of the CUDA backend's request path
# (nibble_cuda_backend_test), then bench/server/gpu_serve_bench.sh with the
# bundle's nibbled, nibble and nibble-load and the nibble-gpu-bench just
# built. Ends with the report, and status 1 when a step failed. The step
# "soak", not among the default ones (`make gpu-soak`), runs
# tests/soak/soak.sh on the bundle with --backend=cuda, its GPU memory
# bounded as its RSS is, for GPU_SOAK_SECONDS (120), results in
# BUILD_DIR/gpu-soak.
#
#   bench/server/gpu_serve_check.sh [PORTABLE_DIR] [BUILD_DIR]
#     (build/portable, build-gpu)
#   Environment: GPU_SERVE_STEPS (default "build test bench"; a later call
#   on the same machine may run "bench" alone), JOBS (default nproc), and
#   gpu_serve_bench.sh's GPU_SERVE_* knobs.
set -uo pipefail

cd "$(dirname "$0")/../.." || exit 1
portable=${1:-build/portable}
build=${2:-build-gpu}
steps=${GPU_SERVE_STEPS:-build test bench}
jobs=${JOBS:-$(nproc)}
failed=()

run_step() {
  local name=$1
  shift
  local start=$SECONDS
  echo "== $name"
  if "$@"; then
    echo "   ok in $((SECONDS - start)) s"
  else
    echo "   FAILED with status $? in $((SECONDS - start)) s"
    failed+=("$name")
  fi
}

source deploy/gpu_build_env.sh "$build"

build_gpu() {
  mkdir -p "$build" || return 1
  cmake -S . -B "$build" "${gpu_cmake_args[@]}" >"$build/configure.log" 2>&1 ||
    { tail -n 30 "$build/configure.log"; return 1; }
  cmake --build "$build" -j "$jobs" --target nibble_cuda_backend_test \
    nibble-gpu-bench >"$build/build.log" 2>&1 ||
    { tail -n 30 "$build/build.log"; return 1; }
}

test_gpu() {
  ctest --test-dir "$build" -L gpu -R CudaBackendTest --no-tests=error \
    --output-on-failure --timeout 300
}

# The portable bundle's binaries, unpacked from its .tar.xz when only that
# is there.
unpack_portable() {
  if [[ ! -x $portable/bin/nibbled && -f $portable.tar.xz ]]; then
    mkdir -p "$(dirname "$portable")" &&
      tar -C "$(dirname "$portable")" -xJf "$portable.tar.xz" || return 1
  fi
  [[ -x $portable/bin/nibbled ]] || {
    echo "no $portable/bin/nibbled nor $portable.tar.xz: run" \
      "\`make portable-bundle\` on a machine with gRPC and nvcc"
    return 1
  }
}

bench_gpu() {
  unpack_portable || return 1
  NIBBLE_GPU_BENCH=$build/bin/nibble-gpu-bench \
    bench/server/gpu_serve_bench.sh "$portable/bin" "$build/gpu-serve-bench"
}

soak_gpu() {
  unpack_portable || return 1
  SOAK_BACKEND=cuda SOAK_OUT=$build/gpu-soak \
    tests/soak/soak.sh "$portable/bin" "${GPU_SOAK_SECONDS:-120}"
}

for step in $steps; do
  case $step in
    build) run_step "build $build" build_gpu ;;
    test) run_step "gpu tests (CudaBackendTest)" test_gpu ;;
    bench) run_step gpu-serve-bench bench_gpu ;;
    soak) run_step "soak with --backend=cuda" soak_gpu ;;
    *) echo "unknown step $step (build, test, bench, soak)"; failed+=("$step") ;;
  esac
done
echo "== failed: ${failed[*]:-none}"
((${#failed[@]} == 0))
