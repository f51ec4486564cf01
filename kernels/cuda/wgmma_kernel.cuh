// The Hopper GEMM kernel (sm_90a): the double_buffered and striped variants
// from WgmmaMinRows rows of A up. Included, like gemm_kernel.cuh, by
// cuda_gemm.cu and the per-format gemm_<format>.cu files that instantiate it.
//
// It computes Cᵀ = dequant(B)ᵀ · Aᵀ so that the dequantized weight is the
// A operand of wgmma, which only that operand may take from registers: a
// warp's word of codes per 16 x 16 block (device_layout.h) dequantizes
// straight into the m64nNk16 A fragment of its 16 rows. A is wgmma's B
// operand, K-major in shared memory as the tensor copy engine writes it.
//
// A thread block has a producer warpgroup and two or four consumers:
//   producer (ProduceStages): one thread fills a ring of shared-memory
//     stages, 64 rows of K each, by one tensor copy (TMA) per operand: A,
//     codes, scales and zero points, all completing on the stage's `full`
//     barrier (the copy engine takes a copy every ~100 cycles whatever its
//     size, so a copy per 16-column block would starve the consumers); after
//     a kernel (Params::overlap_previous_kernel) it copies the weight of the
//     first stages before it waits for that kernel, A after;
//   consumers (ConsumeStages): each owns kWeightTiles 64-column tiles of
//     the block's columns, dequantizes them per stage, in one or two parts
//     of K, and issues wgmma m64nNk16 over all N rows of A, keeping one
//     part's MMAs in flight while it dequantizes the next, then frees the
//     stage (`empty`);
//   epilogue (StoreTile): at a tile's end the consumers write C, through
//     their cluster's shared memory or the workspace when blocks share the
//     tile (gemm_common.cuh).
// Blocks walk the (tile, k step) sequence as gemm_common.cuh says: whole
// tiles for double_buffered, an even cut over one wave (stream-K) for
// striped.
#ifndef NIBBLE_KERNELS_CUDA_WGMMA_KERNEL_CUH_
#define NIBBLE_KERNELS_CUDA_WGMMA_KERNEL_CUH_

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/device_layout.h"
#include "kernels/cuda/gemm_common.cuh"
#include "kernels/cuda/sm90_ptx.cuh"

namespace nibble::cuda::internal {

// Rows of K per stage: one 128-byte swizzle row of fp16 A, one 64-row word
// group of the codes.
inline constexpr int kWgmmaStepK = 64;

// The fewest rows of A for which the pipelined variants run this kernel.
// Below 9 rows the mma.sync kernel's 8-row tile, which multiplies each
// group's sums by its scales rather than every weight value, is faster for
// u4b8, u4 and fp4 (an 8-row wgmma tile took 1.0-1.17x its time on an
// H200); nvfp4's groups of 16 rows leave it one MMA per group sum, and there
// the 8-row wgmma tile takes 0.87-0.94x its time.
constexpr int WgmmaMinRows(WeightFormat format) {
  return format == WeightFormat::kNvfp4 ? 1 : 9;
}

// The tensor maps of a launch (cuda_gemm.cu encodes them) and their boxes:
//   a_map      A [M, K]: {kWgmmaStepK, rows}, 128-byte swizzle;
//   codes_map  codes as u32 [padded_n / 256][K / 64][16][128]:
//              {128, blocks, 1, 1};
//   scales_map scales as u32 [groups][padded_n / 2]: {8 blocks, stage_groups};
//   zeros_map  zero points as u16 [groups][padded_n / 2], the same box.
// The codes, scales and zeros pointers of `p` are unused, as is `a`.
struct WgmmaParams {
  CUtensorMap a_map;
  CUtensorMap codes_map;
  CUtensorMap scales_map;
  CUtensorMap zeros_map;
  Params p;  // k_steps in steps of kWgmmaStepK
  // Groups of scales in a stage: one, or kWgmmaStepK / group size for groups
  // smaller than a stage.
  int stage_groups;
};

// The shape of a block's work and of its shared-memory stages, its consumer
// warpgroups, and how many blocks share an SM.
template <WeightFormat Format, typename Element, int Rows, int WeightTiles,
          int Consumers, int BlocksPerSm>
struct WgmmaTile {
  static constexpr int kConsumers = Consumers;
  static constexpr int kConsumerThreads = 128 * kConsumers;
  static constexpr int kThreads = 128 + kConsumerThreads;
  static constexpr int kBlocksPerSm = BlocksPerSm;
  // What the producer warpgroup keeps of its registers (setmaxnreg): one
  // thread of it issues tensor copies. 40 serve two consumers (24 took
  // 1.01-1.025x the time at M = 64 and 256 on an H100). Four consumers would
  // get 104 of them, too few for ptxas to keep their MMAs in flight: it
  // serializes them (C7512, "insufficient register resources"); with 24,
  // setmaxnreg's least, they get 112, and the 128-row tile takes 0.96-1.01x
  // the time at M = 96 and 128, median 0.99 (H100, 2026-11-27).
  static constexpr int kProducerRegisters = kConsumers == 4 ? 24 : 40;
  // Registers per thread at launch, the launch bounds' share of the
  // register file (in eights, as setmaxnreg counts), and what the consumers
  // take of the block's once the producers go down to kProducerRegisters.
  static constexpr int kLaunchRegisters =
      65536 / (kThreads * BlocksPerSm) / 8 * 8;
  static constexpr int kConsumerRegisters =
      (kLaunchRegisters * kThreads - 128 * kProducerRegisters) /
      kConsumerThreads / 8 * 8;
  static constexpr WeightFormat kFormat = Format;
  using T = Element;  // of A: half or __nv_bfloat16
  static constexpr int kRows = Rows;
  static constexpr int kWeightTiles = WeightTiles;
  static constexpr int kColumns = kConsumers * kWeightTiles * 64;
  static constexpr int kBlocks = kColumns / 16;  // 16-column code blocks
  static constexpr int kScaleRows = kWgmmaStepK / ScaleRowK(kFormat);
  static constexpr bool kZeros = HasZeros(kFormat);
  static constexpr int kAcc = kWeightTiles * kRows / 2;
  // Parts of a stage whose MMAs overlap the next part's dequantization
  // (ConsumeStages): two from 128 rows, where the MMAs of a part take
  // longer than dequantizing the next; one below, where they do not (two
  // at 64 rows took 0.99-1.04x the time at M = 48 and 64, H100,
  // 2026-11-27).
  static constexpr int kParts = kRows >= 128 ? 2 : 1;
  // Stage layout: A, codes [block][lane][4 words], scales [group][block][8
  // pairs], zero points [group][block][8 byte pairs], room for a group per
  // scale row.
  static constexpr int kABytes = kRows * kWgmmaStepK * 2;
  static constexpr int kCodeBytes = kBlocks * 512;
  static constexpr int kScaleRowBytes = kBlocks * 32;
  static constexpr int kZeroRowBytes = kBlocks * 16;
  static constexpr int kScaleOffset = kABytes + kCodeBytes;
  static constexpr int kZeroOffset = kScaleOffset + kScaleRows * kScaleRowBytes;
  static constexpr int kMaxBytes =
      kZeroOffset + (kZeros ? kScaleRows * kZeroRowBytes : 0);
  // Each stage's A starts 1024-byte aligned, as the swizzle needs.
  static constexpr int kStageBytes = (kMaxBytes + 1023) / 1024 * 1024;
  static constexpr int kStages =
      std::min(8, 200 * 1024 / BlocksPerSm / kStageBytes);
  // Dynamic shared memory, with room to align its start.
  static constexpr int kSharedBytes = kStages * kStageBytes + 1024;
  // What the copies of a stage with `groups` groups of scales write.
  __device__ static uint32_t CopyBytes(int groups) {
    return kScaleOffset +
           groups * (kScaleRowBytes + (kZeros ? kZeroRowBytes : 0));
  }
  // Where scale row `row` of a stage finds its group's scales.
  __device__ static int GroupOf(int row, int group_step_shift) {
    return row >> group_step_shift;
  }
};

template <typename Tile>
__device__ __forceinline__ void ProduceStages(const WgmmaParams& params,
                                              unsigned char* stages,
                                              uint64_t* full, uint64_t* empty,
                                              Iterations iterations) {
  const Params& p = params.p;
  const uint32_t bytes = Tile::CopyBytes(params.stage_groups);
  static_assert(kSpanBlocks % Tile::kBlocks == 0,
                "a tile's code blocks lie in one span");
  // The (tile, k step) of an iteration, advanced one at a time.
  struct Cursor {
    int tile;
    int step;
    __device__ void Advance(int k_steps) {
      if (++step == k_steps) {
        step = 0;
        ++tile;
      }
    }
  };
  // An iteration's copies into stage `s`, completing on full[s].
  auto load_weight = [&](Cursor at, int s) {
    unsigned char* stage = stages + s * Tile::kStageBytes;
    const int first_block = at.tile / p.tiles_m * Tile::kBlocks;
    const int group = (at.step * Tile::kScaleRows) >> p.group_step_shift;
    LoadTile4d(stage + Tile::kABytes, &params.codes_map, 0,
               first_block % kSpanBlocks, at.step, first_block / kSpanBlocks,
               &full[s]);
    LoadTile2d(stage + Tile::kScaleOffset, &params.scales_map, first_block * 8,
               group, &full[s]);
    if constexpr (Tile::kZeros) {
      LoadTile2d(stage + Tile::kZeroOffset, &params.zeros_map, first_block * 8,
                 group, &full[s]);
    }
  };
  auto load_a = [&](Cursor at, int s) {
    LoadTile2d(stages + s * Tile::kStageBytes, &params.a_map,
               at.step * kWgmmaStepK, at.tile % p.tiles_m * Tile::kRows,
               &full[s]);
  };
  // The weight of the first stages streams in while the previous kernel may
  // still run, A only after it has finished: queued behind that weight's
  // copies, stage 0's A would come late without a kernel before.
  const int count = iterations.end - iterations.begin;
  const int first_stages =
      p.overlap_previous_kernel ? min(Tile::kStages, count) : 0;
  const Cursor first{iterations.begin / p.k_steps,
                     iterations.begin % p.k_steps};
  Cursor next = first;
  for (int i = 0; i < first_stages; ++i, next.Advance(p.k_steps)) {
    ArriveExpectBytes(&full[i], bytes);
    load_weight(next, i);
  }
  WaitForPreviousKernel();
  Cursor a_next = first;
  for (int i = 0; i < first_stages; ++i, a_next.Advance(p.k_steps)) {
    load_a(a_next, i);
  }
  for (int i = first_stages; i < count; ++i, next.Advance(p.k_steps)) {
    const int s = i % Tile::kStages;
    WaitBarrier(&empty[s], ((i / Tile::kStages) & 1) ^ 1);
    ArriveExpectBytes(&full[s], bytes);
    load_a(next, s);
    load_weight(next, s);
  }
}

// Where the consumers' accumulators go in tile `tile` of C: accumulator
// e of acc[t] is row 16 w + g (+ 8 for e % 4 >= 2) of the thread's 64-column
// weight tile t and column 8 (e / 4) + 2 (lane % 4) (+ 1 for odd e) of A's
// rows: column and row of C. Accumulator i is acc[t][e] for
// i = t * kRows / 2 + e.
template <typename Tile>
__device__ __forceinline__ auto ElementsOf(const Params& p, int tile) {
  const int thread = threadIdx.x - 128;
  const int consumer = thread / 128;
  const int warp = thread / 32 % 4;
  const int lane = thread % 32;
  const Element origin = TileOrigin(p, tile, Tile::kRows, Tile::kColumns);
  const int row0 = origin.row + (lane % 4) * 2;
  const int col0 =
      origin.col + consumer * Tile::kWeightTiles * 64 + warp * 16 + lane / 4;
  return [=](int i) {
    const int t = i / (Tile::kRows / 2);
    const int e = i % (Tile::kRows / 2);
    return Element{row0 + (e / 4) * 8 + e % 2, col0 + t * 64 + (e % 4 / 2) * 8};
  };
}

// Writes the consumers' tile `tile` of C (every consumer thread calls it),
// with the other blocks of its cluster where Params::cluster_split is set
// (the producer warpgroup then joins the cluster's barriers:
// JoinClusterFinish), through the workspace otherwise.
template <typename Tile>
__device__ __forceinline__ void StoreTile(
    const Params& p, int tile,
    const float (&acc)[Tile::kWeightTiles][Tile::kRows / 2],
    unsigned char* stages, int& last_block) {
  const auto& flat = *reinterpret_cast<const float(*)[Tile::kAcc]>(&acc[0][0]);
  const int thread = threadIdx.x - 128;
  auto sync = [] { SyncThreads(1, Tile::kConsumerThreads); };
  if (p.cluster_split > 0) {
    static_assert(Tile::kAcc * Tile::kConsumerThreads * 4 <=
                      Tile::kStages * Tile::kStageBytes,
                  "the stages hold the cluster's partial sums");
    FinishTileInCluster<Tile::kColumns>(
        p, flat, thread, Tile::kConsumerThreads, sync,
        reinterpret_cast<float*>(stages),
        TileOrigin(p, tile, Tile::kRows, Tile::kColumns),
        ElementsOf<Tile>(p, tile));
  } else {
    FinishTile<false, StoreCode::kPredicated>(
        p, tile, flat, thread, Tile::kConsumerThreads, sync, last_block,
        ElementsOf<Tile>(p, tile));
  }
}

// The producer warpgroup's side of FinishTileInCluster's two cluster
// barriers, which every thread of the cluster's blocks must reach.
__device__ __forceinline__ void JoinClusterFinish() {
  __syncwarp();
  SyncCluster();
  SyncCluster();
}

// Multiplies the consumer's part of each stage and stores each tile of C as
// it ends.
template <typename Tile>
__device__ __forceinline__ void ConsumeStages(const Params& p,
                                              unsigned char* stages,
                                              uint64_t* full, uint64_t* empty,
                                              Iterations iterations,
                                              int& last_block) {
  using P = Pair<typename Tile::T>;
  constexpr int kWeightTiles = Tile::kWeightTiles;
  constexpr int kScaleRows = Tile::kScaleRows;
  const int thread = threadIdx.x - 128;
  const int consumer = thread / 128;
  const int warp = thread / 32 % 4;
  const int lane = thread % 32;
  float acc[kWeightTiles][Tile::kRows / 2];
  auto clear = [&] {
#pragma unroll
    for (int t = 0; t < kWeightTiles; ++t)
#pragma unroll
      for (int e = 0; e < Tile::kRows / 2; ++e) acc[t][e] = 0.0f;
  };
  // Keeps the compiler from moving accesses of the accumulators across the
  // asynchronous MMAs.
  auto fence_accumulators = [&] {
#pragma unroll
    for (int t = 0; t < kWeightTiles; ++t)
#pragma unroll
      for (int e = 0; e < Tile::kRows / 2; ++e) FenceRegister(acc[t][e]);
  };
  // Each stage goes in kParts parts of K, each with its own fragments, and
  // kParts - 1 groups of MMAs stay in flight while the next part is
  // dequantized: the group that last read a part's fragments must have
  // finished before they are written again, and a stage is freed when its
  // last part's group has.
  constexpr int kParts = Tile::kParts;
  constexpr int kPartKk = 4 / kParts;  // 16-row blocks of K per part
  // fragments[part][t][j]: weight tile t's A fragment for rows
  // 16 (part * kPartKk + j).. of the stage's K.
  uint32_t fragments[kParts][kWeightTiles][kPartKk][4];
  auto dequantize_part = [&](const unsigned char* stage, int part) {
#pragma unroll
    for (int t = 0; t < kWeightTiles; ++t) {
      const int block = (consumer * kWeightTiles + t) * 4 + warp;
      const uint4 words = reinterpret_cast<const uint4*>(
          stage + Tile::kABytes)[block * 32 + lane];
      const uint32_t word[4] = {words.x, words.y, words.z, words.w};
#pragma unroll
      for (int row = part * kScaleRows / kParts;
           row < (part + 1) * kScaleRows / kParts; ++row) {
        const int pair = block * 8 + lane / 4;
        const int group = Tile::GroupOf(row, p.group_step_shift);
        const uint32_t scales =
            P::FromHalfPair(reinterpret_cast<const uint32_t*>(
                stage + Tile::kScaleOffset +
                group * Tile::kScaleRowBytes)[pair]);
        uint32_t zeros = 0x0808u;
        if constexpr (Tile::kZeros) {
          zeros = reinterpret_cast<const uint16_t*>(
              stage + Tile::kZeroOffset + group * Tile::kZeroRowBytes)[pair];
        }
        uint32_t scale[2];
        uint32_t zero[2];
#pragma unroll
        for (int column = 0; column < 2; ++column) {
          scale[column] = Broadcast(scales, column);
          const uint32_t z = (zeros >> (8 * column)) & 0xffu;
          zero[column] = z | (z << 16);
        }
#pragma unroll
        for (int kk = row * 4 / kScaleRows; kk < (row + 1) * 4 / kScaleRows;
             ++kk) {
          uint32_t b[4];
          Dequantize<Tile::kFormat, typename Tile::T>(word[kk], scale, zero, b);
          // mma.sync's B fragments of columns g and g + 8 are wgmma's A
          // fragment rows g and g + 8.
          uint32_t(&fragment)[4] = fragments[part][t][kk - part * kPartKk];
          fragment[0] = b[0];
          fragment[1] = b[2];
          fragment[2] = b[1];
          fragment[3] = b[3];
        }
      }
    }
  };
  auto multiply_part = [&](const unsigned char* stage, int part) {
    fence_accumulators();
    FenceMmaOperands();
#pragma unroll
    for (int j = 0; j < kPartKk; ++j)
#pragma unroll
      for (int t = 0; t < kWeightTiles; ++t) {
        MmaM64K16<typename Tile::T, Tile::kRows>(
            acc[t], fragments[part][t][j],
            SwizzledOperand(stage + (part * kPartKk + j) * 32));
      }
    CommitMmas();
  };
  int in_flight = -1;  // the stage whose last groups may still run
  clear();
  int tile = iterations.begin / p.k_steps;
  int step = iterations.begin % p.k_steps;
  // Iteration iterations.begin + i; the loop keeps only i and the count, to
  // spare the registers (FinishTile takes the range again). It leaves only
  // from a tile's end, where every MMA has finished: with the count tested
  // at its foot, ptxas put a wait for every MMA there, in every iteration
  // (0.96-0.99x the time without it, M = 16-1024, H100).
  const int count = iterations.end - iterations.begin;
  if (count == 0) return;
#pragma unroll 1
  for (int i = 0;; ++i) {
    const int s = i % Tile::kStages;
    WaitBarrier(&full[s], (i / Tile::kStages) & 1);
    const unsigned char* stage = stages + s * Tile::kStageBytes;
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      WaitMmas<kParts - 1>();
      if (part == kParts - 1 && in_flight >= 0) {
        ArriveBarrier(&empty[in_flight]);
      }
      dequantize_part(stage, part);
      multiply_part(stage, part);
    }
    in_flight = s;
    if (++step == p.k_steps || i + 1 == count) {
      WaitMmas<0>();
      fence_accumulators();
      ArriveBarrier(&empty[s]);
      in_flight = -1;
      StoreTile<Tile>(p, tile, acc, stages, last_block);
      if (i + 1 == count) return;
      clear();
      step = 0;
      ++tile;
    }
  }
}

template <typename Tile>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kBlocksPerSm)
    WgmmaGemmKernel(const __grid_constant__ WgmmaParams params) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ unsigned char dynamic_shared[];
  __shared__ uint64_t full[Tile::kStages];
  __shared__ uint64_t empty[Tile::kStages];
  __shared__ int last_block;
  // An offset from the shared array rather than a rounded integer address,
  // so that the compiler still knows `stages` is shared memory and reads it
  // with shared loads, not generic ones.
  unsigned char* stages =
      dynamic_shared + (-SharedAddress(dynamic_shared) & 1023u);
  LetNextKernelStart();
  const Iterations iterations =
      IterationsOf(params.p, static_cast<int>(blockIdx.x));
  if (threadIdx.x == 0) {
    for (int s = 0; s < Tile::kStages; ++s) {
      InitBarrier(&full[s], 1);
      InitBarrier(&empty[s], Tile::kConsumerThreads);
    }
    FenceBarrierInit();
  }
  __syncthreads();
  if (threadIdx.x < 128) {
    LowerRegisters<Tile::kProducerRegisters>();
    if (threadIdx.x == 0) {
      ProduceStages<Tile>(params, stages, full, empty, iterations);
    }
    if (params.p.cluster_split > 0) JoinClusterFinish();
  } else {
    RaiseRegisters<Tile::kConsumerRegisters>();
    ConsumeStages<Tile>(params.p, stages, full, empty, iterations, last_block);
  }
#endif
}

// The wgmma kernel for one format, A type and tile rows (8, 16, 32, 64, 128
// or 256); instantiated in that format's .cu file.
template <WeightFormat kFormat, typename T, int kRows>
KernelChoice ChooseWgmmaRows() {
  // Up to 64 rows each of two consumers takes two 64-column tiles. At 128
  // rows four consumers take one each: twice the warps to cover the
  // dequantization, 0.87-0.98x the time of two on an H100 (at 64 rows four
  // took 0.99-1.13x at M = 48 and 64, 2026-11-27). At 256 two take one
  // each, to keep the accumulators in registers. Up to 32 rows, where the
  // weight's stream dominates and the accumulators are few, two blocks
  // share an SM, for twice the warps and stages in flight (0.89-0.95x the
  // time of one on the large shapes of an H200, the same on the small
  // ones).
  constexpr int kConsumers = kRows == 128 ? 4 : 2;
  using Tile = WgmmaTile<kFormat, T, kRows, kRows <= 64 ? 2 : 1, kConsumers,
                         kRows <= 32 ? 2 : 1>;
  return {.wgmma_function = WgmmaGemmKernel<Tile>,
          .shared_bytes = Tile::kSharedBytes,
          .threads = Tile::kThreads,
          .rows = kRows,
          .columns = Tile::kColumns};
}

// The fewest tile rows that cover `rows`: below 64 rows of A the MMAs of a
// wider tile would multiply rows of zeros, and the tile's A shares the stage
// with the codes.
template <WeightFormat kFormat, typename T>
KernelChoice ChooseWgmmaTiles(int rows) {
  if constexpr (WgmmaMinRows(kFormat) <= 8) {
    if (rows <= 8) return ChooseWgmmaRows<kFormat, T, 8>();
  }
  if (rows <= 16) return ChooseWgmmaRows<kFormat, T, 16>();
  if (rows <= 32) return ChooseWgmmaRows<kFormat, T, 32>();
  if (rows <= 64) return ChooseWgmmaRows<kFormat, T, 64>();
  if (rows <= 128) return ChooseWgmmaRows<kFormat, T, 128>();
  return ChooseWgmmaRows<kFormat, T, 256>();
}

// The wgmma kernel for `rows` rows of A, from WgmmaMinRows(kFormat).
template <WeightFormat kFormat>
KernelChoice ChooseWgmmaKernel(DType a_dtype, int rows) {
  return a_dtype == DType::kBF16
             ? ChooseWgmmaTiles<kFormat, __nv_bfloat16>(rows)
             : ChooseWgmmaTiles<kFormat, half>(rows);
}

extern template KernelChoice ChooseWgmmaKernel<WeightFormat::kFp4>(DType, int);
extern template KernelChoice ChooseWgmmaKernel<WeightFormat::kU4b8>(DType, int);
extern template KernelChoice ChooseWgmmaKernel<WeightFormat::kU4>(DType, int);
extern template KernelChoice ChooseWgmmaKernel<WeightFormat::kNvfp4>(DType,
                                                                     int);

}  // namespace nibble::cuda::internal

#endif  // NIBBLE_KERNELS_CUDA_WGMMA_KERNEL_CUH_
