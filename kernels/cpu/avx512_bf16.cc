// The double-buffered kernels for AVX-512 BF16 without AMX (AMD Zen 4, Intel
// Cooper Lake): vdpbf16ps adds the products of 16 (k, k + 1) bf16 pairs into
// 16 fp32 lanes, two multiply-adds per lane where an fp32 FMA does one.
//
// The loop, the dequantization into bf16 pairs and the precision contract are
// kernels/cpu/bf16_pairs.h's. Here A is rounded to bf16 row by row; a
// microkernel keeps 8 rows x 48 columns of a segment's sums in 24 registers,
// broadcasting one (k, k + 1) pair of A per row against one pair row of each
// of 3 panels.
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

}  // namespace

std::vector<std::unique_ptr<GemmKernel>> MakeAvx512Bf16Kernels() {
  return bf16::MakeBf16PairKernels<DotProducts>();
}

}  // namespace nibble::cpu

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
