// What the CUDA GEMM kernels share (gemm_kernel.cuh on mma.sync,
// wgmma_kernel.cuh on Hopper's wgmma): their parameters, the even split of
// the (tile, k step) sequence over thread blocks, the reduction of a tile
// that several blocks share, and the store of C.
//
// Iteration i of a launch is k step i % k_steps of tile i / k_steps; tile t
// covers rows of C from (t % tiles_m) * rows and columns from
// (t / tiles_m) * columns, for the kernel's rows and columns. Block b runs
// iterations [begin, end) of IterationsOf(p, b). Whenever a block covers only
// part of a tile's K steps, it adds its fp32 partial sums into the workspace;
// the last block to finish a tile (a counter per tile) writes C and zeroes
// the workspace behind it.
#ifndef NIBBLE_KERNELS_CUDA_GEMM_COMMON_CUH_
#define NIBBLE_KERNELS_CUDA_GEMM_COMMON_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "format/weight_format.h"

namespace nibble::cuda::internal {

// Rows of K per scale row of the kernels' stages: the layout's scales come
// in groups of 32 rows or more, or of 16 for formats that fix groups of 16.
constexpr int ScaleRowK(WeightFormat format) {
  return FixedGroupSize(format) == 16 ? 16 : 32;
}

enum class OutType { kF16, kBF16, kF32 };

struct Params {
  const uint4* codes;
  const uint32_t* scales;
  const uint16_t* zeros;
  const void* a;
  void* c;
  float* partials;
  int* counters;
  int m, n, k;
  int blocks16_n;  // padded N / 16
  // Scale row j of the weight (rows 32 j .. 32 j + 31 of K, or 16 j ..
  // 16 j + 15 for groups of 16) is in group j >> group_step_shift: 0 for groups
  // of one scale row, 1 for two, 2 for four, 31 for one group (per-channel).
  int group_step_shift;
  int k_steps;
  int tiles_m;
  int iters_base;   // every block runs this many (tile, k step) iterations,
  int iters_extra;  // and the first iters_extra blocks one more
  OutType out;
  // Multiplies C: the weight's global scale, or the power of two that the
  // device layout took out of E8M0 scales; 1 otherwise.
  float output_scale;
};

__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

struct Iterations {
  int begin;
  int end;
};
__device__ __forceinline__ Iterations IterationsOf(const Params& p, int block) {
  const int begin = block * p.iters_base + min(block, p.iters_extra);
  return {begin, begin + p.iters_base + (block < p.iters_extra ? 1 : 0)};
}

// Which block runs iteration `iter` under the even split of Params.
__device__ __forceinline__ int BlockOf(const Params& p, int iter) {
  const int long_iters = p.iters_extra * (p.iters_base + 1);
  return iter < long_iters ? iter / (p.iters_base + 1)
                           : p.iters_extra + (iter - long_iters) / p.iters_base;
}

__device__ __forceinline__ void Store(const Params& p, int row, int col,
                                      float value) {
  if (row >= p.m || col >= p.n) return;
  const int64_t index = static_cast<int64_t>(row) * p.n + col;
  value *= p.output_scale;
  switch (p.out) {
    case OutType::kF16:
      static_cast<half*>(p.c)[index] = __float2half_rn(value);
      break;
    case OutType::kBF16:
      static_cast<__nv_bfloat16*>(p.c)[index] = __float2bfloat16_rn(value);
      break;
    case OutType::kF32:
      static_cast<float*>(p.c)[index] = value;
      break;
  }
}

// An element of C: where a kernel's accumulator goes.
struct Element {
  int row;
  int col;
};

// Finishes tile `tile` of C, of which this block ran iterations [begin,
// end): writes the tile's sum for each accumulator i at element(i) of C. A
// block that ran all the tile's iterations stores its own `acc`; otherwise
// each block adds `acc` into the tile's fp32 partial sums, and the last of
// them stores those. With kSkipRowsPastM, accumulators of rows past M (most
// of a tile of 8 or 16 rows at M = 1) are not added: their partial sums stay
// zero; the wgmma kernel, at its register limit, adds them all. `thread` of
// `threads` places
// each accumulator in the partial sums; those threads call it together,
// `sync` is a barrier over them, `last` a shared int.
template <bool kSkipRowsPastM, int kAcc, typename Sync, typename ElementOf>
__device__ __forceinline__ void FinishTile(const Params& p, int tile,
                                           Iterations iterations,
                                           const float (&acc)[kAcc], int thread,
                                           int threads, Sync sync, int& last,
                                           ElementOf element) {
  const int tile_begin = tile * p.k_steps;
  const int tile_end = tile_begin + p.k_steps;
  if (iterations.begin <= tile_begin && iterations.end >= tile_end) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) {
      const Element e = element(i);
      Store(p, e.row, e.col, acc[i]);
    }
    return;
  }
  // Warp by warp, so that a warp's accesses are 128 contiguous bytes.
  float* partials = p.partials + static_cast<int64_t>(tile) * kAcc * threads;
  auto slot = [&](int i) {
    return partials + ((thread / 32) * kAcc + i) * 32 + thread % 32;
  };
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    if (!kSkipRowsPastM || element(i).row < p.m) atomicAdd(slot(i), acc[i]);
  }
  __threadfence();
  sync();
  if (thread == 0) {
    const int contributors =
        BlockOf(p, tile_end - 1) - BlockOf(p, tile_begin) + 1;
    last = atomicAdd(p.counters + tile, 1) == contributors - 1;
  }
  sync();
  if (!last) return;
  __threadfence();
  // All loads before any store: C could alias the partial sums for all the
  // compiler knows, and a load after each store would wait out L2 each time.
  float sums[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    sums[i] = __ldcg(slot(i));
    *slot(i) = 0.0f;
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const Element e = element(i);
    Store(p, e.row, e.col, sums[i]);
  }
  if (thread == 0) p.counters[tile] = 0;
}

struct WgmmaParams;  // wgmma_kernel.cuh

// A kernel instance and how to launch it: one of the two functions is set.
struct KernelChoice {
  void (*function)(Params) = nullptr;
  void (*wgmma_function)(WgmmaParams) = nullptr;
  int shared_bytes = 0;
  int threads = 0;
  int rows = 0;  // of a tile
  int columns = 0;
};

}  // namespace nibble::cuda::internal

#endif  // NIBBLE_KERNELS_CUDA_GEMM_COMMON_CUH_
