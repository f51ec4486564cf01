// Translation between the wire contract (nibble.v1 messages) and the kernel
// library's types, so that neither side depends on the other's vocabulary.
#ifndef NIBBLE_SERVER_PROTO_CONVERSIONS_H_
#define NIBBLE_SERVER_PROTO_CONVERSIONS_H_

#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "kernels/dtype.h"
#include "kernels/weight_format.h"
#include "nibble/v1/nibble.pb.h"
#include "server/upload_assembler.h"
#include "server/weight_store.h"

namespace nibble::server {

// INVALID_ARGUMENT for UNSPECIFIED or unknown values.
absl::StatusOr<WeightFormat> FromProto(v1::WeightFormat format);
absl::StatusOr<DType> FromProto(v1::DType dtype);
absl::StatusOr<WeightTensorKind> FromProto(v1::WeightTensor tensor);
absl::StatusOr<WeightSpec> FromProto(const v1::WeightHeader& header);

v1::WeightFormat ToProto(WeightFormat format);
v1::DType ToProto(DType dtype);
void ToProto(const ResidentWeight& weight, v1::WeightInfo* info);

// Same code, same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_PROTO_CONVERSIONS_H_
