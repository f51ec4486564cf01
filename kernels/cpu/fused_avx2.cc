#include "kernels/cpu/fused_avx2.h"

#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/float_operands.h"
#include "kernels/dequant.h"

#define NIBBLE_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace nibble::cpu {
namespace {

constexpr int64_t kWidth = PackedWeight::kPanelWidth;
static_assert(kWidth == 16, "one panel is two 8-lane vectors");
constexpr int kMaxRows = 4;

// Turns the nibble at bits 0..3 of every 32-bit lane into fp16 bits in the
// lane's low half: the FP4 shift-and-rebias (value * 2^-14) or the INT4 magic
// number (1024 + q).
template <WeightFormat kFormat>
NIBBLE_AVX2 inline __m256i NibblesToHalves(__m256i words) {
  if constexpr (kFormat == WeightFormat::kFp4) {
    const __m256i sign = _mm256_and_si256(_mm256_slli_epi32(words, 12),
                                          _mm256_set1_epi32(0x8000));
    const __m256i magnitude = _mm256_and_si256(_mm256_slli_epi32(words, 9),
                                               _mm256_set1_epi32(0x0e00));
    return _mm256_or_si256(sign, magnitude);
  } else {
    return _mm256_or_si256(_mm256_and_si256(words, _mm256_set1_epi32(0xf)),
                           _mm256_set1_epi32(kInt4MagicHalf));
  }
}

// C[0..rows) x panel += A[0..rows) · dequant(panel), rows <= kMaxRows. `c`
// points at the panel's first column; `width` columns of it are written.
template <WeightFormat kFormat, int kRows>
NIBBLE_AVX2 void MultiplyPanel(const PackedWeight& b, int64_t panel,
                               const float* a, int64_t k, float* c, int64_t n,
                               int64_t width) {
  const uint32_t* codes = b.panel_codes(panel);
  const uint16_t* scales = b.panel_scales(panel);
  const uint8_t* zeros = b.panel_zeros(panel);
  const int64_t group_size = b.spec().group_size;
  const int64_t words_per_group = group_size / kCodesPerWord;
  const __m256 rebias =
      _mm256_set1_ps(kFormat == WeightFormat::kFp4 ? kFp4Rebias : 1.0f);

  __m256 out[kRows][2];
  for (int r = 0; r < kRows; ++r) out[r][0] = out[r][1] = _mm256_setzero_ps();

  for (int64_t group = 0; group < b.spec().groups(); ++group) {
    // INT4: what to subtract from 1024 + q to get q - zero.
    __m256 offset[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    if constexpr (kFormat == WeightFormat::kU4b8) {
      offset[0] = offset[1] = _mm256_set1_ps(1024.0f + 8.0f);
    } else if constexpr (kFormat == WeightFormat::kU4) {
      const __m128i z = _mm_loadu_si128(
          reinterpret_cast<const __m128i*>(zeros + group * kWidth));
      const __m256 base = _mm256_set1_ps(1024.0f);
      offset[0] =
          _mm256_add_ps(base, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(z)));
      offset[1] = _mm256_add_ps(
          base, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(z, 8))));
    }
    __m256 acc[kRows][2];
    for (int r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();

    const int64_t first_word = group * words_per_group;
    for (int64_t word = first_word; word < first_word + words_per_group;
         ++word) {
      __m256i lo = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(codes + word * kWidth));
      __m256i hi = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(codes + word * kWidth + 8));
      const float* a_block = a + word * kCodesPerWord;
      for (int j = 0; j < kCodesPerWord; ++j) {
        // 16 fp16 values in column order: packus interleaves 128-bit lanes,
        // the permute puts them back.
        const __m256i halves = _mm256_permute4x64_epi64(
            _mm256_packus_epi32(NibblesToHalves<kFormat>(lo),
                                NibblesToHalves<kFormat>(hi)),
            0xd8);
        __m256 w0 = _mm256_cvtph_ps(_mm256_castsi256_si128(halves));
        __m256 w1 = _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1));
        if constexpr (kFormat != WeightFormat::kFp4) {
          w0 = _mm256_sub_ps(w0, offset[0]);
          w1 = _mm256_sub_ps(w1, offset[1]);
        }
        for (int r = 0; r < kRows; ++r) {
          const __m256 x = _mm256_broadcast_ss(a_block + r * k + j);
          acc[r][0] = _mm256_fmadd_ps(x, w0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(x, w1, acc[r][1]);
        }
        lo = _mm256_srli_epi32(lo, 4);
        hi = _mm256_srli_epi32(hi, 4);
      }
    }
    const __m256i s = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(scales + group * kWidth));
    const __m256 s0 =
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(s)), rebias);
    const __m256 s1 =
        _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(s, 1)), rebias);
    for (int r = 0; r < kRows; ++r) {
      out[r][0] = _mm256_fmadd_ps(acc[r][0], s0, out[r][0]);
      out[r][1] = _mm256_fmadd_ps(acc[r][1], s1, out[r][1]);
    }
  }

  for (int r = 0; r < kRows; ++r) {
    float* c_row = c + r * n;
    if (width == kWidth) {
      _mm256_storeu_ps(c_row, out[r][0]);
      _mm256_storeu_ps(c_row + 8, out[r][1]);
    } else {
      alignas(32) float tail[kWidth];
      _mm256_store_ps(tail, out[r][0]);
      _mm256_store_ps(tail + 8, out[r][1]);
      std::copy(tail, tail + width, c_row);
    }
  }
}

template <WeightFormat kFormat>
void MultiplyPanels(const PackedWeight& b, int64_t first_panel,
                    int64_t end_panel, const float* a, int64_t m, float* c) {
  const int64_t k = b.spec().k;
  const int64_t n = b.spec().n;
  for (int64_t panel = first_panel; panel < end_panel; ++panel) {
    const int64_t width = std::min(kWidth, n - panel * kWidth);
    float* c_panel = c + panel * kWidth;
    int64_t row = 0;
    for (; row + kMaxRows <= m; row += kMaxRows) {
      MultiplyPanel<kFormat, kMaxRows>(b, panel, a + row * k, k,
                                       c_panel + row * n, n, width);
    }
    switch (m - row) {
      case 3:
        MultiplyPanel<kFormat, 3>(b, panel, a + row * k, k, c_panel + row * n,
                                  n, width);
        break;
      case 2:
        MultiplyPanel<kFormat, 2>(b, panel, a + row * k, k, c_panel + row * n,
                                  n, width);
        break;
      case 1:
        MultiplyPanel<kFormat, 1>(b, panel, a + row * k, k, c_panel + row * n,
                                  n, width);
        break;
    }
  }
}

}  // namespace

absl::Status FusedAvx2Kernel::Run(const GemmProblem& problem,
                                  const GemmOperands& operands,
                                  ThreadPool& pool) const {
  const PackedWeight& b = *operands.b;
  const auto multiply = [&](auto format_tag) {
    constexpr WeightFormat kFormat = decltype(format_tag)::value;
    WithFloatOperands(problem, operands, [&](const float* a, float* c) {
      pool.ParallelFor(
          b.panels(),
          [&](int64_t begin, int64_t end) {
            MultiplyPanels<kFormat>(b, begin, end, a, problem.m, c);
          },
          problem.threads);
    });
  };
  switch (format()) {
    case WeightFormat::kFp4:
      multiply(std::integral_constant<WeightFormat, WeightFormat::kFp4>());
      break;
    case WeightFormat::kU4b8:
      multiply(std::integral_constant<WeightFormat, WeightFormat::kU4b8>());
      break;
    case WeightFormat::kU4:
      multiply(std::integral_constant<WeightFormat, WeightFormat::kU4>());
      break;
  }
  return absl::OkStatus();
}

}  // namespace nibble::cpu
