// The double-buffered loop of the kernels that multiply bf16 pairs into fp32
// (AMX tiles, AVX-512 BF16 dot products), written once over a multiply unit
// U and compiled per ISA: kernels/cpu/amx.cc and kernels/cpu/avx512_bf16.cc
// include this file after their `#pragma GCC target` (which must enable
// AVX-512 F, BW and BF16) and define U in their anonymous namespace after it,
// so every instantiation is local to its file and built for its instruction
// set. Include it nowhere else.
//
// A is rounded to bf16 once per call, in U's layout, from the rows of f32
// or f16 A the kernel is made for (MakeBf16PairKernels). Codes dequantize
// without their scale straight into (k, k + 1) bf16 pairs, one column per
// 32-bit lane: the packed words keep codes k and k + 1 in the two 16-bit halves
// (PackedWeight::CodeShift), so one 16-bit shift and one vpermw of a 32-entry
// table make 16 columns of pairs. Those values are exact in bf16; each group's
// sums are scaled in fp32, so the only rounding beyond fp32 is A's. A format
// whose groups are shorter than 32 rows (ScalesInPairs) has its E4M3 scales
// go into the pair values instead: an FP4 value times an E4M3 scale has at
// most 6 significant bits, exact in bf16; only its global scale multiplies
// the sums.
//
// U provides: kIsa (the kernel names' suffix); kBlockPanels, the panels a
// block of B spans; kRowStep, the rows of A one Multiply call takes;
// ThreadScope, held by each worker while it runs; SupportsK(k);
// RoundActivations(a, m, k), A as bf16 in U's layout; and
// Multiply(ctx, row, rows, segment, b, scales, acc), which adds
// scales[column] * (A[row, row + rows) · B over the segment) to acc, the
// block's [rows][kBlockPanels * 16] fp32 sums, from b, the segment's pairs as
// DequantizeSegment lays them out.
//
// Example (in kernels/cpu/avx512_bf16.cc):
//   #pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,...")
//   #include "kernels/cpu/bf16_pairs.h"
//   struct DotProducts { ... };
//   return bf16::MakeBf16PairKernels<DotProducts>(min_rounded_rows);
#ifndef NIBBLE_KERNELS_CPU_BF16_PAIRS_H_
#define NIBBLE_KERNELS_CPU_BF16_PAIRS_H_

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "base/thread_pool.h"
#include "format/dequant.h"
#include "format/weight_format.h"
#include "kernels/cpu/float_operands.h"
#include "kernels/cpu/format_kernel.h"
#include "kernels/cpu/panel_scales_avx512.h"
#include "kernels/cpu/segments.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"

namespace nibble::cpu::bf16 {

constexpr int64_t kWidth = PackedWeight::kPanelWidth;
// bf16 values in one 16-column row of pairs.
constexpr int64_t kPairRowValues = 2 * kWidth;
// How far ahead of the words it dequantizes DequantizeSegment prefetches
// codes: into the next segment of the panel, which the loop dequantizes while
// it multiplies this one.
constexpr int64_t kPrefetchWords = 32;
// Groups shorter than this put their scales into the pair values.
constexpr int64_t kMinSummedGroup = 32;

// Whether a format's groups are too short to scale their sums one by one, so
// that its scales go into the pair values; only E4M3 scales times FP4 codes
// are exact there.
constexpr bool ScalesInPairs(WeightFormat format) {
  return FixedGroupSize(format) != 0 &&
         FixedGroupSize(format) < kMinSummedGroup;
}
static_assert([] {
  for (WeightFormat format : kAllWeightFormats) {
    if (ScalesInPairs(format) &&
        (Traits(format).scale_type != ScaleType::kE4m3 ||
         !HasFp4Codes(format))) {
      return false;
    }
  }
  return true;
}());

// bf16 bits of what a 5-bit index stands for: the code's value, less 8 where
// the format subtracts 8 (bit 4 ignored), or q - zero in two's complement
// where each group has its own zero point.
inline __m512i Bf16Table(WeightFormat format) {
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

// The inputs every loop shares; `a` is A rounded to bf16 in the unit's layout.
struct Bf16Context {
  const PackedWeight& b;
  __m512i table;
  const uint16_t* a;
  int64_t m;
  int64_t k;
  int64_t n;
};

// A row of (k, k + 1) bf16 pairs, one column per 32-bit lane, times that
// column's scale. Exact when the products fit bf16 (ScalesInPairs): the fp32
// products then end in 16 zero bits, and their top halves are the result.
inline __m512i ScaleBf16Pairs(__m512i pairs, __m512 scale) {
  const __m512i high_half = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  const __m512 low =
      _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16)), scale);
  const __m512 high = _mm512_mul_ps(
      _mm512_castsi512_ps(_mm512_and_si512(pairs, high_half)), scale);
  return _mm512_or_si512(
      _mm512_srli_epi32(_mm512_castps_si512(low), 16),
      _mm512_and_si512(_mm512_castps_si512(high), high_half));
}

// Dequantizes words [first_word, end_word) of a segment of `segment_words`
// that starts at segment_word into `buffer`:
// [panel][k pair of the segment][16 columns x 2] bf16.
template <WeightFormat kFormat>
void DequantizeSegment(const Bf16Context& ctx, int64_t first_panel,
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
    uint16_t* panel_pairs = buffer + p * segment_words * kCodesPerWord * kWidth;
    for (int64_t word = first_word; word < end_word; ++word) {
      __m512 scale = _mm512_setzero_ps();
      if constexpr (ScalesInPairs(kFormat)) {
        scale = LoadPanelScales<kFormat>(ctx.b.panel_scales(first_panel + p) +
                                         word * kCodesPerWord /
                                             ctx.b.spec().group_size * kWidth);
      }
      __builtin_prefetch(codes + (word + kPrefetchWords) * kWidth);
      const __m512i words = _mm512_loadu_si512(codes + word * kWidth);
      uint16_t* rows = panel_pairs + (word - segment_word) * kCodesPerWord *
                                         kWidth;  // 4 pair rows of 32 bf16
      for (int pair = 0; pair < kCodesPerWord / 2; ++pair) {
        __m512i index = _mm512_srli_epi16(words, 4 * pair);
        if constexpr (HasZeros(kFormat)) {
          index = _mm512_sub_epi16(
              _mm512_and_si512(index, _mm512_set1_epi16(0xf)), zero);
        }
        __m512i values = _mm512_permutexvar_epi16(index, ctx.table);
        if constexpr (ScalesInPairs(kFormat)) {
          values = ScaleBf16Pairs(values, scale);
        }
        _mm512_storeu_si512(rows + pair * kPairRowValues, values);
      }
    }
  }
}

// Each thread takes whole blocks of kBlockPanels panels. For every segment of
// K it multiplies all rows of A, kRowStep at a time, by the buffered pairs,
// and after each step dequantizes a slice of the next segment into the other
// buffer, so that the dequantization interleaves with the multiplies.
template <class U, WeightFormat kFormat>
void RunBf16Pairs(const Bf16Context& ctx, float* c, ThreadPool& pool,
                  int threads) {
  constexpr int64_t kBlockPanels = U::kBlockPanels;
  constexpr int64_t kBlockWidth = kBlockPanels * kWidth;
  const int64_t panels = ctx.b.panels();
  const int64_t blocks = (panels + kBlockPanels - 1) / kBlockPanels;
  const int64_t steps = (ctx.m + U::kRowStep - 1) / U::kRowStep;
  // Scales in the pair values: segments need not stop at groups.
  const int64_t scale_rows =
      ScalesInPairs(kFormat) ? ctx.k : ctx.b.spec().group_size;
  const std::vector<Segment> segments = Segments(ctx.k, scale_rows);
  const int64_t buffer_values = kMaxSegment * kBlockWidth;
  pool.ParallelFor(
      blocks,
      [&](int64_t first_block, int64_t end_block) {
        [[maybe_unused]] typename U::ThreadScope scope;
        std::vector<uint16_t> buffers(2 * buffer_values);
        std::vector<float> acc(steps * U::kRowStep * kBlockWidth);
        alignas(64) float scales[kBlockWidth];
        for (int64_t block = first_block; block < end_block; ++block) {
          const int64_t first_panel = block * kBlockPanels;
          const int64_t block_panels =
              std::min(kBlockPanels, panels - first_panel);
          std::fill(acc.begin(), acc.end(), 0.0f);
          // A missing panel must multiply as zeros, not stale codes.
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
                if constexpr (ScalesInPairs(kFormat)) {
                  scale = _mm512_set1_ps(ctx.b.spec().global_scale);
                } else {
                  scale = LoadPanelScales<kFormat>(
                      ctx.b.panel_scales(first_panel + p) + group * kWidth);
                }
              }
              _mm512_store_ps(scales + p * kWidth, scale);
            }
            const uint16_t* pairs = buffers.data() + s % 2 * buffer_values;
            for (int64_t step = 0; step < steps; ++step) {
              const int64_t row = step * U::kRowStep;
              U::Multiply(ctx, row, std::min(U::kRowStep, ctx.m - row),
                          segments[s], pairs, scales,
                          acc.data() + row * kBlockWidth);
              dequantize(s + 1, step, steps);
            }
          }
          StoreBlockColumns(acc.data(), kBlockWidth, ctx.m, ctx.n,
                            first_panel * kWidth, c);
        }
      },
      threads);
}

// The double-buffered kernel of one format on unit U, named
// "double_buffered_<format>_<U::kIsa>", which rounds f32 and f16 A from
// `min_rounded_rows` rows.
template <class U>
class Bf16PairKernel final : public FormatKernel {
 public:
  Bf16PairKernel(WeightFormat format, int64_t min_rounded_rows)
      : FormatKernel(KernelVariant::kDoubleBuffered, format, U::kIsa),
        min_rounded_rows_(min_rounded_rows) {}

  bool Supports(const GemmProblem& problem) const override {
    return FormatKernel::Supports(problem) && U::SupportsK(problem.k) &&
           RoundingToBf16Allowed(problem, min_rounded_rows_);
  }
  bool RoundsActivationsToBf16(DType dtype) const override {
    return dtype != DType::kBF16;
  }

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override {
    WithFloatOperands(problem, operands, [&](const float* a, float* c) {
      const std::vector<uint16_t> a_bf16 =
          U::RoundActivations(a, problem.m, problem.k);
      const Bf16Context ctx{*operands.b, Bf16Table(format()), a_bf16.data(),
                            problem.m,   problem.k,           problem.n};
      WithFormatConstant(format(), [&](auto format_tag) {
        RunBf16Pairs<U, decltype(format_tag)::value>(ctx, c, pool,
                                                     problem.threads);
      });
    });
    return absl::OkStatus();
  }

 private:
  int64_t min_rounded_rows_;
};

// The double-buffered kernel of every format on unit U.
template <class U>
std::vector<std::unique_ptr<GemmKernel>> MakeBf16PairKernels(
    int64_t min_rounded_rows) {
  std::vector<std::unique_ptr<GemmKernel>> kernels;
  for (WeightFormat format : kAllWeightFormats) {
    kernels.push_back(
        std::make_unique<Bf16PairKernel<U>>(format, min_rounded_rows));
  }
  return kernels;
}

}  // namespace nibble::cpu::bf16

#endif  // NIBBLE_KERNELS_CPU_BF16_PAIRS_H_
