// The server's side of the wire translation: upload tensors, weight info and
// status codes. The enum and spec conversions shared with the client are in
// proto/conversions.h.
#ifndef NIBBLE_SERVER_PROTO_CONVERSIONS_H_
#define NIBBLE_SERVER_PROTO_CONVERSIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>

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

// Weights per ListWeights reply: the default (page_size 0) and the most.
inline constexpr int64_t kDefaultListPageSize = 1000;
inline constexpr int64_t kMaxListPageSize = 10000;

// Which page of weights a ListWeights request asks for.
struct ListPageRequest {
  // The last name of the page before; empty for the first.
  std::string after;
  int64_t size = kDefaultListPageSize;
};

// INVALID_ARGUMENT for a negative page_size or a page_token that is not a
// weight name (every token the server gives out is one).
absl::StatusOr<ListPageRequest> ListPageFromProto(
    const v1::ListWeightsRequest& request);

// Longest status message sent: the message travels in a header, and one that
// echoes a huge client string (a 100,000-character weight name) would pass
// the client's header size limit and reach it as RESOURCE_EXHAUSTED instead.
inline constexpr size_t kMaxStatusMessageBytes = 1024;

// Same code, same message, cut to kMaxStatusMessageBytes (saying so).
grpc::Status ToGrpcStatus(const absl::Status& status);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_PROTO_CONVERSIONS_H_
