#include "format/weight_format.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/choice_list.h"
#include "format/dequant.h"
#include "format/dtype.h"

namespace nibble {

absl::StatusOr<WeightFormat> ParseWeightFormat(absl::string_view name) {
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    if (name == row.name) return row.format;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown weight format \"", name, "\": use ", WeightFormatNames()));
}

std::string WeightFormatNamesWhere(bool (*has)(WeightFormat),
                                   absl::string_view last_separator) {
  std::vector<std::string> names;
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    if (has(row.format)) names.emplace_back(row.name);
  }
  return JoinList(names, last_separator);
}

std::string WeightFormatNames(absl::string_view last_separator) {
  return WeightFormatNamesWhere([](WeightFormat) { return true; },
                                last_separator);
}

std::string FixedGroupSizesText() {
  std::string text;
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    if (row.fixed_group_size == 0) continue;
    absl::StrAppend(&text, text.empty() ? "" : ", ", row.name, ":",
                    row.fixed_group_size);
  }
  return text;
}

absl::StatusOr<WeightFormat> WeightFormatFromWire(int wire_value,
                                                  absl::string_view wire_name) {
  std::vector<std::string> valid;
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    if (wire_value == row.wire_value) return row.format;
    valid.push_back(
        absl::StrCat("WEIGHT_FORMAT_", absl::AsciiStrToUpper(row.name)));
  }
  return UnsupportedChoiceError(
      "weight format",
      wire_name.empty() ? absl::StrCat(wire_value) : std::string(wire_name),
      valid);
}

absl::StatusOr<WeightFormat> WeightFormatFromFileCode(uint32_t code) {
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    if (code == row.file_code) return row.format;
  }
  return absl::DataLossError(
      absl::StrCat("unknown weight format code ", code, " in the header"));
}

absl::string_view ScaleTypeName(ScaleType type) {
  switch (type) {
    case ScaleType::kFp16:
      return "fp16";
    case ScaleType::kE8m0:
      return "E8M0";
    case ScaleType::kE4m3:
      return "E4M3";
  }
  return "unknown";
}

absl::Status WeightSpec::Validate() const {
  if (k <= 0 || n <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "weight dimensions must be positive, got k=", k, " n=", n));
  }
  if (k > kMaxDimension || n > kMaxDimension) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight dimensions must be at most ", kMaxDimension,
                     ", got k=", k, " n=", n));
  }
  if (k % kCodesPerWord != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k=", k, " is not a multiple of 8 (8 codes per packed word)"));
  }
  if (const int64_t fixed = FixedGroupSize(format);
      fixed != 0 && group_size != fixed) {
    return absl::InvalidArgumentError(absl::StrCat(
        WeightFormatName(format), " has one scale per ", fixed,
        " values of k: its group size must be ", fixed, ", got ", group_size));
  }
  if (HasGlobalScale(format)) {
    if (!std::isfinite(global_scale) || global_scale <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          WeightFormatName(format),
          "'s global scale must be finite and positive, got ", global_scale));
    }
  } else if (global_scale != 1.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat("a global scale (", global_scale, ") is only for ",
                     WeightFormatNamesWhere(HasGlobalScale, " and "), ", not ",
                     WeightFormatName(format), ": leave it at 1"));
  }
  if (FixedGroupSize(format) == 0 && group_size != 32 && group_size != 64 &&
      group_size != 128 && group_size != k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group size ", group_size, " is not supported: use 32, 64, 128 or k (",
        k, ") for one scale per column"));
  }
  if (k % group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "k=", k, " is not a multiple of the group size ", group_size));
  }
  return absl::OkStatus();
}

std::string WeightSpec::DebugString() const {
  std::string text = absl::StrCat(WeightFormatName(format), " k=", k, " n=", n,
                                  " group=", group_size);
  if (HasGlobalScale(format)) {
    absl::StrAppend(&text, " global_scale=", global_scale);
  }
  return text;
}

namespace {

// What is wrong with a scale slot: "" when it holds a finite scale.
absl::string_view ScaleProblem(ScaleType type, uint16_t slot) {
  switch (type) {
    case ScaleType::kFp16: {
      constexpr uint16_t kHalfExponentBits = 0x7c00;
      if ((slot & kHalfExponentBits) != kHalfExponentBits) return "";
      return (slot & 0x3ff) != 0 ? "NaN" : "infinite";
    }
    case ScaleType::kE8m0:
    case ScaleType::kE4m3:
      if (slot > 0xff) return "wider than 8 bits";
      return IsScaleCodeNan(type, static_cast<uint8_t>(slot)) ? "NaN" : "";
  }
  return "of an unknown type";
}

// OK when an array of the weight has the bytes its shape needs.
absl::Status CheckArrayBytes(absl::string_view what, size_t got_bytes,
                             int64_t want_bytes) {
  if (static_cast<int64_t>(got_bytes) == want_bytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has ", got_bytes, " bytes, the shape needs ", want_bytes));
}

// Whether some slot has a ScaleProblem. Validate scans every scale of every
// upload, so each format gets a loop of its own without branches;
// ScaleProblem then names the first bad slot.
bool AnyScaleProblem(ScaleType type, absl::Span<const uint16_t> slots) {
  const auto any = [slots](auto is_bad) {
    return AnyBranchFree(slots, is_bad);
  };
  switch (type) {
    case ScaleType::kFp16:
      return any([](uint16_t slot) { return (slot & 0x7c00) == 0x7c00; });
    case ScaleType::kE8m0:
      return any([](uint16_t slot) { return slot > 0xff || slot == kE8m0Nan; });
    case ScaleType::kE4m3:
      return any([](uint16_t slot) {
        return slot > 0xff || IsE4m3Nan(static_cast<uint8_t>(slot));
      });
  }
  return true;
}

// A random scale slot whose value (the global scale included) lies in
// [2^-8, 2^-4).
uint16_t RandomScale(const WeightSpec& spec, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> scale(0x1p-8f, 0x1p-4f);
  switch (Traits(spec.format).scale_type) {
    case ScaleType::kFp16:
      return FloatToHalf(scale(rng));
    case ScaleType::kE8m0:
      return static_cast<uint16_t>(127 - 8 + rng() % 4);
    case ScaleType::kE4m3:
      return FloatToE4m3(scale(rng) / spec.global_scale);
  }
  return 0;
}

}  // namespace

void QuantizedWeight::SetCode(int64_t row, int64_t col, uint8_t code) {
  uint32_t& word = qweight[(row / kCodesPerWord) * spec.n + col];
  const int shift = 4 * (row % kCodesPerWord);
  word =
      (word & ~(0xfu << shift)) | (static_cast<uint32_t>(code & 0xf) << shift);
}

absl::Status QuantizedWeight::Validate() const {
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  if (absl::Status s =
          CheckArrayBytes("qweight", qweight.size() * 4, spec.qweight_bytes());
      !s.ok()) {
    return s;
  }
  return ValidateAllButCodes();
}

absl::Status QuantizedWeight::ValidateAllButCodes() const {
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  if (absl::Status s =
          CheckArrayBytes("scales", scales.size() * 2, spec.scales_bytes());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckArrayBytes("zeros", zeros.size(), spec.zeros_bytes());
      !s.ok()) {
    return s;
  }
  // A NaN or infinite scale would turn every product with its group into NaN
  // or infinity: a wrong result no request could avoid.
  const ScaleType scale_type = Traits(spec.format).scale_type;
  if (AnyScaleProblem(scale_type, scales)) {
    for (size_t i = 0; i < scales.size(); ++i) {
      if (absl::string_view problem = ScaleProblem(scale_type, scales[i]);
          !problem.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "scale of column ", i % spec.n, ", group ", i / spec.n, " is ",
            problem, " (", ScaleTypeName(scale_type),
            absl::StrFormat(" bits 0x%04x", scales[i]),
            "): scales must be finite",
            HasEightBitScales(spec.format)
                ? ", one 8-bit code in the low byte of each 16-bit slot"
                : ""));
      }
    }
  }
  // The maximum is a reduction that vectorizes; the search only on failure.
  if (!zeros.empty() && std::ranges::max(zeros) > 15) {
    const auto bad =
        std::ranges::find_if(zeros, [](uint8_t z) { return z > 15; });
    return absl::InvalidArgumentError(
        absl::StrCat("zero point ", static_cast<int>(*bad), " at index ",
                     bad - zeros.begin(), " is out of range 0..15"));
  }
  return ValidateActivationOrder(activation_order, spec.k);
}

absl::Status CheckColumnLayout(WeightFormat format, absl::string_view what) {
  if (HasColumnLayout(format)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, " is for ", WeightFormatNamesWhere(HasColumnLayout, " and "),
      " weights, not ", WeightFormatName(format)));
}

int64_t ScalesBytes(const WeightSpec& spec, CodeLayout layout) {
  return layout == CodeLayout::kColumns ? spec.groups() * spec.n
                                        : spec.scales_bytes();
}

absl::Status WeightBytes::CheckSizes() const {
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  if (layout == CodeLayout::kColumns) {
    if (absl::Status status =
            CheckColumnLayout(spec.format, "the column layout");
        !status.ok()) {
      return status;
    }
  }
  if (absl::Status s =
          CheckArrayBytes("qweight", qweight.size(), spec.qweight_bytes());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CheckArrayBytes("scales", scales.size(), ScalesBytes(spec, layout));
      !s.ok()) {
    return s;
  }
  return CheckArrayBytes("zeros", zeros.size(), spec.zeros_bytes());
}

WeightBytes BytesOf(const QuantizedWeight& weight) {
  const auto bytes = [](const auto& array) {
    return absl::string_view(reinterpret_cast<const char*>(array.data()),
                             array.size() * sizeof(array[0]));
  };
  WeightBytes result;
  result.spec = weight.spec;
  result.qweight = bytes(weight.qweight);
  result.scales = bytes(weight.scales);
  result.zeros = bytes(weight.zeros);
  result.activation_order = weight.activation_order;
  return result;
}

absl::Status ValidateActivationOrder(absl::Span<const int32_t> order,
                                     int64_t k) {
  if (order.empty()) return absl::OkStatus();
  if (static_cast<int64_t>(order.size()) != k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "activation_order has ", order.size(), " entries for K=", k,
        ": give one per row of the weight, or none for the identity"));
  }
  // Where each column of A was first seen, -1 for not yet.
  std::vector<int64_t> seen_at(k, -1);
  for (int64_t r = 0; r < k; ++r) {
    const int32_t column = order[r];
    if (column < 0 || column >= k) {
      return absl::InvalidArgumentError(absl::StrCat(
          "activation_order[", r, "] = ", column, " is outside 0..", k - 1,
          ": it must be a permutation of 0..K-1 (K=", k, ")"));
    }
    if (seen_at[column] >= 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("activation_order[", r, "] = ", column,
                       " appears twice (also at ", seen_at[column],
                       "): it must be a permutation of 0..K-1 (K=", k, ")"));
    }
    seen_at[column] = r;
  }
  return absl::OkStatus();
}

std::vector<int32_t> RandomActivationOrder(int64_t k, uint64_t seed) {
  std::vector<int32_t> order(k);
  std::iota(order.begin(), order.end(), 0);
  std::mt19937_64 rng(seed);
  std::shuffle(order.begin(), order.end(), rng);
  return order;
}

QuantizedWeight RandomQuantizedWeight(const WeightSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  QuantizedWeight weight;
  weight.spec = spec;
  weight.qweight.resize(spec.qweight_bytes() / 4);
  for (uint32_t& word : weight.qweight) word = static_cast<uint32_t>(rng());
  weight.scales.resize(spec.scales_bytes() / 2);
  for (uint16_t& s : weight.scales) s = RandomScale(spec, rng);
  weight.zeros.resize(spec.zeros_bytes());
  for (uint8_t& z : weight.zeros) z = rng() & 0xf;
  return weight;
}

}  // namespace nibble
