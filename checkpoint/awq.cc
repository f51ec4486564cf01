#include "checkpoint/awq.h"

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/bulk_allocator.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/tensor_checks.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {
namespace {

// The inverse of kAwqNibbleColumn (AutoAWQ's AWQ_REVERSE_ORDER).
constexpr int kAwqNibbleOfColumn[8] = {0, 4, 1, 5, 2, 6, 3, 7};

constexpr bool IsAwqInverse() {
  for (int nibble = 0; nibble < 8; ++nibble) {
    if (kAwqNibbleOfColumn[kAwqNibbleColumn[nibble]] != nibble) return false;
  }
  return true;
}
static_assert(IsAwqInverse());

// The layer's tensors, their dtypes and shapes checked against each other.
absl::StatusOr<PackedTensors> FindAwqTensors(const SafetensorsFile& file,
                                             absl::string_view prefix) {
  absl::StatusOr<PackedTensors> tensors = FindPackedTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  const TensorInfo& qweight = *tensors->qweight;
  const TensorInfo& scales = *tensors->scales;
  if (absl::Status s = CheckPackedZeros(*tensors); !s.ok()) return s;
  const int64_t n = scales.shape[1];
  if (qweight.shape[1] != n / 8) {
    return absl::InvalidArgumentError(
        absl::StrCat(Described(qweight), " should be [", qweight.shape[0], ", ",
                     n / 8, "]: AWQ stores qweight [K, N/8] and ",
                     Described(scales), " has N=", n));
  }
  absl::StatusOr<WeightSpec> spec = GroupedSpec(*tensors, qweight.shape[0], n);
  if (!spec.ok()) return spec.status();
  tensors->spec = *spec;
  return tensors;
}

// The layer's weight without its codes: spec, scales and zero points.
absl::StatusOr<QuantizedWeight> AwqWithoutCodes(const SafetensorsFile& file,
                                                const PackedTensors& tensors) {
  const WeightSpec& spec = tensors.spec;
  QuantizedWeight weight;
  weight.spec = spec;
  absl::StatusOr<std::vector<uint16_t>> scales =
      ReadFp16Scales(file, *tensors.scales);
  if (!scales.ok()) return scales.status();
  weight.scales = *std::move(scales);
  const absl::Span<const uint8_t> qzeros = file.Data(*tensors.qzeros);
  weight.zeros.resize(spec.groups() * spec.n);
  for (int64_t group = 0; group < spec.groups(); ++group) {
    for (int64_t col = 0; col < spec.n; ++col) {
      weight.zeros[group * spec.n + col] =
          UnpackColumn(qzeros, group * (spec.n / 8), col, kAwqNibbleOfColumn);
    }
  }
  return weight;
}

// Swaps the nibbles of `a` at positions p with p & s set against those of
// `b` at p - s (s = 4, 2 or 1 nibbles): one step of a blockwise transpose.
template <int s>
void SwapNibbleBlocks(uint32_t& a, uint32_t& b) {
  constexpr uint32_t kLowBlocks = s == 4   ? 0x0000ffffu
                                  : s == 2 ? 0x00ff00ffu
                                           : 0x0f0f0f0fu;
  const uint32_t t = ((a >> (4 * s)) ^ b) & kLowBlocks;
  b ^= t;
  a ^= t << (4 * s);
}

// AWQ's qweight [K, N/8] as nibble's [K/8, N]. Eight AWQ words of rows
// 8i..8i+7 and columns 8c..8c+7 are an 8x8 matrix of nibbles (word j = row
// 8i + j, nibble p = column 8c + kAwqNibbleColumn[p]); transposed in three
// rounds of block swaps, word p becomes rows 8i..8i+7 of that column.
void RepackAwqCodes(const uint8_t* awq, int64_t k, int64_t n,
                    uint32_t* qweight) {
  const int64_t words_per_row = n / 8;
  for (int64_t i = 0; i < k / kCodesPerWord; ++i) {
    const uint8_t* rows = awq + i * kCodesPerWord * words_per_row * 4;
    uint32_t* out = qweight + i * n;
    for (int64_t c = 0; c < words_per_row; ++c) {
      uint32_t m[8];
      for (int j = 0; j < 8; ++j) {
        std::memcpy(&m[j], rows + (j * words_per_row + c) * 4, 4);
      }
      for (int j : {0, 1, 2, 3}) SwapNibbleBlocks<4>(m[j], m[j + 4]);
      for (int j : {0, 1, 4, 5}) SwapNibbleBlocks<2>(m[j], m[j + 2]);
      for (int j : {0, 2, 4, 6}) SwapNibbleBlocks<1>(m[j], m[j + 1]);
      for (int p = 0; p < 8; ++p) out[8 * c + kAwqNibbleColumn[p]] = m[p];
    }
  }
}

}  // namespace

absl::Status CheckAwqTensors(const SafetensorsFile& file,
                             absl::string_view prefix) {
  return FindAwqTensors(file, prefix).status();
}

void AwqFileWeight::CanonicalWordRows(int64_t first, int64_t count,
                                      uint32_t* out) const {
  // AWQ row r starts at byte r * (N / 8) * 4.
  RepackAwqCodes(qweight + first * kCodesPerWord * weight.spec.n / 2,
                 count * kCodesPerWord, weight.spec.n, out);
}

absl::StatusOr<AwqFileWeight> AwqWeightWithFileCodes(
    const SafetensorsFile& file, absl::string_view prefix) {
  absl::StatusOr<PackedTensors> tensors = FindAwqTensors(file, prefix);
  if (!tensors.ok()) return tensors.status();
  absl::StatusOr<QuantizedWeight> weight = AwqWithoutCodes(file, *tensors);
  if (!weight.ok()) return weight.status();
  return AwqFileWeight{*std::move(weight), file.Data(*tensors->qweight).data()};
}

absl::StatusOr<QuantizedWeight> ConvertAwqWeight(const SafetensorsFile& file,
                                                 absl::string_view prefix) {
  absl::StatusOr<AwqFileWeight> awq = AwqWeightWithFileCodes(file, prefix);
  if (!awq.ok()) return awq.status();
  QuantizedWeight& weight = awq->weight;
  const int64_t word_rows = weight.spec.k / kCodesPerWord;
  ReserveBulk(weight.qweight, word_rows * weight.spec.n);
  weight.qweight.resize(word_rows * weight.spec.n);
  awq->CanonicalWordRows(0, word_rows, weight.qweight.data());
  return std::move(weight);
}

}  // namespace nibble::checkpoint
