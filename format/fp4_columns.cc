#include "format/fp4_columns.h"

#include <emmintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "absl/strings/string_view.h"
#include "base/bulk_allocator.h"
#include "base/transpose4x4.h"

namespace nibble {
namespace {

// Rows of FP4 codes [N, K/2] bytes, two per byte with the lower nibble first
// along K, as qweight [K/8, N]: the 4 bytes holding rows 8i..8i+7 of column n
// are, read as a little-endian word, exactly word [i, n], so this is a
// transpose of 32-bit words. It goes by tiles of 16 x 16 words, each source
// and destination line read or written whole at once (rows K/2 bytes apart
// share cache sets, so lines kept open across a tile's rows would evict each
// other), 4 x 4 words at a time in SSE2 registers (every x86-64 CPU has
// them). Word runs shorter than 4 (K not a multiple of 32, as a group of 16
// allows) go one word at a time, so that no read passes a row's end.
std::vector<uint32_t> TransposeFp4Codes(const uint8_t* codes, int64_t k,
                                        int64_t n) {
  const int64_t words_per_row = k / kCodesPerWord;
  const int64_t row_bytes = k / 2;
  std::vector<uint32_t> qweight;
  ReserveBulk(qweight, words_per_row * n);
  qweight.resize(words_per_row * n);
  constexpr int64_t kTile = 16;
  alignas(64) uint32_t tile[kTile][kTile];
  for (int64_t first_col = 0; first_col < n; first_col += kTile) {
    const int64_t cols = std::min(kTile, n - first_col);
    for (int64_t first_word = 0; first_word < words_per_row;
         first_word += kTile) {
      const int64_t words = std::min(kTile, words_per_row - first_word);
      // The 16 rows are 16 streams, more than the hardware follows well.
      for (int64_t c = 0; c < cols; ++c) {
        __builtin_prefetch(codes + (first_col + c) * row_bytes +
                           4 * (first_word + 4 * kTile));
      }
      const int64_t vector_cols = cols / 4 * 4;
      const int64_t vector_words = words / 4 * 4;
      for (int64_t c = 0; c < vector_cols; c += 4) {
        for (int64_t w = 0; w < vector_words; w += 4) {
          __m128i columns[4];
          LoadTransposedWords4x4(
              codes + (first_col + c) * row_bytes + 4 * (first_word + w),
              row_bytes, columns);
          for (int i = 0; i < 4; ++i) {
            _mm_store_si128(reinterpret_cast<__m128i*>(&tile[w + i][c]),
                            columns[i]);
          }
        }
      }
      // The words left, one at a time.
      for (int64_t c = 0; c < cols; ++c) {
        for (int64_t w = c < vector_cols ? vector_words : 0; w < words; ++w) {
          std::memcpy(
              &tile[w][c],
              codes + (first_col + c) * row_bytes + 4 * (first_word + w), 4);
        }
      }
      for (int64_t w = 0; w < words; ++w) {
        uint32_t* to = &qweight[(first_word + w) * n + first_col];
        // A constant size compiles to vector moves; a variable one would be
        // a `rep movs`, slow to start for 64 bytes.
        if (cols == kTile) {
          std::memcpy(to, tile[w], sizeof(tile[w]));
        } else {
          std::memcpy(to, tile[w], cols * sizeof(uint32_t));
        }
      }
    }
  }
  return qweight;
}

// Bytes [N, groups] as 16-bit slots [groups, N], the byte in the low half.
// 8 x 8 bytes at a time in SSE2 registers, by blocks of 32 columns so that
// each row of slots written is a cache line.
void TransposeBytesToSlots(const uint8_t* codes, int64_t groups, int64_t n,
                           uint16_t* slots) {
  constexpr int64_t kBlock = 32;
  const __m128i zero = _mm_setzero_si128();
  for (int64_t first = 0; first < n; first += kBlock) {
    const int64_t last = std::min(n, first + kBlock);
    int64_t group = 0;
    for (; group + 8 <= groups; group += 8) {
      int64_t col = first;
      for (; col + 8 <= last; col += 8) {
        __m128i rows[8];
        for (int r = 0; r < 8; ++r) {
          rows[r] = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(
              codes + (col + r) * groups + group));
        }
        // Bytes of rows 2i and 2i + 1 side by side, then 4 and 8 rows: each
        // 8-byte half of `by_group` is one group's 8 columns.
        __m128i pairs[4];
        for (int i = 0; i < 4; ++i) {
          pairs[i] = _mm_unpacklo_epi8(rows[2 * i], rows[2 * i + 1]);
        }
        const __m128i quads[4] = {_mm_unpacklo_epi16(pairs[0], pairs[1]),
                                  _mm_unpackhi_epi16(pairs[0], pairs[1]),
                                  _mm_unpacklo_epi16(pairs[2], pairs[3]),
                                  _mm_unpackhi_epi16(pairs[2], pairs[3])};
        const __m128i by_group[4] = {_mm_unpacklo_epi32(quads[0], quads[2]),
                                     _mm_unpackhi_epi32(quads[0], quads[2]),
                                     _mm_unpacklo_epi32(quads[1], quads[3]),
                                     _mm_unpackhi_epi32(quads[1], quads[3])};
        for (int i = 0; i < 4; ++i) {
          _mm_storeu_si128(
              reinterpret_cast<__m128i*>(slots + (group + 2 * i) * n + col),
              _mm_unpacklo_epi8(by_group[i], zero));
          _mm_storeu_si128(
              reinterpret_cast<__m128i*>(slots + (group + 2 * i + 1) * n + col),
              _mm_unpackhi_epi8(by_group[i], zero));
        }
      }
      for (; col < last; ++col) {
        for (int64_t g = group; g < group + 8; ++g) {
          slots[g * n + col] = codes[col * groups + g];
        }
      }
    }
    for (; group < groups; ++group) {
      for (int64_t col = first; col < last; ++col) {
        slots[group * n + col] = codes[col * groups + group];
      }
    }
  }
}

}  // namespace

std::vector<uint16_t> ScaleSlotsFromColumns(const uint8_t* scale_codes,
                                            int64_t groups, int64_t n) {
  std::vector<uint16_t> slots(groups * n);
  TransposeBytesToSlots(scale_codes, groups, n, slots.data());
  return slots;
}

WeightBytes Fp4Columns::bytes() const {
  WeightBytes bytes;
  bytes.spec = spec;
  bytes.layout = CodeLayout::kColumns;
  bytes.qweight =
      absl::string_view(reinterpret_cast<const char*>(codes), code_bytes());
  bytes.scales = absl::string_view(reinterpret_cast<const char*>(scale_codes),
                                   scale_code_bytes());
  return bytes;
}

QuantizedWeight CanonicalFromColumns(const Fp4Columns& columns) {
  QuantizedWeight weight;
  weight.spec = columns.spec;
  weight.scales = ScaleSlotsFromColumns(columns.scale_codes,
                                        columns.spec.groups(), columns.spec.n);
  weight.qweight =
      TransposeFp4Codes(columns.codes, columns.spec.k, columns.spec.n);
  return weight;
}

}  // namespace nibble
