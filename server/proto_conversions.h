// The server's side of the wire translation: upload tensors, weight info and
// status codes. The enum and spec conversions shared with the client are in
// proto/conversions.h.
#ifndef NIBBLE_SERVER_PROTO_CONVERSIONS_H_
#define NIBBLE_SERVER_PROTO_CONVERSIONS_H_

#include "absl/status/statusor.h"
#include "grpcpp/support/status.h"
#include "nibble/v1/nibble.pb.h"
#include "proto/conversions.h"
#include "server/upload_assembler.h"
#include "server/weight_store.h"

namespace nibble::server {

// INVALID_ARGUMENT for UNSPECIFIED or unknown values.
absl::StatusOr<WeightTensorKind> TensorFromProto(v1::WeightTensor tensor);

void FillWeightInfo(const ResidentWeight& weight, v1::WeightInfo* info);

// Same code, same message.
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_PROTO_CONVERSIONS_H_
