// The GEMM kernel template of the CUDA backend, shared by the per-format
// translation units (gemm_<format>.cu) that instantiate it, so that nvcc
// compiles the formats in parallel. Only cuda_gemm.cu and those files include
// it. A format with E8M0 scales runs fp4's kernels (KernelFormat): the device
// layout turns its scales into fp16 (device_layout.h), after which it is fp4
// with groups of 32 and a factor on C.
//
// The mma.sync kernel: what runs on GPUs before Hopper, and on Hopper the
// fused variant and below WgmmaMinRows (wgmma_kernel.cuh has the rest
// there). A
// thread block owns a tile of 8 * RT rows and 128 or 256 columns of C and walks
// K in stages of kStepK = 128 rows. Each of its 8 warps owns one or two
// 16-column blocks: per 16-row block of K and column block it dequantizes one
// 32-bit word of codes (see device_layout.h) in registers into the A fragment
// of mma.sync.m16n8k16, so that the weight's columns are the mma's 16 rows and
// A's rows its 8 columns: a tile of 8 rows issues one mma per word, not two on
// 8 rows of zeros. The accumulators are fp32. Up to 16 rows, the scales
// multiply each group's fp32 sums instead of every weight value, a few
// multiply-adds per group instead of one multiply per pair of values. A, scales
// and zero points go through a ring of kStages shared-memory stages filled by
// cp.async.
//   fused:           codes go from global memory straight into a ring of
//                    registers, never through shared memory;
//   double_buffered: codes go through the cp.async stages too;
//   striped:         double_buffered with the (tile, k step) sequence cut
//                    evenly across one wave of blocks (stream-K).
// Tiles shared by several blocks are summed as gemm_common.cuh says. A
// launch that follows a kernel requests the weight of its first stages
// before it waits for that kernel (Params::overlap_previous_kernel).
#ifndef NIBBLE_KERNELS_CUDA_GEMM_KERNEL_CUH_
#define NIBBLE_KERNELS_CUDA_GEMM_KERNEL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/device_layout.h"
#include "kernels/cuda/gemm_common.cuh"

namespace nibble::cuda::internal {

inline constexpr int kThreads = 256;

constexpr int kWarps = kThreads / 32;
// Rows of K per pipeline stage: two 64-row word groups of the layout, so
// that the barrier and the bookkeeping of a stage pay for 8 KB of codes.
constexpr int kStepK = 2 * static_cast<int>(kTileK);
// Per stage and 16-column block of each warp: codes, and scales and zero
// points in kScaleRows rows, one per ScaleRowK rows of K, so that a 16-row
// block kk reads row kk * kScaleRows / 8 whatever the group size.
constexpr int kCodeBytesPerBlock = kThreads * 32;
constexpr int kZeroBytesPerBlock = 4 * kWarps * 8 * 2;

constexpr int ScaleRowsPerStep(WeightFormat format) {
  return kStepK / ScaleRowK(format);
}
template <int kScaleRows>
constexpr int ScaleBytesPerBlock() {
  return kScaleRows * kWarps * 8 * 4;
}

// 16 bytes global -> shared, bypassing L1.
__device__ __forceinline__ void CopyAsync(void* shared, const void* global) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   SharedAddress(shared)),
               "l"(global));
}
__device__ __forceinline__ void CommitAsync() {
  asm volatile("cp.async.commit_group;\n" ::);
}
template <int kPending>
__device__ __forceinline__ void WaitAsync() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending));
}

__device__ __forceinline__ void LoadMatrix(uint32_t (&a)[4],
                                           const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
               : "r"(SharedAddress(shared)));
}
// Two 8x8 matrices, from the addresses of lanes 0-15, into a[0] and a[2].
__device__ __forceinline__ void LoadMatrixPair(uint32_t (&a)[4],
                                               const void* shared) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(a[0]), "=r"(a[2])
               : "r"(SharedAddress(shared)));
}

// Columns of a tile whose warps take `n_blocks` 16-column blocks each.
constexpr int TileColumns(int n_blocks) { return kWarps * 16 * n_blocks; }

// Where a block's accumulators of tile `tile` go in C: acc[rt][nb][r], that
// is accumulator (rt * kNBlocks + nb) * 4 + r, is row 8 rt + 2 (lane % 4)
// (+ 1 for odd r) of the tile and column lane / 4 (+ 8 for r >= 2) of the
// warp's 16-column block nb.
template <int kRowTiles, int kNBlocks>
__device__ __forceinline__ auto ElementsOf(const Params& p, int tile) {
  constexpr int kRows = 8 * kRowTiles;
  constexpr int kColumns = TileColumns(kNBlocks);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  const Element origin = TileOrigin(p, tile, kRows, kColumns);
  const int row0 = origin.row + (lane % 4) * 2;
  const int col0 = origin.col + warp * 16 * kNBlocks + lane / 4;
  return [=](int i) {
    const int rt = i / (kNBlocks * 4);
    const int nb = i / 4 % kNBlocks;
    const int r = i % 4;
    return Element{row0 + rt * 8 + r % 2, col0 + nb * 16 + (r / 2) * 8};
  };
}

// A block's accumulators as the flat array FinishTile takes.
template <int kRowTiles, int kNBlocks>
__device__ __forceinline__ auto& Flat(
    const float (&acc)[kRowTiles][kNBlocks][4]) {
  return *reinterpret_cast<const float(*)[kRowTiles * kNBlocks * 4]>(
      &acc[0][0][0]);
}

// Writes tile `tile` of C from a block's accumulators for its iterations
// (FinishTile). Every thread of the block calls it.
template <int kRowTiles, int kNBlocks>
__device__ __forceinline__ void StoreTile(
    const Params& p, int tile, const float (&acc)[kRowTiles][kNBlocks][4],
    int& last_block) {
  FinishTile<true, StoreCode::kBranchPerType>(
      p, tile, Flat(acc), threadIdx.x, kThreads, [] { __syncthreads(); },
      last_block, ElementsOf<kRowTiles, kNBlocks>(p, tile));
}

template <int kRowTiles, int kNBlocks, int kScaleRows>
constexpr int StageBytes(bool register_codes) {
  return kRowTiles * 8 * kStepK * 2 +
         kNBlocks * ((register_codes ? 0 : kCodeBytesPerBlock) +
                     ScaleBytesPerBlock<kScaleRows>() + kZeroBytesPerBlock);
}

// Enough bytes in flight to cover DRAM latency: three stages of 8 or 16 KB
// of codes ahead of the one being multiplied. On Hopper, double_buffered's
// 8-row tile, which does little but stream the weight, keeps five ahead
// instead (126 KB of stages, more than GPUs of compute capability 8.6 and
// 8.9 give a block: one block per SM): with it the fastest variant takes
// 0.93-0.98x the time for u4b8 at M = 1-8 on three of the four shapes of
// nibble-gpu-bench (fused stays the fastest on 28672 x 8192), fp4
// 0.99-1.03x (H100, 2026-11-27); eight stages measured 1.00-1.04x. fp4's
// fused 8-row tile, whose dequantization takes more instructions, gains
// from more register stages at one block per SM: six took 0.92-0.95x the
// time of four at two blocks per SM, five 0.98-1.00x that of six and seven
// 1.01-1.03x (H100, 2026-11-27); u4b8's loses (1.10-1.28x).
constexpr int kFusedStages = 4;
constexpr int kPipelinedStages = 4;
constexpr int kStreamingStages = 6;
constexpr int kFp4RegisterStages = 5;

// The 8-row tiles, which stream the weight, run two blocks per SM where
// their registers fit the 128 that allows: bounded so, ptxas keeps them
// there (the fused tile's registers drifted past 128 with unrelated epilogue
// changes: one block per SM and 1.3x the time at M = 1). u4's fused tile
// takes more for its zero points (150) and runs one block per SM rather than
// spill, as does a fused tile of six stages, whose ring takes 96.
// double_buffered's six-stage tile keeps the bound of two, the registers it
// was measured with, though its shared memory leaves room for one block.
constexpr int MinBlocksPerSm(WeightFormat format, int row_tiles,
                             bool register_codes, int stages) {
  return row_tiles == 1 && !HasZeros(format) &&
                 !(register_codes && stages > kFusedStages)
             ? 2
             : 1;
}
template <WeightFormat kFormat, typename T, int kRowTiles, int kNBlocks,
          bool kRegisterCodes, int kStages>
__global__ void __launch_bounds__(kThreads,
                                  MinBlocksPerSm(kFormat, kRowTiles,
                                                 kRegisterCodes, kStages))
    GemmKernel(const __grid_constant__ Params p) {
  using P = Pair<T>;
  constexpr int kRows = 8 * kRowTiles;
  // Where the accumulators are few, scales multiply group sums (see above).
  constexpr bool kScaleSums = kRowTiles <= 2;
  constexpr int kABytes = kRows * kStepK * 2;
  constexpr int kScaleRows = ScaleRowsPerStep(kFormat);
  constexpr int kStageBytes =
      StageBytes<kRowTiles, kNBlocks, kScaleRows>(kRegisterCodes);
  constexpr int kCodeBytes = kNBlocks * kCodeBytesPerBlock;
  constexpr int kScaleBytes = kNBlocks * ScaleBytesPerBlock<kScaleRows>();
  // Scale pieces (16 bytes) per row of a stage, and zero-point pieces.
  constexpr int kScalePieces = 16 * kNBlocks;
  constexpr int kZeroPieces = 8 * kNBlocks;
  // Scale pieces go to lanes 8 and up, or from lane 0 where there are more
  // than those lanes can take (8 rows of 32 pieces, for groups of 16).
  constexpr int kFirstScaleLane =
      std::min(8, 32 - kScaleRows * kScalePieces / kWarps);
  static_assert(kFirstScaleLane >= 0, "more scale pieces than threads");
  // 16-row blocks of K per scale row.
  constexpr int kBlocksPerScaleRow = 8 / kScaleRows;
  constexpr bool kZeros = HasZeros(kFormat);
  // 16-byte chunks of A per stage, and how many each thread copies.
  constexpr int kChunksPerRow = kStepK / 8;
  constexpr int kAChunks = kRows * kChunksPerRow;
  constexpr int kAChunksPerThread = (kAChunks + kThreads - 1) / kThreads;
  extern __shared__ __align__(128) unsigned char shared[];
  __shared__ int last_block;

  LetNextKernelStart();
  const int tid = threadIdx.x;
  const int warp = tid / 32;
  const int lane = tid % 32;
  const int block = static_cast<int>(blockIdx.x);
  const Iterations iterations = IterationsOf(p, block);
  const int begin = iterations.begin;
  const int end = iterations.end;
  const int64_t group_stride = static_cast<int64_t>(p.blocks16_n) * 8;
  // Scale row j + 1 of a stage starts a group when (j + 1) & this is 0.
  const unsigned group_rows_mask = (1u << p.group_step_shift) - 1u;

  // The copies each thread makes per stage, spread so that every warp has
  // the same share and none waits longer at the barrier: chunk c of A goes
  // to lane c / 8 of warp c % 8; the rows of scale pieces to lanes
  // kFirstScaleLane and up, those of zero-point pieces to lanes 24 and up.
  int a_offset[kAChunksPerThread];  // byte offset in a stage, -1: none
  int a_row[kAChunksPerThread];
#pragma unroll
  for (int i = 0; i < kAChunksPerThread; ++i) {
    const int chunk = i * kThreads + lane * 8 + warp;
    const int row = chunk / kChunksPerRow;
    const int column = chunk % kChunksPerRow;
    a_row[i] = chunk < kAChunks ? row : kRows;
    a_offset[i] = row * kStepK * 2 + ((column ^ (row & 7)) * 16);
  }
  const int scale_piece = max(lane - kFirstScaleLane, 0) * 8 + warp;
  const bool copies_scales =
      lane >= kFirstScaleLane && scale_piece < kScaleRows * kScalePieces;
  const int zero_piece = max(lane - 24, 0) * 8 + warp;
  const bool copies_zeros =
      kZeros && lane >= 24 && zero_piece < 4 * kZeroPieces;
  // The codes in lanes' 16-byte pieces (device_layout.h): a 16-column block
  // has 32 per 64 rows of K, after the other blocks of its span, and a span
  // has a stage's two 64-row steps one after the other.
  constexpr int kBlockPieces = 32;
  constexpr int kSpanPieces = kSpanBlocks * kBlockPieces;
  const int64_t span_stride = static_cast<int64_t>(p.k_steps) * 2 * kSpanPieces;

  [[maybe_unused]] uint4 code_ring[kRegisterCodes ? kStages : 1][kNBlocks][2];

  auto stage_a = [&](int s) { return shared + s * kStageBytes; };
  auto stage_codes = [&](int s) {
    return reinterpret_cast<uint4*>(shared + s * kStageBytes + kABytes);
  };  // [block][half][thread]
  auto stage_scales = [&](int s) {
    return reinterpret_cast<uint32_t*>(shared + s * kStageBytes + kABytes +
                                       (kRegisterCodes ? 0 : kCodeBytes));
  };
  auto stage_zeros = [&](int s) {
    return reinterpret_cast<uint16_t*>(
        reinterpret_cast<unsigned char*>(stage_scales(s)) + kScaleBytes);
  };

  // The next iteration to load: its tile and step, and source pointers that
  // advance by one step at a time; recomputed only when the loads enter a
  // new tile.
  struct LoadCursor {
    int tile;
    int step;
    int rows;  // rows of A that exist in the tile
    const uint4* codes;
    const T* a;
    const uint32_t* scales;
    const uint16_t* zeros;
  };
  const int first_tile = begin / p.k_steps;
  LoadCursor load{.tile = first_tile,
                  .step = begin - first_tile * p.k_steps,
                  .rows = 0,
                  .codes = nullptr,
                  .a = nullptr,
                  .scales = nullptr,
                  .zeros = nullptr};
  auto enter_tile = [&] {
    const int m_tile = load.tile % p.tiles_m;
    const int n_tile = load.tile / p.tiles_m;
    load.rows = min(kRows, p.m - m_tile * kRows);
    const int first_block = (n_tile * kWarps + warp) * kNBlocks;
    load.codes = p.codes + first_block / kSpanBlocks * span_stride +
                 load.step * 2 * kSpanPieces +
                 first_block % kSpanBlocks * kBlockPieces + lane;
    load.a = static_cast<const T*>(p.a) +
             static_cast<int64_t>(m_tile * kRows) * p.k + load.step * kStepK;
    load.scales = p.scales + n_tile * kWarps * kNBlocks * 8 +
                  (scale_piece % kScalePieces) * 4;
    if constexpr (kZeros) {
      load.zeros = p.zeros + n_tile * kWarps * kNBlocks * 8 +
                   (zero_piece % kZeroPieces) * 8;
    }
  };
  enter_tile();

  // Start the loads of the next iteration into stage `s`: its A, and its
  // codes, scales and zero points.
  auto issue_a = [&](int s) {
    unsigned char* a_stage = stage_a(s);
#pragma unroll
    for (int i = 0; i < kAChunksPerThread; ++i) {
      // Rows past M are left as they are: they only feed rows of C that are
      // never stored.
      if (a_row[i] < load.rows) {
        const int chunk = i * kThreads + lane * 8 + warp;
        CopyAsync(a_stage + a_offset[i],
                  load.a + static_cast<int64_t>(a_row[i]) * p.k +
                      (chunk % kChunksPerRow) * 8);
      }
    }
  };
  auto issue_weight = [&](int s) {
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const uint4* source =
            load.codes + nb * kBlockPieces + half * kSpanPieces;
        if constexpr (kRegisterCodes) {
          code_ring[s][nb][half] = __ldcs(source);
        } else {
          CopyAsync(stage_codes(s) + (nb * 2 + half) * kThreads + tid, source);
        }
      }
    }
    // Row j of the stage's scales is the group of its scale row j.
    if (copies_scales) {
      const int row = scale_piece / kScalePieces;
      CopyAsync(
          stage_scales(s) + scale_piece * 4,
          load.scales + ((load.step * kScaleRows + row) >> p.group_step_shift) *
                            group_stride);
    }
    if constexpr (kZeros) {
      if (copies_zeros) {
        const int row = zero_piece / kZeroPieces;
        CopyAsync(
            stage_zeros(s) + zero_piece * 8,
            load.zeros + (((load.step << 2) + row) >> p.group_step_shift) *
                             group_stride);
      }
    }
  };
  auto advance = [&] {
    if (++load.step == p.k_steps) {
      load.step = 0;
      ++load.tile;
      enter_tile();
    } else {
      load.codes += 2 * kSpanPieces;
      load.a += kStepK;
    }
  };

  float acc[kRowTiles][kNBlocks][4];
  // With kScaleSums, the sums of the current group, before its scales.
  [[maybe_unused]] float group_acc[kRowTiles][kNBlocks][4];
  auto clear = [](float(&sums)[kRowTiles][kNBlocks][4]) {
#pragma unroll
    for (int rt = 0; rt < kRowTiles; ++rt)
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb)
#pragma unroll
        for (int r = 0; r < 4; ++r) sums[rt][nb][r] = 0.0f;
  };
  auto& sums = kScaleSums ? group_acc : acc;

  auto compute = [&](int s) {
    uint32_t word[kNBlocks][8];
#pragma unroll
    for (int nb = 0; nb < kNBlocks; ++nb) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        uint4 words;
        if constexpr (kRegisterCodes) {
          words = code_ring[s][nb][half];
        } else {
          words = stage_codes(s)[(nb * 2 + half) * kThreads + tid];
        }
        word[nb][half * 4 + 0] = words.x;
        word[nb][half * 4 + 1] = words.y;
        word[nb][half * 4 + 2] = words.z;
        word[nb][half * 4 + 3] = words.w;
      }
    }
    const unsigned char* a_stage = stage_a(s);
#pragma unroll
    for (int j = 0; j < kScaleRows; ++j) {
      // The scales and zero points of columns g and g + 8 of each block, for
      // scale row j.
      auto pair_of = [&](int nb) {
        return ((j * kWarps + warp) * kNBlocks + nb) * 8 + lane / 4;
      };
      [[maybe_unused]] uint32_t scale[kNBlocks][2];
      uint32_t zero[kNBlocks][2];
#pragma unroll
      for (int nb = 0; nb < kNBlocks; ++nb) {
        uint32_t zeros = 0x0808u;
        if constexpr (kZeros) zeros = stage_zeros(s)[pair_of(nb)];
        const uint32_t scales =
            kScaleSums ? 0 : P::FromHalfPair(stage_scales(s)[pair_of(nb)]);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          if constexpr (!kScaleSums) scale[nb][half] = Broadcast(scales, half);
          const uint32_t z = (zeros >> (8 * half)) & 0xffu;
          zero[nb][half] = z | (z << 16);
        }
      }
#pragma unroll
      for (int kk = j * kBlocksPerScaleRow; kk < (j + 1) * kBlocksPerScaleRow;
           ++kk) {
        // The weight's 16 x 16 block as the mma's A: its n8 B fragment
        // registers {b0, b1} of columns g and {b2, b3} of g + 8 are
        // rows g and g + 8 of A, in the order {a0, a1, a2, a3} = {b0, b2,
        // b1, b3}.
        uint32_t w[kNBlocks][4];
#pragma unroll
        for (int nb = 0; nb < kNBlocks; ++nb) {
          uint32_t b[4];
          if constexpr (kScaleSums) {
            DequantizeCodes<kFormat, T>(word[nb][kk], zero[nb], b);
          } else {
            Dequantize<kFormat, T>(word[nb][kk], scale[nb], zero[nb], b);
          }
          w[nb][0] = b[0];
          w[nb][1] = b[2];
          w[nb][2] = b[1];
          w[nb][3] = b[3];
        }
        // Rows of A as the mma's B: x[0] and x[2] hold rows 16 mt .. + 7,
        // x[1] and x[3] the next 8 (for two row tiles or more).
#pragma unroll
        for (int mt = 0; mt < (kRowTiles + 1) / 2; ++mt) {
          uint32_t x[4];
          if constexpr (kRowTiles == 1) {
            const int row = lane % 8;
            const int column = kk * 2 + lane / 8 % 2;
            LoadMatrixPair(
                x, a_stage + row * kStepK * 2 + ((column ^ (row & 7)) * 16));
          } else {
            const int row = mt * 16 + lane % 16;
            const int column = kk * 2 + lane / 16;
            LoadMatrix(
                x, a_stage + row * kStepK * 2 + ((column ^ (row & 7)) * 16));
          }
#pragma unroll
          for (int nb = 0; nb < kNBlocks; ++nb) {
            P::Mma(sums[2 * mt][nb], w[nb], x[0], x[2]);
            if constexpr (kRowTiles > 1) {
              P::Mma(sums[2 * mt + 1][nb], w[nb], x[1], x[3]);
            }
          }
        }
      }
      if constexpr (kScaleSums) {
        // The group ends here, or its rest is in the next stage.
        if (((j + 1) & group_rows_mask) == 0 || j == kScaleRows - 1) {
#pragma unroll
          for (int nb = 0; nb < kNBlocks; ++nb) {
            float2 column_scale = __half22float2(
                *reinterpret_cast<const half2*>(&stage_scales(s)[pair_of(nb)]));
#pragma unroll
            for (int rt = 0; rt < kRowTiles; ++rt) {
#pragma unroll
              for (int r = 0; r < 4; ++r) {
                acc[rt][nb][r] += (r < 2 ? column_scale.x : column_scale.y) *
                                  group_acc[rt][nb][r];
              }
            }
          }
          clear(group_acc);
        }
      }
    }
  };

  auto finish_tile = [&](int tile) {
    StoreTile<kRowTiles, kNBlocks>(p, tile, acc, last_block);
  };
  // A block of a cluster has one tile, finished after the loop, apart from
  // it, so that the loop keeps the registers it has without clusters.
  const bool in_cluster = p.cluster_split > 1;

  // After a kernel, the weight of the first stages streams in while that
  // kernel may still run, A only after it has finished. Stage 0's group of
  // copies then holds all that weight; without a kernel before, each
  // stage's weight goes with its A, so that the first stage waits only for
  // its own.
  const bool weight_first = p.overlap_previous_kernel != 0;
  if (weight_first) {
    const LoadCursor first_load = load;
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (begin + s < end) {
        issue_weight(s);
        advance();
      }
    }
    load = first_load;
  }
  WaitForPreviousKernel();
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (begin + s < end) {
      issue_a(s);
      if (!weight_first) issue_weight(s);
      advance();
    }
    CommitAsync();
  }
  clear(acc);
  if constexpr (kScaleSums) clear(group_acc);
  int tile = first_tile;
  int step = begin - first_tile * p.k_steps;
  int iter = begin;
  // One iteration on stage `s`; the tile's end is rare, so its code sits
  // behind a branch the loop does not take.
  auto run_iteration = [&](int s) {
    WaitAsync<kStages - 2>();
    __syncthreads();
    if (iter + kStages - 1 < end) {
      const int next = (s + kStages - 1) % kStages;
      issue_a(next);
      issue_weight(next);
      advance();
    }
    CommitAsync();
    compute(s);
    ++iter;
    if ((++step == p.k_steps || iter == end) && !in_cluster) {
      finish_tile(tile);
      clear(acc);
      step = 0;
      ++tile;
    }
  };
  if constexpr (kRegisterCodes) {
    // The register ring needs every stage index known at compile time.
    while (iter < end) {
#pragma unroll
      for (int s = 0; s < kStages; ++s) {
        if (iter < end) run_iteration(s);
      }
    }
  } else {
#pragma unroll 1
    for (int s = 0; iter < end; s = s + 1 == kStages ? 0 : s + 1) {
      run_iteration(s);
    }
  }
  if (in_cluster) {
    static_assert(sizeof(acc) * kThreads <= kStages * kStageBytes,
                  "the stages hold the cluster's partial sums");
    constexpr int kColumns = TileColumns(kNBlocks);
    FinishTileInCluster<kColumns>(
        p, Flat(acc), tid, kThreads, [] { __syncthreads(); },
        reinterpret_cast<float*>(shared),
        TileOrigin(p, first_tile, kRows, kColumns),
        ElementsOf<kRowTiles, kNBlocks>(p, first_tile));
  }
}

// Up to 32 rows, where the weight read dominates, each warp takes two
// 16-column blocks, so that the per-stage work is spread over twice the
// bytes; above, one, to keep the accumulators in registers.
template <int kRowTiles>
constexpr int NBlocksFor() {
  return kRowTiles <= 4 ? 2 : 1;
}

template <WeightFormat kFormat, typename T, int kRowTiles, bool kRegisterCodes,
          int kStages>
KernelChoice ChooseStagedKernel() {
  constexpr int kNBlocks = NBlocksFor<kRowTiles>();
  constexpr int kScaleRows = ScaleRowsPerStep(kFormat);
  return {
      .function =
          GemmKernel<kFormat, T, kRowTiles, kNBlocks, kRegisterCodes, kStages>,
      .shared_bytes =
          kStages * StageBytes<kRowTiles, kNBlocks, kScaleRows>(kRegisterCodes),
      .threads = kThreads,
      .rows = 8 * kRowTiles,
      .columns = TileColumns(kNBlocks)};
}

template <WeightFormat kFormat, typename T, int kRowTiles>
KernelChoice ChooseStaged(bool register_codes, bool hopper) {
  if (register_codes) {
    if constexpr (kRowTiles == 1 && kFormat == WeightFormat::kFp4) {
      if (hopper)
        return ChooseStagedKernel<kFormat, T, 1, true, kFp4RegisterStages>();
    }
    return ChooseStagedKernel<kFormat, T, kRowTiles, true, kFusedStages>();
  }
  if constexpr (kRowTiles == 1) {
    if (hopper)
      return ChooseStagedKernel<kFormat, T, 1, false, kStreamingStages>();
  }
  return ChooseStagedKernel<kFormat, T, kRowTiles, false, kPipelinedStages>();
}

// `row_tiles` 8-row tiles: 1, 2, 4, 8 or 16.
template <WeightFormat kFormat, typename T>
KernelChoice ChooseTiles(int row_tiles, bool register_codes, bool hopper) {
  switch (row_tiles) {
    case 1:
      return ChooseStaged<kFormat, T, 1>(register_codes, hopper);
    case 2:
      return ChooseStaged<kFormat, T, 2>(register_codes, hopper);
    case 4:
      return ChooseStaged<kFormat, T, 4>(register_codes, hopper);
    case 8:
      return ChooseStaged<kFormat, T, 8>(register_codes, hopper);
    default:
      return ChooseStaged<kFormat, T, 16>(register_codes, hopper);
  }
}

// The kernel for one format; instantiated in that format's .cu file.
// `hopper`: the GPU runs the sm_90a code (compute capability 9.0).
template <WeightFormat kFormat>
KernelChoice ChooseFormatKernel(DType a_dtype, int row_tiles,
                                bool register_codes, bool hopper) {
  return a_dtype == DType::kBF16
             ? ChooseTiles<kFormat, __nv_bfloat16>(row_tiles, register_codes,
                                                   hopper)
             : ChooseTiles<kFormat, half>(row_tiles, register_codes, hopper);
}

extern template KernelChoice ChooseFormatKernel<WeightFormat::kFp4>(DType, int,
                                                                    bool, bool);
extern template KernelChoice ChooseFormatKernel<WeightFormat::kU4b8>(DType, int,
                                                                     bool,
                                                                     bool);
extern template KernelChoice ChooseFormatKernel<WeightFormat::kU4>(DType, int,
                                                                   bool, bool);
extern template KernelChoice ChooseFormatKernel<WeightFormat::kNvfp4>(DType,
                                                                      int, bool,
                                                                      bool);

}  // namespace nibble::cuda::internal

#endif  // NIBBLE_KERNELS_CUDA_GEMM_KERNEL_CUH_
