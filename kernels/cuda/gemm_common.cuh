// What the CUDA GEMM kernels share (gemm_kernel.cuh on mma.sync,
// wgmma_kernel.cuh on Hopper's wgmma): their parameters, the even split of
// the (tile, k step) sequence over thread blocks, the reduction of a tile
// that several blocks share, and the store of C.
//
// Iteration i of a launch is k step i % k_steps of tile i / k_steps; tile t
// covers rows of C from (t % tiles_m) * rows and columns from
// (t / tiles_m) * columns, for the kernel's rows and columns. Block b runs
// iterations [begin, end) of IterationsOf(p, b): the first
// Params::whole_tile_blocks blocks one whole tile each, the others an even
// share of the rest. Whenever a block covers only part of a tile's K steps,
// the blocks of the tile sum their fp32 partial sums in one of two ways:
//   in a cluster (Params::cluster_split > 1: on Hopper, where every tile's
//     cluster runs at once, at most kMaxClusterSplit blocks per tile): the
//     tile's blocks are one thread block cluster, one K slice each; after
//     its loop each leaves its sums in its shared memory and, after a
//     cluster barrier, adds a share of the tile's elements from all of them
//     (distributed shared memory) in a fixed order and stores it
//     (FinishTileInCluster): no round trips through L2, the same sums every
//     run;
//   through global memory otherwise (stream-K ranges that cross tiles,
//     more tiles than run at once, older GPUs): each adds its sums into the
//     workspace with atomics, which need not wait for a reply, and the last
//     block to finish a tile (a count per tile of the K steps added) writes C
//     and zeroes the workspace behind it (FinishTile).
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

// The format whose kernels run `format`: a format with E8M0 scales runs
// fp4's, once the device layout has made its scales fp16 (device_layout.h).
constexpr WeightFormat KernelFormat(WeightFormat format) {
  return format == WeightFormat::kMxfp4 ? WeightFormat::kFp4 : format;
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
  // Blocks 0 .. whole_tile_blocks - 1 run tile b each: the tiles of the full
  // waves of a launch whose last wave the other blocks fill by sharing its
  // tiles (0: every block shares the even split).
  int whole_tile_blocks;
  int iters_base;   // every other block runs this many (tile, k step)
  int iters_extra;  // iterations of the rest, the first iters_extra one more
  OutType out;
  // Multiplies C: the weight's global scale, or the power of two that the
  // device layout took out of E8M0 scales; 1 otherwise.
  float output_scale;
  // Blocks per tile, launched as one cluster of this many blocks with one K
  // slice each; 0 where tiles are shared through the workspace.
  int cluster_split;
  // The launch may start before the previous kernel in its stream ends
  // (DeviceGemm::overlap_previous_kernel): the kernel then requests the
  // weight of its first stages before it waits for that kernel, A after.
  // 0: each stage's A and weight together, as without a kernel before.
  int overlap_previous_kernel;
};

// The most blocks of a cluster that share a tile. Larger clusters measured
// slower on an H200 (28672 x 8192 at M = 1: eight blocks per tile lost 5 %
// against the workspace), and each block's sums are read once per block of
// its cluster.
inline constexpr int kMaxClusterSplit = 4;

// Programmatic dependent launch (compute capability 9.0 and up; no-ops
// below): LaunchGemm may let a kernel start while the kernel before it in
// the stream still runs (Params::overlap_previous_kernel), so that its
// weight stream starts before the other's last blocks end. Each kernel lets
// the next one start at once, and reads only the weight, which no kernel
// writes, before WaitForPreviousKernel; A, the workspace and C after it,
// which returns once the previous kernel has finished and its writes are
// visible.
__device__ __forceinline__ void LetNextKernelStart() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void WaitForPreviousKernel() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ uint32_t SharedAddress(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

struct Iterations {
  int begin;
  int end;
};
__device__ __forceinline__ Iterations IterationsOf(const Params& p, int block) {
  if (block < p.whole_tile_blocks) {
    const int begin = block * p.k_steps;
    return {begin, begin + p.k_steps};
  }
  const int shared = block - p.whole_tile_blocks;
  const int begin = p.whole_tile_blocks * p.k_steps + shared * p.iters_base +
                    min(shared, p.iters_extra);
  return {begin, begin + p.iters_base + (shared < p.iters_extra ? 1 : 0)};
}

// How an epilogue stores C in its three types: a branch per type, or one
// predicated store for all three. The wgmma kernel's epilogue, unrolled over
// up to 128 sums a thread, takes the one store: a copy of it per type slowed
// the main loop it follows (up to 1.14x the time at M = 256 on an H200), as
// does the cluster finish, which stores four sums per pass. FinishTile in the
// mma.sync kernels, with at most 64 sums a thread, keeps the branches, the
// form their register counts were measured with.
enum class StoreCode { kBranchPerType, kPredicated };

template <StoreCode kStoreCode>
__device__ __forceinline__ void Store(const Params& p, int row, int col,
                                      float value) {
  if (row >= p.m || col >= p.n) return;
  const int64_t index = static_cast<int64_t>(row) * p.n + col;
  value *= p.output_scale;
  if constexpr (kStoreCode == StoreCode::kPredicated) {
    const bool wide = p.out == OutType::kF32;
    const uint16_t narrow =
        p.out == OutType::kF16
            ? __half_as_ushort(__float2half_rn(value))
            : __bfloat16_as_ushort(__float2bfloat16_rn(value));
    char* to = static_cast<char*>(p.c) + (index << (wide ? 2 : 1));
    asm volatile(
        "{\n.reg .pred wide;\n"
        "setp.ne.u32 wide, %3, 0;\n"
        "@wide st.global.b32 [%0], %1;\n"
        "@!wide st.global.b16 [%0], %2;\n}\n" ::"l"(to),
        "r"(__float_as_uint(value)), "h"(narrow),
        "r"(static_cast<uint32_t>(wide)));
  } else {
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
}

// Adds four sums into 16-byte aligned global memory, by one vector atomic
// where the GPU has them (sm_90).
__device__ __forceinline__ void AtomicAdd4(float4* to, float x, float y,
                                           float z, float w) {
#if __CUDA_ARCH__ >= 900
  atomicAdd(to, make_float4(x, y, z, w));
#else
  atomicAdd(&to->x, x);
  atomicAdd(&to->y, y);
  atomicAdd(&to->z, z);
  atomicAdd(&to->w, w);
#endif
}

// An element of C: where a kernel's accumulator goes.
struct Element {
  int row;
  int col;
};

// Finishes tile `tile` of C, of which this block ran part or all of its
// iterations (IterationsOf, taken here again rather than kept by the
// kernels' loops, which are short of registers): writes the tile's sum for each
// accumulator i at element(i) of C. A block that ran all the tile's iterations
// stores its own `acc`; otherwise each block adds `acc` into the tile's fp32
// partial sums, and the last of them stores those. With kSkipRowsPastM, fours
// of accumulators whose rows are all past M (most of a tile of 8 or 16 rows at
// M = 1) are not added: their partial sums stay zero; the wgmma kernel, at its
// register limit, adds them all. kStoreCode is how it stores C. `thread` of
// `threads` places each accumulator in the partial sums; those threads call it
// together, `sync` is a barrier over them, `last` a shared int.
template <bool kSkipRowsPastM, StoreCode kStoreCode, int kAcc, typename Sync,
          typename ElementOf>
__device__ __forceinline__ void FinishTile(const Params& p, int tile,
                                           const float (&acc)[kAcc], int thread,
                                           int threads, Sync sync, int& last,
                                           ElementOf element) {
  const Iterations iterations = IterationsOf(p, static_cast<int>(blockIdx.x));
  const int tile_begin = tile * p.k_steps;
  const int tile_end = tile_begin + p.k_steps;
  // The tile's sums: `acc` where this block ran all of the tile's
  // iterations, else every block's partial sums, which the last block to add
  // its own reads; one store loop for both keeps the kernels' code short.
  float sums[kAcc];
  if (iterations.begin <= tile_begin && iterations.end >= tile_end) {
#pragma unroll
    for (int i = 0; i < kAcc; ++i) sums[i] = acc[i];
  } else {
    // Four sums of a thread at a time, warp by warp: a warp's accesses are
    // 512 contiguous bytes, and one vector atomic adds four sums.
    static_assert(kAcc % 4 == 0, "the partial sums go four at a time");
    float* partials = p.partials + static_cast<int64_t>(tile) * kAcc * threads;
    auto slot = [&](int i) {  // sums i .. i + 3
      return reinterpret_cast<float4*>(partials +
                                       ((thread / 32) * kAcc + i) * 32) +
             thread % 32;
    };
    auto any_row_below_m = [&](int i) {
      bool any = false;
#pragma unroll
      for (int j = 0; j < 4; ++j) any = any || element(i + j).row < p.m;
      return any;
    };
#pragma unroll
    for (int i = 0; i < kAcc; i += 4) {
      if (!kSkipRowsPastM || any_row_below_m(i)) {
        AtomicAdd4(slot(i), acc[i], acc[i + 1], acc[i + 2], acc[i + 3]);
      }
    }
    // One thread counts the block's steps with release and acquire order,
    // which the barriers carry to the others: the block's adds come before
    // its count, and the other blocks' adds before the last one's reads.
    // (A fence in every thread cost 2-4 % at M = 1 on an H100.)
    sync();
    if (thread == 0) {
      const int steps =
          min(iterations.end, tile_end) - max(iterations.begin, tile_begin);
      int before;
      asm volatile("atom.add.acq_rel.gpu.s32 %0, [%1], %2;\n"
                   : "=r"(before)
                   : "l"(p.counters + tile), "r"(steps)
                   : "memory");
      last = before + steps == p.k_steps;
    }
    sync();
    if (!last) {
      return;
    }
    // All loads before any store: C could alias the partial sums for all
    // the compiler knows, and a load after each store would wait out L2
    // each time.
#pragma unroll
    for (int i = 0; i < kAcc; i += 4) {
      const float4 sum = __ldcg(slot(i));
      *slot(i) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      sums[i] = sum.x;
      sums[i + 1] = sum.y;
      sums[i + 2] = sum.z;
      sums[i + 3] = sum.w;
    }
    if (thread == 0) p.counters[tile] = 0;
  }
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const Element e = element(i);
    Store<kStoreCode>(p, e.row, e.col, sums[i]);
  }
}

// Thread block clusters (sm_90): the barrier over every thread of the
// cluster, with release/acquire order for shared memory, this block's rank,
// and four floats of block `rank`'s shared memory at this block's `local`
// address.
__device__ __forceinline__ void SyncCluster() {
#if __CUDA_ARCH__ >= 900
  asm volatile(
      "barrier.cluster.arrive.release.aligned;\n"
      "barrier.cluster.wait.acquire.aligned;\n" ::
          : "memory");
#endif
}
__device__ __forceinline__ int ClusterRank() {
  uint32_t rank = 0;
#if __CUDA_ARCH__ >= 900
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
#endif
  return static_cast<int>(rank);
}
__device__ __forceinline__ float4 LoadFromClusterBlock(const float4* local,
                                                       int rank) {
  float4 value = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#if __CUDA_ARCH__ >= 900
  uint32_t remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n"
               : "=r"(remote)
               : "r"(SharedAddress(local)), "r"(rank));
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(value.x), "=f"(value.y), "=f"(value.z), "=f"(value.w)
               : "r"(remote));
#endif
  return value;
}

// The first element of C in tile `tile` of `rows` x `columns`.
__device__ __forceinline__ Element TileOrigin(const Params& p, int tile,
                                              int rows, int columns) {
  return {tile % p.tiles_m * rows, tile / p.tiles_m * columns};
}

// Finishes the tile of a block launched in a cluster of Params::cluster_split
// blocks, one K slice of the tile each (see above), after the block's loop:
// FinishTile's arguments, with the tile's first element `origin`, kColumns
// its width, and `cluster_sums` kAcc * threads floats of shared memory that
// the block no longer reads. Every thread of the block calls it. Each block
// lays its sums out as the tile's rows; block r then adds and stores fours of
// columns r, r + split, ... of the rows below M from every block in a fixed
// order, one load of 16 bytes from each per four (a load per sum, one sum at
// a time, took 2-2.5 us at M = 1 on an H100).
template <int kColumns, int kAcc, typename Sync, typename ElementOf>
__device__ __forceinline__ void FinishTileInCluster(
    const Params& p, const float (&acc)[kAcc], int thread, int threads,
    Sync sync, float* cluster_sums, Element origin, ElementOf element) {
  sync();  // the last stage is read: its memory takes the sums
#pragma unroll
  for (int i = 0; i < kAcc; ++i) {
    const Element e = element(i);
    cluster_sums[(e.row - origin.row) * kColumns + e.col - origin.col] = acc[i];
  }
  SyncCluster();
  const int rows = min(p.m - origin.row, kAcc * threads / kColumns);
  constexpr int kFours = kColumns / 4;
  const float4* fours = reinterpret_cast<const float4*>(cluster_sums);
#pragma unroll 1
  for (int f = ClusterRank() * threads + thread; f < rows * kFours;
       f += p.cluster_split * threads) {
    float4 parts[kMaxClusterSplit];
#pragma unroll
    for (int r = 0; r < kMaxClusterSplit; ++r) {
      parts[r] = r < p.cluster_split ? LoadFromClusterBlock(&fours[f], r)
                                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int r = 0; r < kMaxClusterSplit; ++r) {
      sum[0] += parts[r].x;
      sum[1] += parts[r].y;
      sum[2] += parts[r].z;
      sum[3] += parts[r].w;
    }
    const int row = origin.row + f / kFours;
    const int col = origin.col + f % kFours * 4;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      Store<StoreCode::kPredicated>(p, row, col + j, sum[j]);
    }
  }
  SyncCluster();  // no block leaves while others read its sums
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
