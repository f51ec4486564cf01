// Conversions between the wire enums of nibble.v1 and the kernels' types.
//
// Example:
//   request.set_dtype(nibble::ToProto(nibble::DType::kBF16));
//   absl::StatusOr<nibble::WeightSpec> spec = nibble::WeightSpecFromInfo(info);
#ifndef NIBBLE_CLIENT_PROTO_CONVERSIONS_H_
#define NIBBLE_CLIENT_PROTO_CONVERSIONS_H_

#include "absl/status/statusor.h"
#include "kernels/dtype.h"
#include "kernels/weight_format.h"
#include "nibble/v1/nibble.pb.h"

namespace nibble {

v1::WeightFormat ToProto(WeightFormat format);
v1::DType ToProto(DType dtype);

// InvalidArgument for WEIGHT_FORMAT_UNSPECIFIED and values this client does
// not know.
absl::StatusOr<WeightFormat> FromProto(v1::WeightFormat format);
// InvalidArgument for DTYPE_UNSPECIFIED and values this client does not know.
absl::StatusOr<DType> FromProto(v1::DType dtype);

// The spec a server reports for a resident weight, validated.
absl::StatusOr<WeightSpec> WeightSpecFromInfo(const v1::WeightInfo& info);

}  // namespace nibble

#endif  // NIBBLE_CLIENT_PROTO_CONVERSIONS_H_
