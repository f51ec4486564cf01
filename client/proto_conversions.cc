#include "client/proto_conversions.h"

#include <string>

#include "absl/status/status.h"

namespace nibble::client {

v1::WeightFormat ToProto(WeightFormat format) {
  return static_cast<v1::WeightFormat>(Traits(format).wire_value);
}

v1::DType ToProto(DType dtype) {
  return static_cast<v1::DType>(Traits(dtype).wire_value);
}

v1::CodeLayout ToProto(CodeLayout layout) {
  return layout == CodeLayout::kColumns ? v1::CODE_LAYOUT_COLUMNS
                                        : v1::CODE_LAYOUT_CANONICAL;
}

v1::ActivationPrecision ToProto(ActivationPrecision precision) {
  return static_cast<v1::ActivationPrecision>(
      ActivationPrecisionWireValue(precision));
}

std::optional<ActivationPrecision> FromProto(
    v1::ActivationPrecision precision) {
  for (ActivationPrecision known : kAllActivationPrecisions) {
    if (ToProto(known) == precision) return known;
  }
  return std::nullopt;
}

double ErrorBoundOf(const v1::MatmulResponse& response) {
  const absl::StatusOr<DType> dtype = FromProto(response.dtype());
  return MatmulErrorBound(FromProto(response.activation_precision())
                              .value_or(ActivationPrecision::kExact),
                          dtype.ok() ? *dtype : DType::kF32);
}

absl::StatusOr<WeightFormat> FromProto(v1::WeightFormat format) {
  return WeightFormatFromWire(format, v1::WeightFormat_Name(format));
}

absl::StatusOr<DType> FromProto(v1::DType dtype) {
  return DTypeFromWire(dtype, v1::DType_Name(dtype));
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
                        info.global_scale() == 0 ? 1.0f : info.global_scale()};
  if (absl::Status status = spec.Validate(); !status.ok()) return status;
  return spec;
}

}  // namespace nibble::client
