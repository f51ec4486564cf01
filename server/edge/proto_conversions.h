// The server's side of the wire translation between nibble.v1 and nibble's
// types: what requests and uploads carry, weight info and status codes. The
// client's side is client/proto_conversions.h; both take the enums' wire
// values from the format and dtype tables (format/weight_format.h,
// format/dtype.h).
#ifndef NIBBLE_SERVER_EDGE_PROTO_CONVERSIONS_H_
#define NIBBLE_SERVER_EDGE_PROTO_CONVERSIONS_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "grpcpp/support/status.h"
#include "kernels/gemm_kernel.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/upload_assembler.h"
#include "server/core/weight_store.h"

namespace nibble::server {

v1::DType ToProto(DType dtype);
// INVALID_ARGUMENT, listing the valid values, for UNSPECIFIED and unknown
// values.
absl::StatusOr<DType> FromProto(v1::DType dtype);

// INVALID_ARGUMENT, listing the valid values, for unknown values.
absl::StatusOr<CodeLayout> FromProto(v1::CodeLayout layout);

v1::ActivationPrecision ToProto(ActivationPrecision precision);
// Empty for UNSPECIFIED (the server's default); INVALID_ARGUMENT, listing
// the valid values, for unknown values.
absl::StatusOr<std::optional<ActivationPrecision>> FromProto(
    v1::ActivationPrecision precision);

// The spec a header describes, with an unset global_scale (0) as 1; not yet
// validated (see WeightSpec::Validate).
absl::StatusOr<WeightSpec> FromProto(const v1::WeightHeader& header);

// The header's activation order, not yet validated (see
// ValidateActivationOrder); INVALID_ARGUMENT for an entry past int32.
absl::StatusOr<std::vector<int32_t>> ActivationOrderFromProto(
    const v1::WeightHeader& header);

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

#endif  // NIBBLE_SERVER_EDGE_PROTO_CONVERSIONS_H_
