// The int8 kernels for AVX-512 VNNI (Intel Cascade Lake and later, AMD Zen 4):
// vpdpbusd adds the products of four unsigned bytes of B and four signed bytes
// of A into each of 16 int32 lanes, four multiply-adds per lane where an fp32
// FMA does one. They run only where a problem accepts
// ActivationPrecision::kInt8.
//
// Precision: A is quantized per row and per segment (segments.h: a group of
// B, or 512 rows of a larger one) to int8, q = round(a / s) with the fp32
// scale s = max |a| / 127. B stays exact: each code becomes a byte u with
// (u - offset) * factor its value (Int8CodesOf), so a segment's int32 sums
// Σ q·u, less offset · Σ q, times s, B's group scale and factor, add that
// segment's part of C. Where the offset is the same for every column (no
// zero points), the sums start at -offset · Σ q instead, one fp32 operation
// per 16 sums fewer. Only A's rounding errs: per element of C at most
// (max_k |A[i, k]| / 254) · Σ_k |B[k, j]|, plus fp32 accumulation.
//
// The codes need no buffer: a packed word's low nibbles are the codes of rows
// 0, 4, 1, 5 (PackedWeight::CodeShift), its high nibbles those of 2, 6, 3, 7,
// so one mask (and one shift) makes 16 lanes of four bytes each, and A is
// quantized with every 8 values in that order. A microkernel keeps 8 rows x
// 48 columns of int32 sums in 24 registers.
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "base/thread_pool.h"
#include "format/dequant.h"
#include "format/weight_format.h"
#include "kernels/cpu/float_operands.h"
#include "kernels/cpu/format_kernel.h"
#include "kernels/cpu/segments.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c")
// clang ignores #pragma GCC target; this is its equivalent.
#ifdef __clang__
#pragma clang attribute push(                                               \
    __attribute__((                                                         \
        target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,fma,f16c"))), \
    apply_to = function)
#endif
// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector as the
// masked-off source and warn about it when inlined (GCC bug 105593); here
// the lambdas make it the definite warning.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include "kernels/cpu/panel_scales_avx512.h"

namespace nibble::cpu {
namespace {

constexpr int64_t kWidth = PackedWeight::kPanelWidth;
constexpr int64_t kBlockPanels = 3;
constexpr int64_t kBlockWidth = kBlockPanels * kWidth;
constexpr int64_t kRowStep = 8;

// A format's codes as unsigned bytes: code q stands for
// (bytes[q] - offset) * factor, where a format with zero points takes each
// group's zero point as the offset (and bytes[q] = q).
struct Int8Codes {
  std::array<uint8_t, 16> bytes;
  int offset;
  float factor;
};

// The bytes of `format`'s codes; nullopt where some code's value is not an
// exact byte that way, so that the format gets no int8 kernel and its
// problems fall back to the others.
std::optional<Int8Codes> Int8CodesOf(WeightFormat format) {
  // FP4 E2M1 values times 2 are the integers -12..12.
  Int8Codes codes{.bytes = {},
                  .offset = HasFp4Codes(format) ? 12 : EffectiveZero(format, 0),
                  .factor = HasFp4Codes(format) ? 0.5f : 1.0f};
  for (int code = 0; code < 16; ++code) {
    const float value = HasFp4Codes(format)
                            ? Fp4CodeToFloat(static_cast<uint8_t>(code))
                            : static_cast<float>(code);
    const float byte = value / codes.factor + (HasFp4Codes(format) ? 12 : 0);
    if (byte < 0 || byte > 255 || byte != static_cast<int>(byte)) {
      return std::nullopt;
    }
    codes.bytes[code] = static_cast<uint8_t>(byte);
  }
  for (int code = 0; code < 16; ++code) {
    for (int zero = 0; zero < 16; ++zero) {
      const int offset = HasZeros(format) ? zero : codes.offset;
      const float want = HasFp4Codes(format)
                             ? Fp4CodeToFloat(static_cast<uint8_t>(code))
                             : Int4CodeMinusZero(static_cast<uint8_t>(code),
                                                 EffectiveZero(format, zero));
      if ((codes.bytes[code] - offset) * codes.factor != want) {
        return std::nullopt;
      }
    }
  }
  return codes;
}

// A quantized (see the precision contract above): codes [m][k] with each 8
// in the order 0, 4, 1, 5, 2, 6, 3, 7; scales and code sums [m][segments].
struct Int8Activations {
  std::vector<int8_t> codes;
  std::vector<float> scales;
  std::vector<float> sums;  // exact: |Σ q| <= 512 * 127 < 2^24
};

Int8Activations QuantizeActivations(const float* a, int64_t m, int64_t k,
                                    const std::vector<Segment>& segments,
                                    ThreadPool& pool, int threads) {
  const int64_t count = segments.size();
  Int8Activations q{.codes = std::vector<int8_t>(m * k),
                    .scales = std::vector<float>(m * count),
                    .sums = std::vector<float>(m * count)};
  const __m128i order =
      _mm_setr_epi8(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15);
  pool.ParallelFor(
      m,
      [&](int64_t first_row, int64_t end_row) {
        for (int64_t row = first_row; row < end_row; ++row) {
          for (int64_t s = 0; s < count; ++s) {
            const float* values = a + row * k + segments[s].k;
            const int64_t len = segments[s].len;  // a multiple of 8
            const auto mask = [&](int64_t i) {
              return static_cast<__mmask16>(len - i >= 16 ? 0xffff : 0xff);
            };
            __m512 max = _mm512_setzero_ps();
            for (int64_t i = 0; i < len; i += 16) {
              max = _mm512_max_ps(max, _mm512_abs_ps(_mm512_maskz_loadu_ps(
                                           mask(i), values + i)));
            }
            const float largest = _mm512_reduce_max_ps(max);
            const __m512 inverse =
                _mm512_set1_ps(largest > 0 ? 127.0f / largest : 0.0f);
            __m512i sum = _mm512_setzero_si512();
            int8_t* codes = q.codes.data() + row * k + segments[s].k;
            for (int64_t i = 0; i < len; i += 16) {
              const __m512i rounded = _mm512_cvtps_epi32(_mm512_mul_ps(
                  _mm512_maskz_loadu_ps(mask(i), values + i), inverse));
              sum = _mm512_add_epi32(sum, rounded);
              _mm_mask_storeu_epi8(
                  codes + i, mask(i),
                  _mm_shuffle_epi8(_mm512_cvtsepi32_epi8(rounded), order));
            }
            q.scales[row * count + s] = largest / 127.0f;
            q.sums[row * count + s] =
                static_cast<float>(_mm512_reduce_add_epi32(sum));
          }
        }
      },
      threads);
  return q;
}

// What one microkernel call reads of a segment: `words` packed words of each
// of the block's panels (missing panels read zeros), and per block column
// B's scale (group scale, global scale and factor) and, with zero points,
// the offset.
struct SegmentOperands {
  const uint32_t* codes[kBlockPanels];
  int64_t words;
  __m512i table;  // Int8Codes::bytes in each 128-bit lane
  int offset;     // every column's, without zero points
  const float* offsets;
  const float* scales;
};

// acc[kRows][kBlockWidth] += the segment's part of C for rows of A whose
// codes start at `a` (rows `k` apart), with their scales and code sums at
// `a_scales` and `a_sums` (rows `stride` apart). Not inlined, so that GCC
// keeps the sums in registers (as in avx512_bf16.cc).
// The codes' bytes: through the format's table where it has one.
template <bool kLookup>
[[gnu::always_inline]] inline __m512i Lookup(__m512i table, __m512i codes) {
  if constexpr (kLookup) return _mm512_shuffle_epi8(table, codes);
  return codes;
}

// sum += the four products of u's unsigned bytes and s's signed bytes in each
// 32-bit lane. In assembly: with the intrinsic, GCC 12 copies every sum to
// another register and back, and spills some, each time around the loop.
[[gnu::always_inline]] inline void DotProductBytes(__m512i& sum, __m512i u,
                                                   __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(sum) : "v"(u), "v"(s));
}

// sums[r][p] += four bytes of row r of A (at a + r * k) times each lane's
// four bytes of b[p].
template <int kRows>
[[gnu::always_inline]] inline void MultiplyQuads(
    const int8_t* a, int64_t k, const __m512i (&b)[kBlockPanels],
    __m512i (&sums)[kRows][kBlockPanels]) {
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    int32_t quad;
    std::memcpy(&quad, a + r * k, sizeof(quad));
    const __m512i x = _mm512_set1_epi32(quad);
#pragma GCC unroll 8
    for (int p = 0; p < kBlockPanels; ++p) {
      DotProductBytes(sums[r][p], b[p], x);
    }
  }
}

template <bool kLookup, bool kZeroPoints, int kRows>
[[gnu::noinline]] void MultiplyRows(const SegmentOperands& segment,
                                    const int8_t* a, int64_t k,
                                    const float* a_scales, const float* a_sums,
                                    int64_t stride, float* acc) {
  const __m512i nibbles = _mm512_set1_epi8(0x0f);
  __m512i sums[kRows][kBlockPanels];
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m512i start =
        kZeroPoints
            ? _mm512_setzero_si512()
            : _mm512_set1_epi32(-segment.offset *
                                static_cast<int32_t>(a_sums[r * stride]));
    for (__m512i& sum : sums[r]) sum = start;
  }
  // A segment has at least one word; a do-while keeps GCC from spilling the
  // sums around a loop that might not run.
  int64_t word = 0;
  do {
    // The low nibbles (rows 0, 4, 1, 5 of the word), then the high ones.
    const int8_t* a_word = a + word * kCodesPerWord;
    __m512i words[kBlockPanels];
    __m512i b[kBlockPanels];
#pragma GCC unroll 8
    for (int p = 0; p < kBlockPanels; ++p) {
      words[p] = _mm512_loadu_si512(segment.codes[p] + word * kWidth);
      b[p] =
          Lookup<kLookup>(segment.table, _mm512_and_si512(words[p], nibbles));
    }
    MultiplyQuads<kRows>(a_word, k, b, sums);
#pragma GCC unroll 8
    for (int p = 0; p < kBlockPanels; ++p) {
      b[p] = Lookup<kLookup>(
          segment.table,
          _mm512_and_si512(_mm512_srli_epi32(words[p], 4), nibbles));
    }
    MultiplyQuads<kRows>(a_word + 4, k, b, sums);
  } while (++word < segment.words);
#pragma GCC unroll 8
  for (int r = 0; r < kRows; ++r) {
    const __m512 a_scale = _mm512_set1_ps(a_scales[r * stride]);
#pragma GCC unroll 8
    for (int p = 0; p < kBlockPanels; ++p) {
      __m512 products = _mm512_cvtepi32_ps(sums[r][p]);
      if constexpr (kZeroPoints) {
        products =
            _mm512_fnmadd_ps(_mm512_load_ps(segment.offsets + p * kWidth),
                             _mm512_set1_ps(a_sums[r * stride]), products);
      }
      float* out = acc + r * kBlockWidth + p * kWidth;
      _mm512_storeu_ps(
          out, _mm512_fmadd_ps(
                   products,
                   _mm512_mul_ps(_mm512_load_ps(segment.scales + p * kWidth),
                                 a_scale),
                   _mm512_loadu_ps(out)));
    }
  }
}

template <bool kLookup, bool kZeroPoints, int kRows = kRowStep>
void Multiply(int64_t rows, const SegmentOperands& segment, const int8_t* a,
              int64_t k, const float* a_scales, const float* a_sums,
              int64_t stride, float* acc) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      MultiplyRows<kLookup, kZeroPoints, kRows>(segment, a, k, a_scales, a_sums,
                                                stride, acc);
    } else {
      Multiply<kLookup, kZeroPoints, kRows - 1>(rows, segment, a, k, a_scales,
                                                a_sums, stride, acc);
    }
  }
}

// Each thread takes whole blocks of kBlockPanels panels; for every segment of
// K all rows of A pass over the block's codes, kRowStep at a time.
template <WeightFormat kFormat>
void RunInt8(const PackedWeight& b, const Int8Codes& int8_codes,
             const Int8Activations& a, const std::vector<Segment>& segments,
             int64_t m, float* c, ThreadPool& pool, int threads) {
  constexpr bool kLookup = HasFp4Codes(kFormat);
  const WeightSpec& spec = b.spec();
  const int64_t panels = b.panels();
  const int64_t blocks = (panels + kBlockPanels - 1) / kBlockPanels;
  const int64_t count = segments.size();
  const float b_factor = spec.global_scale * int8_codes.factor;
  // The 16 bytes in each 128-bit lane, for vpshufb.
  uint8_t lanes[64];
  for (int i = 0; i < 64; ++i) lanes[i] = int8_codes.bytes[i % 16];
  const __m512i table = _mm512_loadu_si512(lanes);
  pool.ParallelFor(
      blocks,
      [&](int64_t first_block, int64_t end_block) {
        std::vector<float> acc(m * kBlockWidth);
        // What a missing panel of the last block reads.
        const std::vector<uint32_t> zero_codes(
            kMaxSegment / kCodesPerWord * kWidth, 0);
        alignas(64) float offsets[kBlockWidth];
        alignas(64) float scales[kBlockWidth];
        for (int64_t block = first_block; block < end_block; ++block) {
          const int64_t first_panel = block * kBlockPanels;
          const int64_t block_panels =
              std::min(kBlockPanels, panels - first_panel);
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t s = 0; s < count; ++s) {
            const int64_t group = segments[s].k / spec.group_size;
            SegmentOperands operands{.codes = {},
                                     .words = segments[s].len / kCodesPerWord,
                                     .table = table,
                                     .offset = int8_codes.offset,
                                     .offsets = offsets,
                                     .scales = scales};
            for (int64_t p = 0; p < kBlockPanels; ++p) {
              __m512 offset = _mm512_setzero_ps();
              __m512 scale = _mm512_setzero_ps();  // a missing panel adds 0
              operands.codes[p] = zero_codes.data();
              if (p < block_panels) {
                const int64_t panel = first_panel + p;
                operands.codes[p] = b.panel_codes(panel) +
                                    segments[s].k / kCodesPerWord * kWidth;
                scale =
                    _mm512_mul_ps(LoadPanelScales<kFormat>(
                                      b.panel_scales(panel) + group * kWidth),
                                  _mm512_set1_ps(b_factor));
                if constexpr (HasZeros(kFormat)) {
                  offset = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                      _mm_loadu_si128(reinterpret_cast<const __m128i*>(
                          b.panel_zeros(panel) + group * kWidth))));
                }
              }
              _mm512_store_ps(offsets + p * kWidth, offset);
              _mm512_store_ps(scales + p * kWidth, scale);
            }
            // The next segment's codes, a segment's multiplies ahead of
            // their use (from DRAM: every weight is read once per call).
            if (s + 1 < count) {
              const int64_t next_word = segments[s + 1].k / kCodesPerWord;
              const int64_t next_words = segments[s + 1].len / kCodesPerWord;
              for (int64_t p = 0; p < block_panels; ++p) {
                const uint32_t* next =
                    b.panel_codes(first_panel + p) + next_word * kWidth;
                for (int64_t word = 0; word < next_words; ++word) {
                  __builtin_prefetch(next + word * kWidth);
                }
              }
            }
            for (int64_t row = 0; row < m; row += kRowStep) {
              Multiply<kLookup, HasZeros(kFormat)>(
                  std::min(kRowStep, m - row), operands,
                  a.codes.data() + row * spec.k + segments[s].k, spec.k,
                  a.scales.data() + row * count + s,
                  a.sums.data() + row * count + s, count,
                  acc.data() + row * kBlockWidth);
            }
          }
          StoreBlockColumns(acc.data(), kBlockWidth, m, spec.n,
                            first_panel * kWidth, c);
        }
      },
      threads);
}

class Int8Kernel final : public FormatKernel {
 public:
  Int8Kernel(WeightFormat format, const Int8Codes& codes)
      : FormatKernel(KernelVariant::kDoubleBuffered, format, "avx512_vnni",
                     ActivationPrecisionName(ActivationPrecision::kInt8)),
        codes_(codes) {}

  // Only problems that accept int8, so that callers who pick kernels
  // without the scheduler (benchmarks, tests) never quantize A unasked, and
  // of kMinConvertedRows rows or more.
  bool Supports(const GemmProblem& problem) const override {
    return FormatKernel::Supports(problem) &&
           problem.activation_precision == ActivationPrecision::kInt8 &&
           problem.m >= kMinConvertedRows;
  }
  bool QuantizesActivationsToInt8() const override { return true; }

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override {
    WithFloatOperands(problem, operands, [&](const float* a, float* c) {
      const std::vector<Segment> segments =
          Segments(problem.k, problem.group_size);
      const Int8Activations quantized = QuantizeActivations(
          a, problem.m, problem.k, segments, pool, problem.threads);
      WithFormatConstant(format(), [&](auto format_tag) {
        RunInt8<decltype(format_tag)::value>(*operands.b, codes_, quantized,
                                             segments, problem.m, c, pool,
                                             problem.threads);
      });
    });
    return absl::OkStatus();
  }

 private:
  Int8Codes codes_;
};

// Groups shorter than this stop the microkernel to scale its sums so often
// that int8 runs slower than the bf16 kernels (nvfp4's 16 rows: 0.8 x their
// speed on Zen 4, docs/performance.md); such formats get no int8 kernel.
constexpr int64_t kMinInt8Group = 32;

}  // namespace

std::vector<std::unique_ptr<GemmKernel>> MakeAvx512VnniKernels() {
  std::vector<std::unique_ptr<GemmKernel>> kernels;
  for (WeightFormat format : kAllWeightFormats) {
    if (FixedGroupSize(format) != 0 && FixedGroupSize(format) < kMinInt8Group) {
      continue;
    }
    if (const std::optional<Int8Codes> codes = Int8CodesOf(format)) {
      kernels.push_back(std::make_unique<Int8Kernel>(format, *codes));
    }
  }
  return kernels;
}

}  // namespace nibble::cpu

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
