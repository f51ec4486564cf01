#include "proto/conversions.h"

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace nibble {

v1::WeightFormat ToProto(WeightFormat format) {
  return static_cast<v1::WeightFormat>(Traits(format).wire_value);
}

v1::DType ToProto(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return v1::DTYPE_F32;
    case DType::kF16:
      return v1::DTYPE_F16;
    case DType::kBF16:
      return v1::DTYPE_BF16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

v1::CodeLayout ToProto(CodeLayout layout) {
  return layout == CodeLayout::kColumns ? v1::CODE_LAYOUT_COLUMNS
                                        : v1::CODE_LAYOUT_CANONICAL;
}

absl::StatusOr<CodeLayout> FromProto(v1::CodeLayout layout) {
  switch (layout) {
    case v1::CODE_LAYOUT_CANONICAL:
      return CodeLayout::kCanonical;
    case v1::CODE_LAYOUT_COLUMNS:
      return CodeLayout::kColumns;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("code layout ", static_cast<int>(layout),
                       " is not supported: use CODE_LAYOUT_CANONICAL (unset) "
                       "or CODE_LAYOUT_COLUMNS"));
  }
}

absl::StatusOr<WeightFormat> FromProto(v1::WeightFormat format) {
  return WeightFormatFromWire(format, v1::WeightFormat_Name(format));
}

absl::StatusOr<DType> FromProto(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_F32:
      return DType::kF32;
    case v1::DTYPE_F16:
      return DType::kF16;
    case v1::DTYPE_BF16:
      return DType::kBF16;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "dtype ",
          v1::DType_Name(dtype).empty() ? std::to_string(dtype)
                                        : v1::DType_Name(dtype),
          " is not supported: use DTYPE_F32, DTYPE_F16 or DTYPE_BF16"));
  }
}

float GlobalScaleFromProto(float global_scale) {
  return global_scale == 0 ? 1.0f : global_scale;
}

absl::StatusOr<WeightSpec> FromProto(const v1::WeightHeader& header) {
  absl::StatusOr<WeightFormat> format = FromProto(header.format());
  if (!format.ok()) return format.status();
  return WeightSpec{
      .format = *format,
      .k = header.k(),
      .n = header.n(),
      .group_size = header.group_size(),
      .global_scale = GlobalScaleFromProto(header.global_scale())};
}

absl::StatusOr<std::vector<int32_t>> ActivationOrderFromProto(
    const v1::WeightHeader& header) {
  std::vector<int32_t> order;
  order.reserve(header.activation_order_size());
  for (const uint32_t column : header.activation_order()) {
    if (column > static_cast<uint32_t>(std::numeric_limits<int32_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "activation_order[", order.size(), "] = ", column,
          " is outside 0..K-1: it must be a permutation of 0..K-1 (K=",
          header.k(), ")"));
    }
    order.push_back(static_cast<int32_t>(column));
  }
  return order;
}

void FillWeightHeader(absl::string_view name, const WeightSpec& spec,
                      absl::Span<const int32_t> activation_order,
                      v1::WeightHeader* header) {
  header->set_name(std::string(name));
  header->set_format(ToProto(spec.format));
  header->set_k(spec.k);
  header->set_n(spec.n);
  header->set_group_size(spec.group_size);
  if (HasGlobalScale(spec.format)) {
    header->set_global_scale(spec.global_scale);
  }
  header->mutable_activation_order()->Assign(activation_order.begin(),
                                             activation_order.end());
}

absl::StatusOr<WeightSpec> WeightSpecFromInfo(const v1::WeightInfo& info) {
  absl::StatusOr<WeightFormat> format = FromProto(info.format());
  if (!format.ok()) return format.status();
  const WeightSpec spec{*format, info.k(), info.n(), info.group_size(),
                        GlobalScaleFromProto(info.global_scale())};
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  return spec;
}

}  // namespace nibble
