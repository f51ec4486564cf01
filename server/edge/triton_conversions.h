// Triton's extensions of the Open Inference Protocol, in nibble's terms: a
// resident weight's model configuration and its statistics, filled from the
// weight's spec, the batcher's options and the batcher's own counters. Kept
// apart from the service so that each rule can be tested on its own.
//
// Example:
//   inference::ModelConfigResponse response;
//   nibble::server::FillTritonModelConfig("w", spec, batching,
//                                         response.mutable_config());
#ifndef NIBBLE_SERVER_EDGE_TRITON_CONVERSIONS_H_
#define NIBBLE_SERVER_EDGE_TRITON_CONVERSIONS_H_

#include "absl/strings/string_view.h"
#include "format/weight_format.h"
#include "inference/grpc_predict_v2.pb.h"
#include "inference/model_config.pb.h"
#include "server/core/batcher.h"

namespace nibble::server {

// What RepositoryIndex reports for every resident weight: it is served.
inline constexpr char kTritonReadyState[] = "READY";

// The configuration of the model serving a weight of `spec`: input "a" [K]
// and output "c" [N] after the batch dimension, reported as TYPE_FP32 as
// ModelMetadata reports them (FP16 and BF16 are accepted too), up to
// batching.max_batch_rows rows per kernel call (max_batch_size) merged within
// batching.max_batch_delay (dynamic_batching), and the weight's format,
// group size, K and N as parameters.
void FillTritonModelConfig(absl::string_view model_name, const WeightSpec& spec,
                           const BatcherOptions& batching,
                           inference::ModelConfig* config);

// The statistics of a model from the batcher's counts of its weight, in
// Triton's shape: inference_count counts the rows (batch elements) of
// successful kernel calls, execution_count kernel calls; success and fail count
// requests, their time the queue wait plus the kernel call of each; queue and
// compute_infer are summed over requests, and batch_stats over the kernel calls
// of each size. nibble has no separate input or output step: compute_input and
// compute_output count the requests with no time.
void FillTritonModelStatistics(absl::string_view model_name,
                               const WeightMatmulCounts& counts,
                               inference::ModelStatistics* statistics);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_TRITON_CONVERSIONS_H_
