// The vector kernels for AVX-512: one zmm register holds a 16-column panel
// row, and a single vpermps looks a code up in the 16-entry value table.
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
// AVX-512; the headers above keep their default target.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
// clang ignores #pragma GCC target; this is its equivalent.
#ifdef __clang__
#pragma clang attribute push(                                               \
    __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c"))), \
    apply_to = function)
#endif
// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector as the
// masked-off source and warn about it when inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace nibble::cpu {
namespace {

struct Avx512 {
  using F = __m512;
  using I = __m512i;
  static constexpr int kLanes = 16;

  static F Zero() { return _mm512_setzero_ps(); }
  static F Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
  static void StoreFirst(float* p, F v, int count) {
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << count) - 1), v);
  }
  static F Broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Fms(F a, F b, F c) { return _mm512_fmsub_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Set1(float x) { return _mm512_set1_ps(x); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static F Fnma(F a, F b, F c) { return _mm512_fnmadd_ps(a, b, c); }
  static float ReduceAdd(F v) { return _mm512_reduce_add_ps(v); }

  static I LoadWords(const uint32_t* p) { return _mm512_loadu_si512(p); }
  template <int kBits>
  static I ShiftRight(I words) {
    return _mm512_srli_epi32(words, kBits);
  }
  struct Table {
    F values;
  };
  static Table MakeTable(const float* values) {
    return {_mm512_loadu_ps(values)};
  }
  // vpermps reads only the low 4 bits of each index.
  static F Lookup(const Table& table, I codes) {
    return _mm512_permutexvar_ps(codes, table.values);
  }
  static F LoadHalves(const uint16_t* p) {
    return _mm512_cvtph_ps(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadBf16(const uint16_t* p) {
    const __m512i widened = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(widened, 16));
  }
  static F LoadBytes(const uint8_t* p) {
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }

  // Fused: accumulators and group sums for rows x panels fit the 32
  // registers up to 2 x 4 and 4 x 2.
  static constexpr int kFusedMaxRows = 4;
  static constexpr int FusedPanels(int rows) { return rows <= 2 ? 4 : 2; }
  // Double-buffered microkernel: 8 rows x 48 columns, 24 accumulators.
  static constexpr int kBufferedRows = 8;
  static constexpr int kBufferedPanels = 3;
};

}  // namespace
}  // namespace nibble::cpu

#include "kernels/cpu/simd_gemm.h"

namespace nibble::cpu {

std::vector<std::unique_ptr<GemmKernel>> MakeAvx512Kernels() {
  return simd::MakeSimdKernels<Avx512>("avx512");
}

}  // namespace nibble::cpu

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
