// The double-buffered kernels for AMX (Intel Sapphire Rapids and later): the
// tile unit multiplies 16 x 32 bf16 by 32 x 16 bf16 into 16 x 16 fp32 in one
// instruction, about 16 times the FMA rate of AVX-512, so for M >= 16 the
// dequantization, not the multiply, sets the pace.
//
// A is rounded to bf16 once per call into tile order. Codes dequantize
// without their scale straight into bf16 tiles in the pair-interleaved (VNNI)
// layout: the packed words keep codes k and k + 1 in the two 16-bit halves
// (PackedWeight::CodeShift), so one 16-bit shift and one vpermw of a 32-entry
// table make a tile row. Those values are exact in bf16; each group's sums
// leave the tile unit through a 1 KiB store and are scaled in fp32, so the
// only rounding beyond fp32 is A's. A format whose groups are shorter than a
// tile's 32 rows (ScalesInTiles) has its E4M3 scales go into the tile values
// instead: an FP4 value times an E4M3 scale has at most 6 significant bits,
// exact in bf16; only its global scale multiplies the sums.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "format/dequant.h"
#include "format/weight_format.h"
#include "kernels/cpu/float_operands.h"
#include "kernels/cpu/format_kernel.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"

namespace nibble::cpu {

bool RequestAmxPermission() {
  // Linux hands out the tile data state only on request (arch_prctl
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), once per process.
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  static const bool granted =
      syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

}  // namespace nibble::cpu

#pragma GCC push_options
#pragma GCC target( \
    "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,f16c")
// clang ignores #pragma GCC target; this is its equivalent.
#ifdef __clang__
#pragma clang attribute push(                                                          \
    __attribute__((target(                                                             \
        "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,f16c"))), \
    apply_to = function)
#endif
// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector as the
// masked-off source and warn about it when inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace nibble::cpu {
namespace {

constexpr int64_t kWidth = PackedWeight::kPanelWidth;
constexpr int64_t kTileRows = 16;
constexpr int64_t kTileK = 32;  // bf16 values per tile row
constexpr int64_t kTileRowBytes = 64;
// Two panels (32 columns) per block: with two row tiles, 4 accumulator
// tiles, 2 A tiles and 2 B tiles use all 8 tile registers.
constexpr int64_t kBlockPanels = 2;
constexpr int64_t kBlockWidth = kBlockPanels * kWidth;
// Rows of K dequantized at a time, at most; segments never cross a group.
constexpr int64_t kMaxSegment = 512;

// Whether a format's groups are shorter than a tile's rows, so that its scales
// go into the tile values; only E4M3 scales times FP4 codes are exact there.
constexpr bool ScalesInTiles(WeightFormat format) {
  return FixedGroupSize(format) != 0 && FixedGroupSize(format) < kTileK;
}
static_assert([] {
  for (WeightFormat format : kAllWeightFormats) {
    if (ScalesInTiles(format) &&
        (Traits(format).scale_type != ScaleType::kE4m3 ||
         !HasFp4Codes(format))) {
      return false;
    }
  }
  return true;
}());

// Tile registers (literal numbers: the intrinsics paste them into the
// assembly): C(row tile, panel) = 2 * row tile + panel in 0..3, A(row tile)
// = 4 + row tile, B(panel) = 6 + panel.

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Holds the tile configuration for the calling thread while alive.
class TileScope {
 public:
  TileScope() {
    TileConfig config;
    for (int t = 0; t < 8; ++t) {
      config.bytes_per_row[t] = kTileRowBytes;
      config.rows[t] = kTileRows;
    }
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// A rounded to bf16 in tile order: [row tile][k tile][16 rows][32 k], rows
// past M zero, so each A tile is 1 KiB of contiguous memory.
std::vector<uint16_t> ToBf16Tiles(const float* a, int64_t m, int64_t k) {
  const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
  const int64_t k_tiles = k / kTileK;
  std::vector<uint16_t> tiles(row_tiles * kTileRows * k);
  for (int64_t row = 0; row < m; ++row) {
    const int64_t row_tile = row / kTileRows;
    for (int64_t k_tile = 0; k_tile < k_tiles; ++k_tile) {
      const float* from = a + row * k + k_tile * kTileK;
      const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(from + 16),
                                                _mm512_loadu_ps(from));
      uint16_t* to = tiles.data() + ((row_tile * k_tiles + k_tile) * kTileRows +
                                     row % kTileRows) *
                                        kTileK;
      _mm512_storeu_si512(to, reinterpret_cast<const __m512i&>(pair));
    }
  }
  return tiles;
}

// bf16 bits of what a 5-bit index stands for: the code's value, less 8 where
// the format subtracts 8 (bit 4 ignored), or q - zero in two's complement
// where each group has its own zero point.
__m512i Bf16Table(WeightFormat format) {
  alignas(64) uint16_t values[32];
  for (int index = 0; index < 32; ++index) {
    float value = 0.0f;
    if (HasFp4Codes(format)) {
      value = Fp4CodeToFloat(index & 0xf);
    } else if (HasZeros(format)) {
      value = index < 16 ? index : index - 32;
    } else {
      value = Int4CodeMinusZero(index & 0xf, EffectiveZero(format, 0));
    }
    values[index] = FloatToBf16(value);
  }
  return _mm512_load_si512(values);
}

struct AmxContext {
  const PackedWeight& b;
  __m512i table;
  const uint16_t* a_tiles;
  int64_t m;
  int64_t k;
  int64_t n;
};

// The scales of one group of a panel's 16 columns, from the packed layout:
// bf16 or fp16 (PackedScalesAreBf16).
template <WeightFormat kFormat>
__m512 LoadPanelScales(const uint16_t* scales) {
  const __m256i bits =
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales));
  if constexpr (PackedScalesAreBf16(kFormat)) {
    return _mm512_castsi512_ps(
        _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
  } else {
    return _mm512_cvtph_ps(bits);
  }
}

// A tile row of (k, k + 1) bf16 pairs, one column per 32-bit lane, times that
// column's scale. Exact when the products fit bf16 (ScalesInTiles): the fp32
// products then end in 16 zero bits, and their top halves are the result.
__m512i ScaleBf16Pairs(__m512i pairs, __m512 scale) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 low =
      _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)), scale);
  const __m512 high = _mm512_mul_ps(
      _mm512_castsi512_ps(_mm512_and_si512(pairs, high_half)), scale);
  return _mm512_or_si512(
      _mm512_srli_epi32(_mm512_castps_si512(low), 16),
      _mm512_and_si512(_mm512_castps_si512(high), high_half));
}

// Dequantizes words [first_word, end_word) of a segment that starts at
// segment_word into B tiles: [panel][k pair][16 columns x 2] bf16.
template <WeightFormat kFormat>
void DequantizeSegment(const AmxContext& ctx, int64_t first_panel,
                       int64_t panels, int64_t segment_word,
                       int64_t segment_words, int64_t first_word,
                       int64_t end_word, uint16_t* buffer) {
  const int64_t group = segment_word * kCodesPerWord / ctx.b.spec().group_size;
  for (int64_t p = 0; p < panels; ++p) {
    const uint32_t* codes = ctx.b.panel_codes(first_panel + p);
    __m512i zero = _mm512_setzero_si512();
    if constexpr (HasZeros(kFormat)) {
      // Each column's zero point in both 16-bit halves of its lane.
      const __m512i z =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(
              ctx.b.panel_zeros(first_panel + p) + group * kWidth)));
      zero = _mm512_or_si512(z, _mm512_slli_epi32(z, 16));
    }
    uint16_t* panel_tiles = buffer + p * segment_words * kCodesPerWord * kWidth;
    for (int64_t word = first_word; word < end_word; ++word) {
      __m512 scale = _mm512_setzero_ps();
      if constexpr (ScalesInTiles(kFormat)) {
        scale = LoadPanelScales<kFormat>(ctx.b.panel_scales(first_panel + p) +
                                         word * kCodesPerWord /
                                             ctx.b.spec().group_size * kWidth);
      }
      const __m512i words = _mm512_loadu_si512(codes + word * kWidth);
      uint16_t* rows = panel_tiles + (word - segment_word) * kCodesPerWord *
                                         kWidth;  // 4 pair rows of 32 bf16
      for (int pair = 0; pair < kCodesPerWord / 2; ++pair) {
        __m512i index = _mm512_srli_epi16(words, 4 * pair);
        if constexpr (HasZeros(kFormat)) {
          index = _mm512_sub_epi16(
              _mm512_and_si512(index, _mm512_set1_epi16(0xf)), zero);
        }
        __m512i values = _mm512_permutexvar_epi16(index, ctx.table);
        if constexpr (ScalesInTiles(kFormat)) {
          values = ScaleBf16Pairs(values, scale);
        }
        _mm512_storeu_si512(rows + pair * 2 * kWidth, values);
      }
    }
  }
}

// acc[rows][block] += scale * (A rows · B) over one segment, for kRowTiles
// row tiles from row_tile.
template <int kRowTiles>
void MultiplySegment(const AmxContext& ctx, int64_t row_tile, int64_t segment_k,
                     int64_t segment_len, const uint16_t* b_tiles,
                     const float* scales_block, float* acc) {
  const int64_t k_tiles = ctx.k / kTileK;
  const int64_t segment_pairs = segment_len / 2;
  _tile_zero(0);
  _tile_zero(1);
  if constexpr (kRowTiles == 2) {
    _tile_zero(2);
    _tile_zero(3);
  }
  for (int64_t t = 0; t < segment_len / kTileK; ++t) {
    const int64_t k_tile = segment_k / kTileK + t;
    const uint16_t* b0 = b_tiles + t * kTileRows * 2 * kWidth;
    _tile_loadd(6, b0, kTileRowBytes);
    _tile_loadd(7, b0 + segment_pairs * 2 * kWidth, kTileRowBytes);
    _tile_loadd(
        4, ctx.a_tiles + (row_tile * k_tiles + k_tile) * kTileRows * kTileK,
        kTileRowBytes);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kRowTiles == 2) {
      _tile_loadd(5,
                  ctx.a_tiles +
                      ((row_tile + 1) * k_tiles + k_tile) * kTileRows * kTileK,
                  kTileRowBytes);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  alignas(64) float sums[kRowTiles * 2][kTileRows * kWidth];
  _tile_stored(0, sums[0], kTileRowBytes);
  _tile_stored(1, sums[1], kTileRowBytes);
  if constexpr (kRowTiles == 2) {
    _tile_stored(2, sums[2], kTileRowBytes);
    _tile_stored(3, sums[3], kTileRowBytes);
  }
  for (int tile = 0; tile < kRowTiles * 2; ++tile) {
    const int panel = tile % 2;
    const __m512 scale = _mm512_loadu_ps(scales_block + panel * kWidth);
    float* acc_tile =
        acc + (row_tile + tile / 2) * kTileRows * kBlockWidth + panel * kWidth;
    for (int64_t r = 0; r < kTileRows; ++r) {
      float* out = acc_tile + r * kBlockWidth;
      _mm512_storeu_ps(
          out, _mm512_fmadd_ps(_mm512_load_ps(sums[tile] + r * kWidth), scale,
                               _mm512_loadu_ps(out)));
    }
  }
}

// The k ranges the loop dequantizes at once: whole groups of at most
// kMaxSegment rows, or pieces of a larger group.
struct Segment {
  int64_t k;
  int64_t len;
};

std::vector<Segment> Segments(int64_t k, int64_t group_size) {
  std::vector<Segment> segments;
  for (int64_t group_k = 0; group_k < k; group_k += group_size) {
    const int64_t group_end = std::min(k, group_k + group_size);
    for (int64_t s = group_k; s < group_end; s += kMaxSegment) {
      segments.push_back({s, std::min(kMaxSegment, group_end - s)});
    }
  }
  return segments;
}

template <WeightFormat kFormat>
void RunAmx(const AmxContext& ctx, float* c, ThreadPool& pool, int threads) {
  const int64_t panels = ctx.b.panels();
  const int64_t blocks = (panels + kBlockPanels - 1) / kBlockPanels;
  const int64_t row_tiles = (ctx.m + kTileRows - 1) / kTileRows;
  // Scales in the tile values: segments need not stop at groups.
  const int64_t scale_rows =
      ScalesInTiles(kFormat) ? ctx.k : ctx.b.spec().group_size;
  const std::vector<Segment> segments = Segments(ctx.k, scale_rows);
  const int64_t buffer_values = kMaxSegment * kBlockWidth;
  pool.ParallelFor(
      blocks,
      [&](int64_t first_block, int64_t end_block) {
        TileScope tiles;
        std::vector<uint16_t> buffers(2 * buffer_values);
        std::vector<float> acc(row_tiles * kTileRows * kBlockWidth);
        alignas(64) float scales[kBlockWidth];
        for (int64_t block = first_block; block < end_block; ++block) {
          const int64_t first_panel = block * kBlockPanels;
          const int64_t block_panels =
              std::min(kBlockPanels, panels - first_panel);
          std::fill(acc.begin(), acc.end(), 0.0f);
          // A missing second panel must multiply as zeros, not stale codes.
          if (block_panels < kBlockPanels) {
            std::fill(buffers.begin(), buffers.end(), 0);
          }
          const auto dequantize = [&](size_t s, int64_t slice, int64_t slices) {
            if (s >= segments.size()) return;
            const int64_t words = segments[s].len / kCodesPerWord;
            const int64_t first = segments[s].k / kCodesPerWord;
            DequantizeSegment<kFormat>(ctx, first_panel, block_panels, first,
                                       words, first + words * slice / slices,
                                       first + words * (slice + 1) / slices,
                                       buffers.data() + s % 2 * buffer_values);
          };
          dequantize(0, 0, 1);
          for (size_t s = 0; s < segments.size(); ++s) {
            const int64_t group = segments[s].k / ctx.b.spec().group_size;
            for (int64_t p = 0; p < kBlockPanels; ++p) {
              __m512 scale = _mm512_setzero_ps();  // a missing panel adds 0
              if (p < block_panels) {
                if constexpr (ScalesInTiles(kFormat)) {
                  scale = _mm512_set1_ps(ctx.b.spec().global_scale);
                } else {
                  scale = LoadPanelScales<kFormat>(
                      ctx.b.panel_scales(first_panel + p) + group * kWidth);
                }
              }
              _mm512_store_ps(scales + p * kWidth, scale);
            }
            const uint16_t* b_tiles = buffers.data() + s % 2 * buffer_values;
            const int64_t pairs_of_row_tiles = (row_tiles + 1) / 2;
            for (int64_t rt = 0; rt < row_tiles; rt += 2) {
              if (rt + 1 < row_tiles) {
                MultiplySegment<2>(ctx, rt, segments[s].k, segments[s].len,
                                   b_tiles, scales, acc.data());
              } else {
                MultiplySegment<1>(ctx, rt, segments[s].k, segments[s].len,
                                   b_tiles, scales, acc.data());
              }
              dequantize(s + 1, rt / 2, pairs_of_row_tiles);
            }
          }
          const int64_t first_column = first_panel * kWidth;
          const int64_t columns = std::min(kBlockWidth, ctx.n - first_column);
          for (int64_t row = 0; row < ctx.m; ++row) {
            std::copy_n(acc.data() + row * kBlockWidth, columns,
                        c + row * ctx.n + first_column);
          }
        }
      },
      threads);
}

class AmxKernel final : public FormatKernel {
 public:
  explicit AmxKernel(WeightFormat format)
      : FormatKernel(KernelVariant::kDoubleBuffered, format, "amx") {}

  // Tiles take K in steps of 32.
  bool Supports(const GemmProblem& problem) const override {
    return FormatKernel::Supports(problem) && problem.k % kTileK == 0;
  }
  bool RoundsActivationsToBf16(DType dtype) const override {
    return dtype != DType::kBF16;
  }

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override {
    WithFloatOperands(problem, operands, [&](const float* a, float* c) {
      const std::vector<uint16_t> a_tiles =
          ToBf16Tiles(a, problem.m, problem.k);
      const AmxContext ctx{*operands.b, Bf16Table(format()), a_tiles.data(),
                           problem.m,   problem.k,           problem.n};
      WithFormatConstant(format(), [&](auto format_tag) {
        RunAmx<decltype(format_tag)::value>(ctx, c, pool, problem.threads);
      });
    });
    return absl::OkStatus();
  }
};

}  // namespace

std::vector<std::unique_ptr<GemmKernel>> MakeAmxKernels() {
  std::vector<std::unique_ptr<GemmKernel>> kernels;
  for (WeightFormat format : kAllWeightFormats) {
    kernels.push_back(std::make_unique<AmxKernel>(format));
  }
  return kernels;
}

}  // namespace nibble::cpu

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
