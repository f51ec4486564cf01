// The client's side of the wire translation between nibble.v1 and nibble's
// types: what uploads and matmul requests send, and the weights the server
// reports. The server's side is server/edge/proto_conversions.h; both take
// the enums' wire values from the format and dtype tables
// (format/weight_format.h, format/dtype.h).
//
// Example:
//   request.set_dtype(nibble::client::ToProto(nibble::DType::kBF16));
//   absl::StatusOr<nibble::WeightSpec> spec =
//       nibble::client::WeightSpecFromInfo(info);
#ifndef NIBBLE_CLIENT_PROTO_CONVERSIONS_H_
#define NIBBLE_CLIENT_PROTO_CONVERSIONS_H_

#include <cstdint>
#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/gemm_kernel.h"
#include "nibble/v1/nibble.pb.h"

namespace nibble::client {

v1::WeightFormat ToProto(WeightFormat format);
v1::DType ToProto(DType dtype);
v1::CodeLayout ToProto(CodeLayout layout);
v1::ActivationPrecision ToProto(ActivationPrecision precision);
// What a reply says its kernel made of A; empty for UNSPECIFIED and unknown
// values (a server that does not say).
std::optional<ActivationPrecision> FromProto(v1::ActivationPrecision precision);

// The largest MaxRelativeError against the float64 reference that the reply's
// C may show: MatmulErrorBound of what its kernel made of A (as sent, where
// it does not say) and of its dtype.
double ErrorBoundOf(const v1::MatmulResponse& response);

// INVALID_ARGUMENT, listing the valid values, for UNSPECIFIED and unknown
// values.
absl::StatusOr<WeightFormat> FromProto(v1::WeightFormat format);
absl::StatusOr<DType> FromProto(v1::DType dtype);

// The header that uploads a weight of `spec` with `activation_order` (empty
// for none) as `name`.
void FillWeightHeader(absl::string_view name, const WeightSpec& spec,
                      absl::Span<const int32_t> activation_order,
                      v1::WeightHeader* header);

// The spec a server reports for a resident weight, with an unset
// global_scale (0) as 1, validated.
absl::StatusOr<WeightSpec> WeightSpecFromInfo(const v1::WeightInfo& info);

}  // namespace nibble::client

#endif  // NIBBLE_CLIENT_PROTO_CONVERSIONS_H_
