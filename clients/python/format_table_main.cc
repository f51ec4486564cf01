// Writes the weight-format table of format/weight_format.h as a Python
// module, so that the Python client reads every format's facts from the one
// table instead of keeping a copy of it. CMake runs it at build time.
//
// Example:
//   nibble-python-format-table build/clients/python/nibble/_format_table.py
#include <fstream>
#include <iostream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "format/dequant.h"
#include "format/weight_format.h"

namespace nibble {
namespace {

absl::string_view CodeKindName(CodeKind kind) {
  switch (kind) {
    case CodeKind::kFp4:
      return "fp4";
    case CodeKind::kInt4:
      return "int4";
  }
  return "unknown";
}

absl::string_view ZeroPointName(ZeroPoint zero_point) {
  switch (zero_point) {
    case ZeroPoint::kNone:
      return "none";
    case ZeroPoint::kEight:
      return "eight";
    case ZeroPoint::kPerGroup:
      return "per_group";
  }
  return "unknown";
}

// A Python string literal; the table's texts hold no quotes or backslashes.
std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", text, "\"");
}

absl::string_view PythonBool(bool value) { return value ? "True" : "False"; }

// A float as a string float.fromhex reads back exactly; "nan" for NaN.
std::string HexFloat(float value) {
  return Quoted(absl::StrFormat("%a", static_cast<double>(value)));
}

// The values of every 8-bit code of an 8-bit scale type, NaN for the codes
// that stand for it (which uploads refuse).
std::string ScaleCodeValues(ScaleType type) {
  std::string values = absl::StrCat("    ", Quoted(ScaleTypeName(type)), ": (");
  for (int code = 0; code < 256; ++code) {
    const auto bits = static_cast<uint8_t>(code);
    absl::StrAppend(&values, code % 4 == 0 ? "\n        " : " ",
                    IsScaleCodeNan(type, bits)
                        ? Quoted("nan")
                        : HexFloat(ScaleCodeToFloat(type, bits)),
                    ",");
  }
  absl::StrAppend(&values, "\n    ),\n");
  return values;
}

std::string PythonModule() {
  std::string module =
      "# Generated at build time from kWeightFormatTable "
      "(format/weight_format.h)\n"
      "# by clients/python/format_table_main.cc: do not edit.\n"
      "ROWS = (\n";
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    absl::StrAppend(&module, "    dict(name=", Quoted(row.name),
                    ", wire_value=", row.wire_value,
                    ", code_kind=", Quoted(CodeKindName(row.code_kind)),
                    ", scale_type=", Quoted(ScaleTypeName(row.scale_type)),
                    ", zero_point=", Quoted(ZeroPointName(row.zero_point)),
                    ", fixed_group_size=", row.fixed_group_size,
                    ", column_layout=", PythonBool(row.column_layout),
                    ", global_scale=", PythonBool(row.global_scale),
                    ", math=", Quoted(row.math),
                    ", origin=", Quoted(row.origin), "),\n");
  }
  absl::StrAppend(&module, ")\nCODES_PER_WORD = ", kCodesPerWord,
                  "\nMAX_DIMENSION = ", kMaxDimension,
                  "\n# Every FP4 E2M1 code's value, as float.fromhex strings.\n"
                  "FP4_VALUES = (");
  for (int code = 0; code < 16; ++code) {
    absl::StrAppend(&module, code % 4 == 0 ? "\n    " : " ",
                    HexFloat(Fp4CodeToFloat(static_cast<uint8_t>(code))), ",");
  }
  absl::StrAppend(&module,
                  "\n)\n# Every code's value for each 8-bit scale type.\n"
                  "SCALE_CODE_VALUES = {\n",
                  ScaleCodeValues(ScaleType::kE8m0),
                  ScaleCodeValues(ScaleType::kE4m3), "}\n");
  return module;
}

}  // namespace
}  // namespace nibble

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: " << argv[0] << " OUTPUT.py\n";
    return 2;
  }
  std::ofstream out(argv[1]);
  out << nibble::PythonModule();
  out.close();
  if (!out) {
    std::cerr << argv[0] << ": cannot write " << argv[1] << "\n";
    return 1;
  }
  return 0;
}
