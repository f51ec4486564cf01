#include "kernels/weight_format.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/dtype.h"

namespace nibble {

absl::string_view WeightFormatName(WeightFormat format) {
  switch (format) {
    case WeightFormat::kFp4:
      return "fp4";
    case WeightFormat::kU4b8:
      return "u4b8";
    case WeightFormat::kU4:
      return "u4";
  }
  return "unknown";
}

absl::StatusOr<WeightFormat> ParseWeightFormat(absl::string_view name) {
  for (WeightFormat format :
       {WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4}) {
    if (name == WeightFormatName(format)) return format;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown weight format \"", name, "\": use fp4, u4b8 or u4"));
}

bool HasZeros(WeightFormat format) { return format == WeightFormat::kU4; }

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
  if (group_size != 32 && group_size != 64 && group_size != 128 &&
      group_size != k) {
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
  return absl::StrCat(WeightFormatName(format), " k=", k, " n=", n,
                      " group=", group_size);
}

void QuantizedWeight::SetCode(int64_t row, int64_t col, uint8_t code) {
  uint32_t& word = qweight[(row / kCodesPerWord) * spec.n + col];
  const int shift = 4 * (row % kCodesPerWord);
  word =
      (word & ~(0xfu << shift)) | (static_cast<uint32_t>(code & 0xf) << shift);
}

absl::Status QuantizedWeight::Validate() const {
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  const auto check_size = [](absl::string_view what, size_t got_bytes,
                             int64_t want_bytes) -> absl::Status {
    if (static_cast<int64_t>(got_bytes) == want_bytes) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", got_bytes, " bytes, the shape needs ", want_bytes));
  };
  if (absl::Status s =
          check_size("qweight", qweight.size() * 4, spec.qweight_bytes());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          check_size("scales", scales.size() * 2, spec.scales_bytes());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = check_size("zeros", zeros.size(), spec.zeros_bytes());
      !s.ok()) {
    return s;
  }
  // A NaN or infinite scale would turn every product with its group into NaN
  // or infinity: a wrong result no request could avoid.
  constexpr uint16_t kHalfExponentBits = 0x7c00;
  for (size_t i = 0; i < scales.size(); ++i) {
    if ((scales[i] & kHalfExponentBits) == kHalfExponentBits) {
      return absl::InvalidArgumentError(
          absl::StrCat("scale of column ", i % spec.n, ", group ", i / spec.n,
                       " is ", (scales[i] & 0x3ff) != 0 ? "NaN" : "infinite",
                       absl::StrFormat(" (fp16 bits 0x%04x)", scales[i]),
                       ": scales must be finite"));
    }
  }
  for (size_t i = 0; i < zeros.size(); ++i) {
    if (zeros[i] > 15) {
      return absl::InvalidArgumentError(
          absl::StrCat("zero point ", static_cast<int>(zeros[i]), " at index ",
                       i, " is out of range 0..15"));
    }
  }
  return absl::OkStatus();
}

QuantizedWeight RandomQuantizedWeight(const WeightSpec& spec, uint64_t seed) {
  std::mt19937_64 rng(seed);
  QuantizedWeight weight;
  weight.spec = spec;
  weight.qweight.resize(spec.qweight_bytes() / 4);
  for (uint32_t& word : weight.qweight) word = static_cast<uint32_t>(rng());
  weight.scales.resize(spec.scales_bytes() / 2);
  std::uniform_real_distribution<float> scale(0x1p-8f, 0x1p-4f);
  for (uint16_t& s : weight.scales) s = FloatToHalf(scale(rng));
  weight.zeros.resize(spec.zeros_bytes());
  for (uint8_t& z : weight.zeros) z = rng() & 0xf;
  return weight;
}

}  // namespace nibble
