#include <cuda_fp16.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "kernels/cuda/arrange_weight.h"
#include "kernels/cuda/cuda_gemm.h"

namespace nibble::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;
constexpr int64_t kWordRowsPerStep = kTileK / kCodesPerWord;

// ScaleConversion for the device: the table of 8-bit codes, or the factor
// of fp16 scales (ConvertHalfScale's rounding).
struct DeviceScaleConversion {
  bool by_table;
  float half_factor;
  uint16_t half_of_code[256];

  __device__ uint16_t operator()(uint16_t slot) const {
    if (by_table) return half_of_code[slot & 0xffu];
    return __half_as_ushort(
        __float2half_rn(__half2float(__ushort_as_half(slot)) * half_factor));
  }
};

// Where a piece of a weight's canonical words lies once staged: word rows
// [first_step * 8, (first_step + steps) * 8) of columns [first_block * 16,
// (first_block + blocks) * 16), word (r, c) at [(r - first_step * 8) *
// row_stride + (c - first_block * 16) * col_stride]. The canonical layout
// is [K/8][N] words (col_stride 1); the column layout's bytes are its
// transpose, [N][K/8] words (row_stride 1).
struct PieceShape {
  int64_t row_stride;
  int64_t col_stride;
  int64_t first_block;
  int64_t blocks;
  int64_t first_step;
  int64_t steps;
};

// One word of the device layout per iteration: [N/256][K/64][16][lane][4],
// here those of `piece`. By device_layout.h, lane g * 4 + t's word for rows
// 16 b .. 16 b + 15 of columns c and c + 8 (c = 16 block + g) takes byte t
// (rows 2t and 2t + 1) of the four canonical words of word rows 2b, 2b + 1
// and those columns: their low nibbles are codes 0..3, their high nibbles
// codes 4..7.
__global__ void ArrangeCodes(const uint32_t* __restrict__ staged,
                             PieceShape piece, int64_t n, int64_t k_steps,
                             uint32_t* __restrict__ codes) {
  const int64_t per_block = piece.steps * kLanes * kWordsPerLane;
  const int64_t total = piece.blocks * per_block;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t block_in_piece = i / per_block;
    const int64_t step = (i % per_block) / (kLanes * kWordsPerLane);
    const int lane = static_cast<int>(i / kWordsPerLane % kLanes);
    const int word = static_cast<int>(i % kWordsPerLane);
    const int64_t word_row = (step * kWordsPerLane + word) * 2;
    const int64_t col_in_piece = block_in_piece * 16 + lane / 4;
    const int64_t col_block = piece.first_block + block_in_piece;
    const int byte_shift = 8 * (lane % 4);
    uint32_t arranged = 0;
    // Source m: word row 2b + m % 2 of column c + 8 (m / 2).
    for (int m = 0; m < 4; ++m) {
      const int64_t source_col = col_in_piece + 8 * (m / 2);
      const uint32_t source =
          piece.first_block * 16 + source_col < n
              ? staged[(word_row + m % 2) * piece.row_stride +
                       source_col * piece.col_stride]
              : 0;
      const uint32_t byte = (source >> byte_shift) & 0xffu;
      arranged |= (byte & 0xfu) << (4 * m);
      arranged |= (byte >> 4) << (16 + 4 * m);
    }
    codes[CodeWordIndex(k_steps, col_block, piece.first_step + step, lane,
                        word)] = arranged;
  }
}

// One scale pair (and zero-point pair) per iteration: [groups][N/16][8],
// here groups [first_group, first_group + groups) from `scales` [groups, n]
// slots and `zeros` [groups, n] (nullptr for none); pair g of a 16-column
// block holds columns g and g + 8.
__global__ void ArrangeScales(const uint16_t* __restrict__ scales,
                              const uint8_t* __restrict__ zeros, int64_t n,
                              int64_t col_blocks, int64_t first_group,
                              int64_t groups, DeviceScaleConversion convert,
                              uint32_t* __restrict__ scale_pairs,
                              uint16_t* __restrict__ zero_pairs) {
  const int64_t per_group = col_blocks * 8;
  const int64_t total = groups * per_group;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total;
       i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t group = i / per_group;
    const int64_t col = (i % per_group) / 8 * 16 + i % 8;
    uint32_t scale_pair = 0;
    uint16_t zero_pair = 0;
    for (int half = 0; half < 2; ++half) {
      const int64_t source_col = col + 8 * half;
      if (source_col >= n) continue;
      const uint16_t slot = scales[group * n + source_col];
      scale_pair |= uint32_t{convert(slot)} << (16 * half);
      if (zeros != nullptr) {
        zero_pair |=
            static_cast<uint16_t>(zeros[group * n + source_col] << (8 * half));
      }
    }
    const int64_t pair = (first_group * per_group) + i;
    scale_pairs[pair] = scale_pair;
    if (zeros != nullptr) zero_pairs[pair] = zero_pair;
  }
}

unsigned BlocksFor(int64_t items) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((items + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// Reserves `staging` for as many units of `unit_bytes` as `staging_bytes`
// holds, at least one and at most `units`; how many.
absl::StatusOr<int64_t> StageUnits(DeviceBuffer& staging, int64_t unit_bytes,
                                   int64_t units, int64_t staging_bytes) {
  const int64_t at_once =
      std::clamp<int64_t>(staging_bytes / unit_bytes, 1, units);
  if (absl::Status status =
          staging.Reserve(at_once * unit_bytes, "staging a weight's upload");
      !status.ok()) {
    return status;
  }
  return at_once;
}

absl::Status CopyIn(void* to, const void* from, int64_t bytes,
                    const std::string& what) {
  return CudaStatus(
      cudaMemcpy(to, from, static_cast<size_t>(bytes), cudaMemcpyHostToDevice),
      absl::StrCat("copying ", what, " to the GPU"));
}

// Waits for the kernel just launched, so that its staging may be reused.
absl::Status Finish(const std::string& what) {
  if (absl::Status status =
          CudaStatus(cudaGetLastError(), absl::StrCat("launching ", what));
      !status.ok()) {
    return status;
  }
  return CudaStatus(cudaStreamSynchronize(nullptr), what);
}

// Copies `piece_bytes` from `from` into `staging` and arranges them as
// `piece` says.
absl::Status ArrangePiece(const void* from, int64_t piece_bytes,
                          const PieceShape& piece, const DeviceBuffer& staging,
                          const WeightSpec& spec, uint32_t* codes) {
  if (absl::Status status = CopyIn(staging.data(), from, piece_bytes, "codes");
      !status.ok()) {
    return status;
  }
  ArrangeCodes<<<BlocksFor(piece.blocks * piece.steps * kLanes * kWordsPerLane),
                 kThreads>>>(staging.data<uint32_t>(), piece, spec.n,
                             spec.k / kTileK, codes);
  return Finish("the codes' arrangement");
}

// The canonical qweight, a run of 64-row steps of every column at a time.
absl::Status ArrangeAllCodes(const QuantizedWeight& canonical,
                             int64_t col_blocks, int64_t staging_bytes,
                             uint32_t* codes) {
  const WeightSpec& spec = canonical.spec;
  const int64_t k_steps = spec.k / kTileK;
  const int64_t step_bytes = kWordRowsPerStep * spec.n * 4;
  DeviceBuffer staging;
  const absl::StatusOr<int64_t> steps_at_once =
      StageUnits(staging, step_bytes, k_steps, staging_bytes);
  if (!steps_at_once.ok()) return steps_at_once.status();
  for (int64_t first = 0; first < k_steps; first += *steps_at_once) {
    const int64_t steps = std::min(*steps_at_once, k_steps - first);
    if (absl::Status status = ArrangePiece(
            canonical.qweight.data() + first * kWordRowsPerStep * spec.n,
            steps * step_bytes,
            {.row_stride = spec.n,
             .col_stride = 1,
             .first_block = 0,
             .blocks = col_blocks,
             .first_step = first,
             .steps = steps},
            staging, spec, codes);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// The column layout's codes, a run of 16-column blocks at a time.
absl::Status ArrangeAllCodes(const Fp4Columns& columns, int64_t col_blocks,
                             int64_t staging_bytes, uint32_t* codes) {
  const WeightSpec& spec = columns.spec;
  const int64_t column_bytes = spec.k / 2;
  const int64_t block_bytes = 16 * column_bytes;
  DeviceBuffer staging;
  const absl::StatusOr<int64_t> blocks_at_once =
      StageUnits(staging, block_bytes, col_blocks, staging_bytes);
  if (!blocks_at_once.ok()) return blocks_at_once.status();
  const int64_t word_rows = spec.k / kCodesPerWord;
  // Every block, those wholly past N included: their padding is written
  // too.
  for (int64_t first = 0; first < col_blocks; first += *blocks_at_once) {
    const int64_t blocks = std::min(*blocks_at_once, col_blocks - first);
    const int64_t cols =
        std::clamp<int64_t>(spec.n - first * 16, 0, blocks * 16);
    if (absl::Status status = ArrangePiece(columns.codes + first * block_bytes,
                                           cols * column_bytes,
                                           {.row_stride = 1,
                                            .col_stride = word_rows,
                                            .first_block = first,
                                            .blocks = blocks,
                                            .first_step = 0,
                                            .steps = spec.k / kTileK},
                                           staging, spec, codes);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

absl::Status ArrangeAllScales(const QuantizedWeight& canonical,
                              const ScaleConversion& conversion,
                              int64_t col_blocks, int64_t staging_bytes,
                              const ArrangedArrays& to) {
  const WeightSpec& spec = canonical.spec;
  const bool has_zeros = HasZeros(spec.format);
  const int64_t group_bytes = spec.n * (2 + (has_zeros ? 1 : 0));
  DeviceBuffer staging;
  const absl::StatusOr<int64_t> groups_at_once =
      StageUnits(staging, group_bytes, spec.groups(), staging_bytes);
  if (!groups_at_once.ok()) return groups_at_once.status();
  uint16_t* staged_scales = staging.data<uint16_t>();
  uint8_t* staged_zeros =
      has_zeros ? staging.data<uint8_t>() + *groups_at_once * spec.n * 2
                : nullptr;
  DeviceScaleConversion convert{.by_table = conversion.by_table,
                                .half_factor = conversion.half_factor,
                                .half_of_code = {}};
  std::copy(conversion.half_of_code.begin(), conversion.half_of_code.end(),
            convert.half_of_code);
  for (int64_t first = 0; first < spec.groups(); first += *groups_at_once) {
    const int64_t groups = std::min(*groups_at_once, spec.groups() - first);
    if (absl::Status status =
            CopyIn(staged_scales, canonical.scales.data() + first * spec.n,
                   groups * spec.n * 2, "scales");
        !status.ok()) {
      return status;
    }
    if (has_zeros) {
      if (absl::Status status =
              CopyIn(staged_zeros, canonical.zeros.data() + first * spec.n,
                     groups * spec.n, "zero points");
          !status.ok()) {
        return status;
      }
    }
    ArrangeScales<<<BlocksFor(groups * col_blocks * 8), kThreads>>>(
        staged_scales, staged_zeros, spec.n, col_blocks, first, groups, convert,
        to.scales, to.zeros);
    if (absl::Status status = Finish("the scales' arrangement"); !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// The codes of `codes` (a canonical weight or columns), then the scales and
// zero points of `scales`.
template <typename Codes>
absl::Status ArrangeAll(const Codes& codes, const QuantizedWeight& scales,
                        const ScaleConversion& conversion,
                        const ArrangedArrays& to, int64_t staging_bytes) {
  const int64_t col_blocks = PaddedN(scales.spec.n) / 16;
  if (absl::Status status =
          ArrangeAllCodes(codes, col_blocks, staging_bytes, to.codes);
      !status.ok()) {
    return status;
  }
  return ArrangeAllScales(scales, conversion, col_blocks, staging_bytes, to);
}

}  // namespace

absl::Status ArrangeOnDevice(const QuantizedWeight& canonical,
                             const ScaleConversion& conversion,
                             const ArrangedArrays& to, int64_t staging_bytes) {
  return ArrangeAll(canonical, canonical, conversion, to, staging_bytes);
}

absl::Status ArrangeOnDevice(const Fp4Columns& columns,
                             const QuantizedWeight& scales,
                             const ScaleConversion& conversion,
                             const ArrangedArrays& to, int64_t staging_bytes) {
  return ArrangeAll(columns, scales, conversion, to, staging_bytes);
}

}  // namespace nibble::cuda
