// A canonical weight's codes and scale codes in the column layout that MXFP4
// and NVFP4 checkpoints store (format/fp4_columns.h), built element by
// element, for tests of the code that reads or writes that layout.
//
// Example:
//   const nibble::testing::ColumnLayout columns =
//       nibble::testing::ToColumns(weight);
//   PackedWeight::PackColumns(columns.View(weight.spec));
#ifndef NIBBLE_TESTS_FORMAT_COLUMN_LAYOUT_H_
#define NIBBLE_TESTS_FORMAT_COLUMN_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "format/fp4_columns.h"
#include "format/weight_format.h"

namespace nibble::testing {

struct ColumnLayout {
  std::vector<uint8_t> codes;        // [N][K/2]
  std::vector<uint8_t> scale_codes;  // [N][K/group]

  Fp4Columns View(const WeightSpec& spec) const {
    return Fp4Columns{spec, codes.data(), scale_codes.data()};
  }
};

inline ColumnLayout ToColumns(const QuantizedWeight& weight) {
  const WeightSpec& spec = weight.spec;
  ColumnLayout columns;
  columns.codes.resize(spec.n * spec.k / 2);
  columns.scale_codes.resize(spec.n * spec.groups());
  for (int64_t col = 0; col < spec.n; ++col) {
    for (int64_t row = 0; row < spec.k; row += 2) {
      columns.codes[(col * spec.k + row) / 2] = static_cast<uint8_t>(
          weight.Code(row, col) | weight.Code(row + 1, col) << 4);
    }
    for (int64_t group = 0; group < spec.groups(); ++group) {
      columns.scale_codes[col * spec.groups() + group] =
          static_cast<uint8_t>(weight.scales[group * spec.n + col]);
    }
  }
  return columns;
}

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_FORMAT_COLUMN_LAYOUT_H_
