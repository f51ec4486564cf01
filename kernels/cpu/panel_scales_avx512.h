// One group's scales of a panel's 16 columns as fp32 lanes, read from the
// packed layout (bf16 or fp16 bits, PackedScalesAreBf16), for the AVX-512
// kernels that scale whole groups of sums. Include it only after a
// `#pragma GCC target` that enables AVX-512 F and F16C, as
// kernels/cpu/bf16_pairs.h and kernels/cpu/avx512_vnni.cc do.
//
// Example:
//   __m512 scale = LoadPanelScales<kFormat>(
//       weight.panel_scales(panel) + group * PackedWeight::kPanelWidth);
#ifndef NIBBLE_KERNELS_CPU_PANEL_SCALES_AVX512_H_
#define NIBBLE_KERNELS_CPU_PANEL_SCALES_AVX512_H_

#include <immintrin.h>

#include <cstdint>

#include "format/weight_format.h"
#include "kernels/packed_weight.h"

namespace nibble::cpu {

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

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_PANEL_SCALES_AVX512_H_
