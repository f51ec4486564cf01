// The vector kernels for AVX2 with FMA and F16C: two ymm registers hold a
// 16-column panel row. vpermps on ymm indexes only 8 entries, so a lookup
// permutes both halves of the 16-entry table and blends on bit 3 of the code.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
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

// Everything below, the shared loops of simd_gemm.h included, is built for
// AVX2; the headers above keep their default target.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
// clang ignores #pragma GCC target; this is its equivalent.
#ifdef __clang__
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), \
                             apply_to = function)
#endif

namespace nibble::cpu {
namespace {

struct Avx2 {
  using F = __m256;
  using I = __m256i;
  static constexpr int kLanes = 8;

  static F Zero() { return _mm256_setzero_ps(); }
  static F Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
  static void StoreFirst(float* p, F v, int count) {
    const __m256i mask = _mm256_cmpgt_epi32(
        _mm256_set1_epi32(count), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(p, mask, v);
  }
  static F Broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Fms(F a, F b, F c) { return _mm256_fmsub_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Set1(float x) { return _mm256_set1_ps(x); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static F Fnma(F a, F b, F c) { return _mm256_fnmadd_ps(a, b, c); }
  static float ReduceAdd(F v) {
    const __m128 half =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 pairs = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)));
  }

  static I LoadWords(const uint32_t* p) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  }
  template <int kBits>
  static I ShiftRight(I words) {
    return _mm256_srli_epi32(words, kBits);
  }
  struct Table {
    F low;   // codes 0..7
    F high;  // codes 8..15
  };
  static Table MakeTable(const float* values) {
    return {_mm256_loadu_ps(values), _mm256_loadu_ps(values + 8)};
  }
  static F Lookup(const Table& table, I codes) {
    const F low = _mm256_permutevar8x32_ps(table.low, codes);
    const F high = _mm256_permutevar8x32_ps(table.high, codes);
    // blendv selects on the sign bit: move bit 3 of the code there.
    return _mm256_blendv_ps(low, high,
                            _mm256_castsi256_ps(_mm256_slli_epi32(codes, 28)));
  }
  static F LoadHalves(const uint16_t* p) {
    return _mm256_cvtph_ps(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadBf16(const uint16_t* p) {
    const __m256i widened = _mm256_cvtepu16_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(widened, 16));
  }
  static F LoadBytes(const uint8_t* p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }

  // 16 registers: a 2-row by 1-panel fused tile, a 6 x 16 microkernel.
  static constexpr int kFusedMaxRows = 2;
  static constexpr int FusedPanels(int) { return 1; }
  static constexpr int kBufferedRows = 6;
  static constexpr int kBufferedPanels = 1;
};

}  // namespace
}  // namespace nibble::cpu

#include "kernels/cpu/simd_gemm.h"

namespace nibble::cpu {

std::vector<std::unique_ptr<GemmKernel>> MakeAvx2Kernels() {
  return simd::MakeSimdKernels<Avx2>("avx2");
}

}  // namespace nibble::cpu

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
