// The kernels for AVX-512 BF16 (AMD Zen 4, Intel Cooper Lake and later):
// vdpbf16ps adds the products of 16 (k, k + 1) bf16 pairs into 16 fp32
// lanes, two multiply-adds per lane where an fp32 FMA does one.
//
// double_buffered: the loop, the dequantization into bf16 pairs and the
// precision contract are kernels/cpu/bf16_pairs.h's. Here A is rounded to
// bf16 row by row; a microkernel keeps 8 rows x 48 columns of a segment's
// sums in 24 registers, broadcasting one (k, k + 1) pair of A per row against
// one pair row of each of 3 panels.
//
// fused: the codes become bf16 pairs in registers (the same 16-bit shift and
// vpermw) and go straight into vdpbf16ps, so a weight streams once at half
// the vector instructions per code of the fp32 fused loop, which one Zen 4
// core cannot run at DRAM speed, and no pairs go through memory, which at 16
// to 256 rows makes it faster than double_buffered. A in bf16 needs no
// rounding, so its products are exact, as in the fp32 kernels. f32 and f16 A
// is rounded to bf16 once per call, as double_buffered does, from the rows
// the level that lists the kernels says (cpu_kernels.cc).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
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

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c")
// clang ignores #pragma GCC target; this is its equivalent.
#ifdef __clang__
#pragma clang attribute push(                                               \
    __attribute__((                                                         \
        target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,fma,f16c"))), \
    apply_to = function)
#endif
// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector as the
// masked-off source and warn about it when inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/bf16_pairs.h"
#include "kernels/cpu/shared_work.h"

namespace nibble::cpu {
namespace {

using bf16::Bf16Context;
using bf16::kPairRowValues;
using bf16::kWidth;

struct DotProducts {
  static constexpr char kIsa[] = "avx512_bf16";
  static constexpr int64_t kBlockPanels = 3;
  static constexpr int64_t kBlockWidth = kBlockPanels * kWidth;
  static constexpr int64_t kRowStep = 8;
  struct ThreadScope {};

  static bool SupportsK(int64_t /*k*/) { return true; }

  static __m512bh AsPairs(__m512i bits) {
    return reinterpret_cast<const __m512bh&>(bits);
  }

  // A rounded to bf16 (round to nearest even), row-major [m][k].
  static std::vector<uint16_t> RoundActivations(const float* a, int64_t m,
                                                int64_t k) {
    std::vector<uint16_t> rounded(m * k);
    const int64_t count = m * k;
    for (int64_t i = 0; i < count; i += 16) {
      const __mmask16 mask = static_cast<__mmask16>(
          count - i >= 16 ? 0xffff : (1u << (count - i)) - 1);
      const __m256bh values =
          _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(mask, a + i));
      _mm256_mask_storeu_epi16(rounded.data() + i, mask,
                               reinterpret_cast<const __m256i&>(values));
    }
    return rounded;
  }

  // acc[kRows][kBlockWidth] += scales * (A rows · pairs) over the segment.
  // Not inlined: inside the caller's loops, GCC 12 keeps the B rows on the
  // stack and reloads them for every product.
  template <int kRows>
  [[gnu::noinline]] static void MultiplyRows(const Bf16Context& ctx,
                                             int64_t row,
                                             const Segment& segment,
                                             const uint16_t* pairs,
                                             const float* scales, float* acc) {
    const int64_t segment_pairs = segment.len / 2;
    const uint16_t* a = ctx.a + row * ctx.k + segment.k;
    __m512 sums[kRows][kBlockPanels];
    for (auto& sum_row : sums) {
      for (__m512& sum : sum_row) sum = _mm512_setzero_ps();
    }
    // A segment has at least one pair; a do-while keeps GCC from spilling the
    // sums around a loop that might not run.
    int64_t pair = 0;
    do {
      __m512bh b[kBlockPanels];
      for (int p = 0; p < kBlockPanels; ++p) {
        b[p] = AsPairs(_mm512_loadu_si512(pairs + (p * segment_pairs + pair) *
                                                      kPairRowValues));
      }
      for (int r = 0; r < kRows; ++r) {
        int32_t a_pair;
        std::memcpy(&a_pair, a + r * ctx.k + 2 * pair, sizeof(a_pair));
        const __m512bh x = AsPairs(_mm512_set1_epi32(a_pair));
        for (int p = 0; p < kBlockPanels; ++p) {
          sums[r][p] = _mm512_dpbf16_ps(sums[r][p], x, b[p]);
        }
      }
    } while (++pair < segment_pairs);
    __m512 scale[kBlockPanels];
    for (int p = 0; p < kBlockPanels; ++p) {
      scale[p] = _mm512_load_ps(scales + p * kWidth);
    }
    for (int r = 0; r < kRows; ++r) {
      for (int p = 0; p < kBlockPanels; ++p) {
        float* out = acc + r * kBlockWidth + p * kWidth;
        _mm512_storeu_ps(
            out, _mm512_fmadd_ps(sums[r][p], scale[p], _mm512_loadu_ps(out)));
      }
    }
  }

  template <int kRows = kRowStep>
  static void Multiply(const Bf16Context& ctx, int64_t row, int64_t rows,
                       const Segment& segment, const uint16_t* pairs,
                       const float* scales, float* acc) {
    if constexpr (kRows > 0) {
      if (rows == kRows) {
        MultiplyRows<kRows>(ctx, row, segment, pairs, scales, acc);
      } else {
        Multiply<kRows - 1>(ctx, row, rows, segment, pairs, scales, acc);
      }
    }
  }
};

// The fused tile: C[row .. row + kRows) of kPanels panels from first_panel,
// over all of K, with the sums of each group (or, where the scales are in
// the pair values, of all K) in registers.
template <WeightFormat kFormat, int kRows, int kPanels>
void FusedPairsTile(const Bf16Context& ctx, int64_t row, int64_t first_panel,
                    float* out, int64_t columns) {
  // How far ahead of the words it reads the loop prefetches its panels.
  constexpr int64_t kPrefetchWords = 8;
  const int64_t group_size = ctx.b.spec().group_size;
  const int64_t sum_rows = bf16::ScalesInPairs(kFormat) ? ctx.k : group_size;
  const uint16_t* a = ctx.a + row * ctx.k;
  __m512 acc[kRows][kPanels];
  for (auto& acc_row : acc) {
    for (__m512& value : acc_row) value = _mm512_setzero_ps();
  }
  for (int64_t begin = 0; begin < ctx.k; begin += sum_rows) {
    const int64_t end = std::min(ctx.k, begin + sum_rows);
    // Each column's zero point in both 16-bit halves of its lane.
    __m512i zero[kPanels];
    if constexpr (HasZeros(kFormat)) {
      for (int p = 0; p < kPanels; ++p) {
        const __m512i z = _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                ctx.b.panel_zeros(first_panel + p) +
                begin / group_size * kWidth)));
        zero[p] = _mm512_or_si512(z, _mm512_slli_epi32(z, 16));
      }
    }
    __m512 sum[kRows][kPanels];
    for (auto& sum_row : sum) {
      for (__m512& value : sum_row) value = _mm512_setzero_ps();
    }
    for (int64_t word = begin / kCodesPerWord; word < end / kCodesPerWord;
         ++word) {
      __m512i words[kPanels];
      __m512 pair_scale[kPanels];
      for (int p = 0; p < kPanels; ++p) {
        const uint32_t* codes = ctx.b.panel_codes(first_panel + p);
        __builtin_prefetch(codes + (word + kPrefetchWords) * kWidth);
        words[p] = _mm512_loadu_si512(codes + word * kWidth);
        if constexpr (bf16::ScalesInPairs(kFormat)) {
          pair_scale[p] = LoadPanelScales<kFormat>(
              ctx.b.panel_scales(first_panel + p) +
              word * kCodesPerWord / group_size * kWidth);
        }
      }
      for (int pair = 0; pair < kCodesPerWord / 2; ++pair) {
        for (int p = 0; p < kPanels; ++p) {
          __m512i index = _mm512_srli_epi16(words[p], 4 * pair);
          if constexpr (HasZeros(kFormat)) {
            index = _mm512_sub_epi16(
                _mm512_and_si512(index, _mm512_set1_epi16(0xf)), zero[p]);
          }
          __m512i values = _mm512_permutexvar_epi16(index, ctx.table);
          if constexpr (bf16::ScalesInPairs(kFormat)) {
            values = bf16::ScaleBf16Pairs(values, pair_scale[p]);
          }
          for (int r = 0; r < kRows; ++r) {
            int32_t a_pair;
            std::memcpy(&a_pair,
                        a + r * ctx.k + word * kCodesPerWord + 2 * pair,
                        sizeof(a_pair));
            sum[r][p] = _mm512_dpbf16_ps(
                sum[r][p], DotProducts::AsPairs(_mm512_set1_epi32(a_pair)),
                DotProducts::AsPairs(values));
          }
        }
      }
    }
    for (int p = 0; p < kPanels; ++p) {
      const __m512 scale =
          bf16::ScalesInPairs(kFormat)
              ? _mm512_set1_ps(ctx.b.spec().global_scale)
              : LoadPanelScales<kFormat>(ctx.b.panel_scales(first_panel + p) +
                                         begin / group_size * kWidth);
      for (int r = 0; r < kRows; ++r) {
        acc[r][p] = _mm512_fmadd_ps(sum[r][p], scale, acc[r][p]);
      }
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int p = 0; p < kPanels; ++p) {
      const int64_t column = p * kWidth;
      if (column >= columns) break;
      const int count = static_cast<int>(std::min(kWidth, columns - column));
      _mm512_mask_storeu_ps(out + r * ctx.n + column,
                            static_cast<__mmask16>((1u << count) - 1),
                            acc[r][p]);
    }
  }
}

// A fused tile's panels: 4 for problems of one or two rows, 2 for more, so
// that the sums and accumulators of its largest row block fit the 32
// registers (2 x 4 and 4 x 2). Every row block of a problem, the last one
// too, takes the same panels: the tiles are cut by them.
constexpr int FusedTilePanels(int64_t m) { return m <= 2 ? 4 : 2; }
// Rows of A a fused tile takes at once, with kPanels panels.
constexpr int FusedMaxRows(int panels) { return panels == 4 ? 2 : 4; }

// FusedPairsTile for a run-time row count 1..kRows, over kPanels panels, or
// one panel at a time for the last, partial tile.
template <WeightFormat kFormat, int kPanels, int kRows = FusedMaxRows(kPanels)>
void FusedPairsRows(const Bf16Context& ctx, int rows, int64_t row,
                    int64_t first_panel, bool whole, float* out,
                    int64_t columns) {
  if constexpr (kRows > 0) {
    if (rows != kRows) {
      FusedPairsRows<kFormat, kPanels, kRows - 1>(ctx, rows, row, first_panel,
                                                  whole, out, columns);
    } else if (whole) {
      FusedPairsTile<kFormat, kRows, kPanels>(ctx, row, first_panel, out,
                                              columns);
    } else {
      FusedPairsTile<kFormat, kRows, 1>(ctx, row, first_panel, out, columns);
    }
  }
}

template <WeightFormat kFormat, int kPanels>
void RunFusedPairTiles(const Bf16Context& ctx, float* c, ThreadPool& pool,
                       int threads) {
  constexpr int kRows = FusedMaxRows(kPanels);
  const int64_t panels = ctx.b.panels();
  const int64_t tiles = (panels + kPanels - 1) / kPanels;
  ParallelForShared(
      pool, tiles, ThreadsForWork(ctx.b.resident_bytes() * ctx.m, threads),
      [&](int64_t first_tile, int64_t end_tile) {
        for (int64_t tile = first_tile; tile < end_tile; ++tile) {
          const int64_t first_panel = tile * kPanels;
          const bool whole = first_panel + kPanels <= panels;
          const int64_t end_panel = whole ? first_panel + kPanels : panels;
          for (int64_t row = 0; row < ctx.m; row += kRows) {
            const int rows =
                static_cast<int>(std::min<int64_t>(kRows, ctx.m - row));
            // A partial tile runs one panel at a time.
            for (int64_t panel = first_panel; panel < end_panel;
                 panel += whole ? kPanels : 1) {
              const int64_t column = panel * kWidth;
              FusedPairsRows<kFormat, kPanels>(ctx, rows, row, panel, whole,
                                               c + row * ctx.n + column,
                                               ctx.n - column);
            }
          }
        }
      });
}

template <WeightFormat kFormat>
void RunFusedPairs(const Bf16Context& ctx, float* c, ThreadPool& pool,
                   int threads) {
  if (FusedTilePanels(ctx.m) == 4) {
    RunFusedPairTiles<kFormat, 4>(ctx, c, pool, threads);
  } else {
    RunFusedPairTiles<kFormat, 2>(ctx, c, pool, threads);
  }
}

// The fused kernel of one format, named "fused_<format>_avx512_bf16", which
// rounds f32 and f16 A from `min_rounded_rows` rows.
class FusedPairsKernel final : public FormatKernel {
 public:
  FusedPairsKernel(WeightFormat format, int64_t min_rounded_rows)
      : FormatKernel(KernelVariant::kFused, format, DotProducts::kIsa),
        min_rounded_rows_(min_rounded_rows) {}

  bool Supports(const GemmProblem& problem) const override {
    return FormatKernel::Supports(problem) &&
           RoundingToBf16Allowed(problem, min_rounded_rows_);
  }
  bool RoundsActivationsToBf16(DType dtype) const override {
    return dtype != DType::kBF16;
  }

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override {
    auto run = [&](const uint16_t* a, float* c) {
      const Bf16Context ctx{*operands.b, bf16::Bf16Table(format()),
                            a,           problem.m,
                            problem.k,   problem.n};
      WithFormatConstant(format(), [&](auto format_tag) {
        RunFusedPairs<decltype(format_tag)::value>(ctx, c, pool,
                                                   problem.threads);
      });
    };
    // bf16 A is read as it is; f32 and f16 A is rounded once.
    if (problem.dtype == DType::kBF16) {
      WithFloatOutput(problem, operands, [&](float* c) {
        run(static_cast<const uint16_t*>(operands.a), c);
      });
    } else {
      WithFloatOperands(problem, operands, [&](const float* a, float* c) {
        run(DotProducts::RoundActivations(a, problem.m, problem.k).data(), c);
      });
    }
    return absl::OkStatus();
  }

 private:
  int64_t min_rounded_rows_;
};

}  // namespace

std::vector<std::unique_ptr<GemmKernel>> MakeAvx512Bf16Kernels(
    int64_t min_rounded_rows) {
  std::vector<std::unique_ptr<GemmKernel>> kernels =
      bf16::MakeBf16PairKernels<DotProducts>(min_rounded_rows);
  for (WeightFormat format : kAllWeightFormats) {
    kernels.push_back(
        std::make_unique<FusedPairsKernel>(format, min_rounded_rows));
  }
  return kernels;
}

}  // namespace nibble::cpu

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
