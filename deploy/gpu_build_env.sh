# shellcheck shell=bash
# Sourced by the scripts that build nibble's kernels-only CUDA configuration
# on a GPU machine (deploy/gpu-check.sh, bench/server/gpu_serve_check.sh):
# sets gpu_cmake_args for `cmake -S . -B BUILD_DIR`, takes abseil from
# .gpu-deps/usr where `make gpu-deps` put it, and nvcc from /usr/local/cuda
# when it is not on PATH.
#
#   source deploy/gpu_build_env.sh BUILD_DIR
#   cmake -S . -B BUILD_DIR "${gpu_cmake_args[@]}"

gpu_deps=$PWD/.gpu-deps/usr
gpu_cmake_args=(-DCMAKE_BUILD_TYPE=Release -DNIBBLE_BUILD_SERVICE=OFF
  -DNIBBLE_CUDA=ON)
if [[ -d $gpu_deps ]]; then
  gpu_cmake_args+=("-DCMAKE_PREFIX_PATH=$gpu_deps")
  export LD_LIBRARY_PATH=$gpu_deps/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export PATH=/usr/local/cuda/bin:$PATH
fi
# A configured build keeps its generator; a new one takes ninja where there
# is one (the torch venv has it), else make.
if [[ ! -f $1/CMakeCache.txt ]]; then
  if command -v ninja >/dev/null; then
    gpu_cmake_args+=(-G Ninja)
  elif [[ -x /opt/torch/.venv/bin/ninja ]]; then
    gpu_cmake_args+=(-G Ninja -DCMAKE_MAKE_PROGRAM=/opt/torch/.venv/bin/ninja)
  else
    gpu_cmake_args+=(-G "Unix Makefiles")
  fi
fi
