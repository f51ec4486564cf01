#include "server/edge/proto_conversions.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace nibble::server {

v1::DType ToProto(DType dtype) {
  return static_cast<v1::DType>(Traits(dtype).wire_value);
}

absl::StatusOr<DType> FromProto(v1::DType dtype) {
  return DTypeFromWire(dtype, v1::DType_Name(dtype));
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

v1::ActivationPrecision ToProto(ActivationPrecision precision) {
  return static_cast<v1::ActivationPrecision>(
      ActivationPrecisionWireValue(precision));
}

absl::StatusOr<std::optional<ActivationPrecision>> FromProto(
    v1::ActivationPrecision precision) {
  if (precision == v1::ACTIVATION_PRECISION_UNSPECIFIED) return std::nullopt;
  for (ActivationPrecision known : kAllActivationPrecisions) {
    if (ToProto(known) == precision) return known;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "activation_precision ", static_cast<int>(precision),
      " is not supported: use ACTIVATION_PRECISION_EXACT, "
      "ACTIVATION_PRECISION_BF16 or ACTIVATION_PRECISION_INT8, or leave "
      "it unset for the server's (nibbled --activation_precision)"));
}

absl::StatusOr<WeightSpec> FromProto(const v1::WeightHeader& header) {
  absl::StatusOr<WeightFormat> format = WeightFormatFromWire(
      header.format(), v1::WeightFormat_Name(header.format()));
  if (!format.ok()) return format.status();
  return WeightSpec{.format = *format,
                    .k = header.k(),
                    .n = header.n(),
                    .group_size = header.group_size(),
                    .global_scale = header.global_scale() == 0
                                        ? 1.0f
                                        : header.global_scale()};
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

absl::StatusOr<WeightTensorKind> TensorFromProto(v1::WeightTensor tensor) {
  switch (tensor) {
    case v1::WEIGHT_TENSOR_QWEIGHT:
      return WeightTensorKind::kQweight;
    case v1::WEIGHT_TENSOR_SCALES:
      return WeightTensorKind::kScales;
    case v1::WEIGHT_TENSOR_ZEROS:
      return WeightTensorKind::kZeros;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("chunk names tensor ", static_cast<int>(tensor),
                       ": use WEIGHT_TENSOR_QWEIGHT, WEIGHT_TENSOR_SCALES or "
                       "WEIGHT_TENSOR_ZEROS"));
  }
}

void FillWeightInfo(const ResidentWeight& weight, v1::WeightInfo* info) {
  const WeightSpec& spec = weight.packed.spec();
  info->set_name(weight.name);
  info->set_format(
      static_cast<v1::WeightFormat>(Traits(spec.format).wire_value));
  info->set_k(spec.k);
  info->set_n(spec.n);
  info->set_group_size(spec.group_size);
  info->set_global_scale(spec.global_scale);
  info->set_canonical_bytes(spec.canonical_bytes());
  info->set_resident_bytes(weight.packed.resident_bytes());
  info->set_activation_order(!weight.packed.activation_order().empty());
  if (weight.device != nullptr) {
    info->set_gpu_bytes(weight.device->device_bytes());
    info->set_gpu(weight.device->device());
  }
}

absl::StatusOr<ListPageRequest> ListPageFromProto(
    const v1::ListWeightsRequest& request) {
  if (request.page_size() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page_size is ", request.page_size(), ": give 1 to ",
                     kMaxListPageSize, ", or 0 for ", kDefaultListPageSize));
  }
  ListPageRequest page;
  if (request.page_size() > 0) {
    page.size = std::min<int64_t>(request.page_size(), kMaxListPageSize);
  }
  if (!request.page_token().empty()) {
    if (!ValidateWeightName(request.page_token()).ok()) {
      return absl::InvalidArgumentError(
          "page_token is not one that ListWeights returned: send the "
          "previous reply's next_page_token, or none for the first page");
    }
    page.after = request.page_token();
  }
  return page;
}

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  absl::string_view message = status.message();
  std::string cut;
  if (message.size() > kMaxStatusMessageBytes) {
    cut = absl::StrCat(message.substr(0, kMaxStatusMessageBytes), "... (",
                       message.size() - kMaxStatusMessageBytes,
                       " more bytes cut)");
    message = cut;
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(message));
}

}  // namespace nibble::server
