// A transpose of 4 x 4 32-bit words in SSE2 registers (every x86-64 CPU has
// them), the step that moves codes between the column layout of FP4
// checkpoints and the row-major layouts of nibble (fp4_columns.cc,
// packed_weight.cc).
//
// Example:
//   __m128i rows[4] = ...;  // rows[r] holds words 0..3 of row r
//   __m128i columns[4];
//   nibble::TransposeWords4x4(rows, columns);  // columns[w]: word w of each
//   // The same, the rows loaded from `bytes`, `row_bytes` apart:
//   nibble::LoadTransposedWords4x4(bytes, row_bytes, columns);
#ifndef NIBBLE_BASE_TRANSPOSE4X4_H_
#define NIBBLE_BASE_TRANSPOSE4X4_H_

#include <emmintrin.h>

#include <cstdint>

namespace nibble {

inline void TransposeWords4x4(const __m128i rows[4], __m128i columns[4]) {
  const __m128i low01 = _mm_unpacklo_epi32(rows[0], rows[1]);
  const __m128i low23 = _mm_unpacklo_epi32(rows[2], rows[3]);
  const __m128i high01 = _mm_unpackhi_epi32(rows[0], rows[1]);
  const __m128i high23 = _mm_unpackhi_epi32(rows[2], rows[3]);
  columns[0] = _mm_unpacklo_epi64(low01, low23);
  columns[1] = _mm_unpackhi_epi64(low01, low23);
  columns[2] = _mm_unpacklo_epi64(high01, high23);
  columns[3] = _mm_unpackhi_epi64(high01, high23);
}

// Loads four words from each of four rows, `row_stride` bytes apart from
// `first` (unaligned), and transposes them: columns[w] holds word w of each.
inline void LoadTransposedWords4x4(const uint8_t* first, int64_t row_stride,
                                   __m128i columns[4]) {
  __m128i rows[4];
  for (int r = 0; r < 4; ++r) {
    rows[r] = _mm_loadu_si128(
        reinterpret_cast<const __m128i*>(first + r * row_stride));
  }
  TransposeWords4x4(rows, columns);
}

}  // namespace nibble

#endif  // NIBBLE_BASE_TRANSPOSE4X4_H_
