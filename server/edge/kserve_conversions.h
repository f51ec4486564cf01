// Translation between the Open Inference Protocol (KServe v2) messages and
// nibble's own: every resident weight is a model with one version, "1", one
// input "a" [M, K] and one output "c" [M, N], both FP32, FP16 or BF16.
// Kept apart from the service so that each rule can be tested on its own.
//
// Example:
//   absl::StatusOr<nibble::v1::MatmulRequest> matmul =
//       nibble::server::MatmulRequestFromKServe(infer_request, weight_spec);
//   // ... run it ...
//   nibble::server::FillKServeInferResponse(infer_request,
//                                           std::move(matmul_response),
//                                           &infer_response);
#ifndef NIBBLE_SERVER_EDGE_KSERVE_CONVERSIONS_H_
#define NIBBLE_SERVER_EDGE_KSERVE_CONVERSIONS_H_

#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "inference/grpc_predict_v2.pb.h"
#include "nibble/v1/nibble.pb.h"
#include "server/core/weight_store.h"

namespace nibble::server {

inline constexpr char kKServeInputName[] = "a";
inline constexpr char kKServeOutputName[] = "c";
// The response parameter naming the kernel that ran, e.g. "fused_u4_avx512".
inline constexpr char kKServeKernelParameter[] = "kernel";
// The response parameter saying what that kernel made of A: "exact", "bf16"
// or "int8" (MatmulResponse.activation_precision).
inline constexpr char kKServeActivationPrecisionParameter[] =
    "activation_precision";
// A weight is replaced by deleting and uploading it again, never versioned,
// so each model has exactly one version.
inline constexpr char kKServeModelVersion[] = "1";
inline constexpr char kKServePlatform[] = "nibble";

// "FP32", "FP16" or "BF16", the protocol's names for nibble's dtypes.
absl::string_view KServeDatatype(DType dtype);
// INVALID_ARGUMENT, listing the accepted names, for any other datatype.
absl::StatusOr<DType> DTypeFromKServeDatatype(absl::string_view datatype);

// OK for "" (the server's choice) and "1"; NOT_FOUND naming the version and
// the model otherwise.
absl::Status CheckKServeModelVersion(absl::string_view model_name,
                                     absl::string_view version);

// NOT_FOUND in the protocol's words, for a model that is not resident.
absl::Status KServeModelNotFound(absl::string_view model_name);

// The resident weight serving `model_name` at `version`: NOT_FOUND in the
// protocol's words for an unknown model or version, the store's error while
// it loads.
absl::StatusOr<std::shared_ptr<const ResidentWeight>> FindKServeModel(
    const WeightStore& store, absl::string_view model_name,
    absl::string_view version);

// Input "a" [-1, K] and output "c" [-1, N]. Their datatype is reported as
// FP32 because the message has room for one; FP16 and BF16 are accepted too
// (and then answered in kind).
void FillKServeModelMetadata(absl::string_view model_name,
                             const WeightSpec& spec,
                             inference::ModelMetadataResponse* response);

// The nibble.v1 Matmul that answers `request` on the weight described by
// `spec`: the input's data is taken from raw_input_contents[0] (any of the
// three datatypes) or, for FP32, from contents.fp32_contents. INVALID_ARGUMENT,
// saying what to fix, for anything else: not exactly one input named "a", an
// unknown datatype, a shape that is not [M >= 1, K of the weight] or [K] (one
// row), a byte or value count that does not match the shape, data given both
// raw and as contents (an empty contents message counts as none), or a
// requested output other than "c". Does not check the model name or version.
absl::StatusOr<v1::MatmulRequest> MatmulRequestFromKServe(
    const inference::ModelInferRequest& request, const WeightSpec& spec);

// Echoes the request's model name and id, and returns C as output "c" with the
// input's datatype and rank ([M, N], or [N] for a 1-D input), and the kernel
// that ran as the string parameter kKServeKernelParameter. C always travels in
// raw_output_contents, even when A came as fp32_contents: one layout for
// clients to read, and no per-element copy. `request` must be one that
// MatmulRequestFromKServe accepted.
void FillKServeInferResponse(const inference::ModelInferRequest& request,
                             v1::MatmulResponse matmul,
                             inference::ModelInferResponse* response);

// A bound on the bytes FillKServeInferResponse's reply to `request` holds
// besides the MatmulResponse's (C and the kernel name): the echoed model name
// and id, the datatype, and the tags and lengths around them.
int64_t KServeInferReplyEnvelopeBytes(
    const inference::ModelInferRequest& request);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_KSERVE_CONVERSIONS_H_
