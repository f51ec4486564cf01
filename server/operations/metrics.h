// nibbled's metrics in the Prometheus text exposition format (version 0.0.4),
// rendered from a plain snapshot that the server fills from its parts: the
// RPC counters, the batcher's stats and the resident weights.
//
// Example:
//   nibble::server::MetricsSnapshot snapshot{
//       .rpcs = rpc_stats.Snapshot(),
//       .batcher = batcher.Stats(),
//       .weights = {{.name = "proj", .resident_bytes = 8650752}},
//       .serving = true};
//   std::string text = nibble::server::RenderPrometheusText(snapshot);
//   // # HELP nibble_serving Whether nibbled takes new calls (1) or ...
//   // # TYPE nibble_serving gauge
//   // nibble_serving 1
//   // ...
//
// Metrics, all prefixed nibble_:
//   build_info{version}                    gauge, always 1
//   serving                                gauge, 1 or 0
//   rpc_requests_total{method,code}        counter; method is gRPC's full
//                                          name, "/nibble.v1.NibbleService/
//                                          Matmul"; code is "OK",
//                                          "INVALID_ARGUMENT", ...
//   rpc_duration_seconds{method}           histogram
//   weights                                gauge
//   resident_weight_bytes                  gauge, all weights
//   weight_bytes{weight}                   gauge
//   reserved_weight_bytes                  gauge, held by uploads in progress
//   max_weight_bytes                       gauge, the budget; 0 for none
//   max_weights                            gauge, --max_weights; 0 for none
//   held_reply_bytes                       gauge, matmul replies not yet sent
//   max_held_reply_bytes                   gauge, their budget; 0 for none
//   gpu_weights{gpu}                       gauge, per GPU weights are placed
//                                          on (--backend=cuda; none on the
//                                          CPU): its resident weights
//   gpu_resident_bytes{gpu}                gauge, GPU memory they take
//   gpu_reserved_bytes{gpu}                gauge, reserved by uploads in
//                                          progress
//   max_gpu_bytes{gpu}                     gauge, the GPU's budget
//                                          (--max_gpu_bytes); 0 for none
//   gpu_free_bytes{gpu}                    gauge, the GPU's free memory
//   matmul_requests_total{weight}          counter, requests run (no label
//                                          without weight labels)
//   matmul_rows_total{weight}              counter, rows of A run (same)
//   matmul_dropped_total{reason}           counter; reason is queue_full,
//                                          shutting_down, expired, cancelled
//   queued_rows                            gauge, rows of A waiting, all
//                                          weights
//   weight_queued_rows{weight}             gauge, weights with rows waiting
//   batch_rows                             histogram, rows per kernel call
//   matmul_queue_seconds                   histogram, per request run
//   matmul_kernel_seconds{backend}         histogram, per request run: its
//                                          kernel call; backend is "cpu" or
//                                          "cuda"
//   matmul_reply_seconds{backend}          histogram, per request run: the
//                                          kernel call's end to its reply
//                                          handed to gRPC
//   batch_compute_seconds                  histogram, per kernel call
//   gpu_runs_total                         counter, CUDA kernel runs
//   gpu_run_stage_seconds_total{stage}     counter, their host time by stage:
//                                          lane_wait, gather, device, scatter
#ifndef NIBBLE_SERVER_OPERATIONS_METRICS_H_
#define NIBBLE_SERVER_OPERATIONS_METRICS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/cuda/cuda_backend.h"
#include "server/core/batcher.h"
#include "server/core/weight_store.h"
#include "server/edge/rpc_metrics.h"

namespace nibble::server {

struct WeightGauge {
  std::string name;
  int64_t resident_bytes = 0;
  // The GPU holding its device copy (DeviceWeight::device); -1 for none.
  int gpu = -1;
};

struct GpuGauge {
  GpuUsage usage;
  // As the driver reports it.
  int64_t free_bytes = 0;
};

// What one scrape reports; every part is a copy, so rendering holds no lock.
struct MetricsSnapshot {
  std::vector<RpcMethodStats> rpcs;
  BatcherStats batcher;
  std::vector<WeightGauge> weights;
  // Held by uploads in progress (see WeightStore::Reserve).
  int64_t reserved_weight_bytes = 0;
  // --max_weight_bytes in effect; 0 for none.
  int64_t max_weight_bytes = 0;
  // --max_weights in effect; 0 for none.
  int64_t max_weights = 0;
  // Matmul replies held until sent, and their budget (ReplyBudget); 0 for
  // none.
  int64_t held_reply_bytes = 0;
  int64_t max_held_reply_bytes = 0;
  // Each GPU weights are placed on (WeightStore::gpu_usage); none on the
  // CPU backend.
  std::vector<GpuGauge> gpus = {};
  // Where matmuls run (BackendName): "cpu" or "cuda".
  std::string backend = "cpu";
  // The CUDA kernels' runs by stage; none on the CPU backend.
  cuda::RunStageTimes gpu_run_stages = {};
  // False once the server is shutting down.
  bool serving = false;
  // Whether series may name weights (--metrics_weight_labels): without,
  // weight_bytes and weight_queued_rows have no samples, and
  // matmul_requests_total and matmul_rows_total one each, unlabelled, for
  // all weights.
  bool weight_labels = true;
};

// The body of a /metrics answer, Content-Type kPrometheusContentType.
std::string RenderPrometheusText(const MetricsSnapshot& snapshot);

inline constexpr char kPrometheusContentType[] =
    "text/plain; version=0.0.4; charset=utf-8";

// `value` with backslash, double quote and newline escaped, as a label value
// between double quotes must be.
std::string EscapeLabelValue(absl::string_view value);

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_OPERATIONS_METRICS_H_
