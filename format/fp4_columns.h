// The layout block-format (MXFP4-style) checkpoints store a weight in, column
// by column:
// the transpose of the canonical layout (weight_format.h). Uploads may carry
// it as it is (WeightHeader.code_layout), so that a client sends a
// checkpoint's bytes without transposing them and a server packs them
// straight into panels (PanelCodeWriter); only a server that keeps canonical
// weights transposes them, with CanonicalFromColumns.
//   codes       [N][K/2] bytes: codes k and k + 1 of column n in the low and
//               high nibble of byte k/2 of row n;
//   scale_codes [N][K/group] bytes: the format's 8-bit scale code.
//
// Example:
//   nibble::Fp4Columns columns{spec, blocks.data(), scales.data()};
//   nibble::QuantizedWeight canonical = nibble::CanonicalFromColumns(columns);
#ifndef NIBBLE_FORMAT_FP4_COLUMNS_H_
#define NIBBLE_FORMAT_FP4_COLUMNS_H_

#include <cstdint>
#include <vector>

#include "format/weight_format.h"

namespace nibble {

// A weight (HasColumnLayout) in the column layout, in memory it does not own.
struct Fp4Columns {
  WeightSpec spec;
  const uint8_t* codes = nullptr;
  const uint8_t* scale_codes = nullptr;

  int64_t code_bytes() const { return spec.k / 2 * spec.n; }
  int64_t scale_code_bytes() const {
    return ScalesBytes(spec, CodeLayout::kColumns);
  }
  // Its tensors, for an upload in CodeLayout::kColumns.
  WeightBytes bytes() const;
};

// The canonical weight of `columns` (codes and scales transposed), not
// validated.
QuantizedWeight CanonicalFromColumns(const Fp4Columns& columns);

// Scale codes [N][groups] as canonical scale slots [groups][N]: the scales
// CanonicalFromColumns gives.
std::vector<uint16_t> ScaleSlotsFromColumns(const uint8_t* scale_codes,
                                            int64_t groups, int64_t n);

}  // namespace nibble

#endif  // NIBBLE_FORMAT_FP4_COLUMNS_H_
