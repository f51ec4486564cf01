// Converts a 4-bit AWQ layer of a safetensors checkpoint, as AutoAWQ's GEMM
// kernels store it, into a kU4 nibble weight (format/weight_format.h) without
// changing a single dequantized value: the codes and zero points are
// repacked from AWQ's interleaved nibble order into nibble's layout.
//
// Every function takes a layer prefix such as "model.layers.0.mlp.up_proj"
// and reads PREFIX.qweight, PREFIX.qzeros and PREFIX.scales. Every dtype and
// shape is checked before any data is read; a mismatch is INVALID_ARGUMENT
// naming the tensor, its shape and the shape it should have, and so is a
// missing tensor.
//
// Example:
//   absl::StatusOr<QuantizedWeight> awq = ConvertAwqWeight(file, prefix);
//   if (!awq.ok()) return awq.status();
//   // Or a few rows at a time, from the file:
//   absl::StatusOr<AwqFileWeight> rows = AwqWeightWithFileCodes(file, prefix);
//   rows->CanonicalWordRows(/*first=*/0, /*count=*/8, buffer.data());
#ifndef NIBBLE_CHECKPOINT_AWQ_H_
#define NIBBLE_CHECKPOINT_AWQ_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "checkpoint/safetensors.h"
#include "format/weight_format.h"

namespace nibble::checkpoint {

// AWQ's nibble order within a packed word (AutoAWQ's AWQ_ORDER): nibble j
// (bits 4j..4j+3) of the word for columns 8c..8c+7 holds column
// 8c + kAwqNibbleColumn[j]. Its inverse, AWQ_REVERSE_ORDER
// = {0, 4, 1, 5, 2, 6, 3, 7}, gives the nibble that holds column 8c + j.
inline constexpr int kAwqNibbleColumn[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// A 4-bit AWQ layer as AutoAWQ's GEMM kernels store it:
//   PREFIX.qweight I32 [K, N/8]: row k, columns 8c..8c+7 in word [k, c],
//                  nibbles in kAwqNibbleColumn order;
//   PREFIX.qzeros  I32 [G, N/8]: the zero points (as they are, no offset),
//                  packed the same way;
//   PREFIX.scales  F16 [G, N].
// (U32 is accepted wherever I32 is.) The group size is K / G, and
// w = (q - z) * s: the result is kU4 with the codes repacked.
absl::StatusOr<QuantizedWeight> ConvertAwqWeight(const SafetensorsFile& file,
                                                 absl::string_view prefix);

// ConvertAwqWeight's checks of dtypes and shapes, which read no data.
absl::Status CheckAwqTensors(const SafetensorsFile& file,
                             absl::string_view prefix);

// An AWQ layer whose codes stay in the file, to be repacked a few rows at a
// time by whoever reads them, so that the whole canonical qweight is never
// held (packing straight into panels, PanelCodeWriter).
struct AwqFileWeight {
  // ConvertAwqWeight's weight but for its qweight, which is empty.
  QuantizedWeight weight;
  // The file's PREFIX.qweight, AWQ's [K, N/8].
  const uint8_t* qweight = nullptr;

  // Word rows [first, first + count) of ConvertAwqWeight's qweight (rows
  // 8 * first onward of B), [count][N] words, into `out`.
  void CanonicalWordRows(int64_t first, int64_t count, uint32_t* out) const;
};

// ConvertAwqWeight without repacking the codes: the same checks and errors.
absl::StatusOr<AwqFileWeight> AwqWeightWithFileCodes(
    const SafetensorsFile& file, absl::string_view prefix);

}  // namespace nibble::checkpoint

#endif  // NIBBLE_CHECKPOINT_AWQ_H_
