#include "server/operations/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace nibble::server {

std::string EscapeLabelValue(absl::string_view value) {
  std::string escaped;
  escaped.reserve(value.size());
  for (const char c : value) {
    switch (c) {
      case '\\':
        escaped += "\\\\";
        break;
      case '"':
        escaped += "\\\"";
        break;
      case '\n':
        escaped += "\\n";
        break;
      default:
        escaped += c;
    }
  }
  return escaped;
}

namespace {

using Labels =
    std::initializer_list<std::pair<absl::string_view, absl::string_view>>;

// Shortest text that parses back to `value`, in the style of Prometheus's Go
// client ("0.0001", "5e-05", "+Inf"), so that bucket labels look familiar.
std::string FormatDouble(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const std::to_chars_result result = std::to_chars(
      buffer, buffer + sizeof(buffer), value, std::chars_format::general);
  return std::string(buffer, result.ptr);
}

// Appends families of samples to one exposition text.
class Exposition {
 public:
  // Starts the family `name`; its samples must follow.
  void Family(absl::string_view name, absl::string_view type,
              absl::string_view help) {
    std::string escaped_help;
    for (const char c : help) {
      if (c == '\\') {
        escaped_help += "\\\\";
      } else if (c == '\n') {
        escaped_help += "\\n";
      } else {
        escaped_help += c;
      }
    }
    absl::StrAppend(&text_, "# HELP ", name, " ", escaped_help, "\n", "# TYPE ",
                    name, " ", type, "\n");
  }

  // A gauge family of one unlabelled sample.
  void Gauge(absl::string_view name, absl::string_view help, int64_t value) {
    Family(name, "gauge", help);
    Sample(name, {}, value);
  }

  void Sample(absl::string_view name, Labels labels, absl::string_view value) {
    Sample(name, labels, {}, value);
  }
  void Sample(absl::string_view name, Labels labels, int64_t value) {
    Sample(name, labels, {}, absl::StrCat(value));
  }

  // The _bucket, _sum and _count samples of a histogram family `name`.
  void HistogramSamples(absl::string_view name, Labels labels,
                        const Histogram& histogram) {
    const std::string bucket = absl::StrCat(name, "_bucket");
    const std::span<const double> bounds = histogram.upper_bounds();
    const std::vector<int64_t> cumulative = histogram.CumulativeCounts();
    for (size_t i = 0; i < cumulative.size(); ++i) {
      const std::string le =
          i < bounds.size() ? FormatDouble(bounds[i]) : std::string("+Inf");
      Sample(bucket, labels, {"le", le}, absl::StrCat(cumulative[i]));
    }
    Sample(absl::StrCat(name, "_sum"), labels, {},
           FormatDouble(histogram.sum()));
    Sample(absl::StrCat(name, "_count"), labels, {},
           absl::StrCat(histogram.count()));
  }

  std::string Take() { return std::move(text_); }

 private:
  // `extra` is one more label after `labels`, left out when its name is
  // empty.
  void Sample(absl::string_view name, Labels labels,
              std::pair<absl::string_view, absl::string_view> extra,
              absl::string_view value) {
    text_.append(name.data(), name.size());
    if (labels.size() > 0 || !extra.first.empty()) {
      text_ += '{';
      bool first = true;
      auto append = [&](absl::string_view label,
                        absl::string_view label_value) {
        absl::StrAppend(&text_, first ? "" : ",", label, "=\"",
                        EscapeLabelValue(label_value), "\"");
        first = false;
      };
      for (const auto& [label, label_value] : labels) {
        append(label, label_value);
      }
      if (!extra.first.empty()) append(extra.first, extra.second);
      text_ += '}';
    }
    absl::StrAppend(&text_, " ", value, "\n");
  }

  std::string text_;
};

// gRPC's name for a status code: "OK", "CANCELLED", ... (absl's codes are
// gRPC's).
std::string CodeName(int code) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

void RenderRpcs(const std::vector<RpcMethodStats>& rpcs, Exposition& out) {
  out.Family("nibble_rpc_requests_total", "counter",
             "gRPC calls finished, by full method name and status code.");
  for (const RpcMethodStats& method : rpcs) {
    for (int code = 0; code < kGrpcStatusCodes; ++code) {
      if (method.calls_by_code[code] == 0) continue;
      out.Sample("nibble_rpc_requests_total",
                 {{"method", method.method}, {"code", CodeName(code)}},
                 method.calls_by_code[code]);
    }
  }
  out.Family("nibble_rpc_duration_seconds", "histogram",
             "Time from a gRPC call's arrival to its status being sent; a "
             "stream is one call.");
  for (const RpcMethodStats& method : rpcs) {
    out.HistogramSamples("nibble_rpc_duration_seconds",
                         {{"method", method.method}}, method.duration_seconds);
  }
}

// One series per GPU weights are placed on, labelled with its device
// ordinal; none on the CPU backend.
void RenderGpus(const MetricsSnapshot& snapshot, Exposition& out) {
  struct GpuFamily {
    const char* name;
    const char* help;
    int64_t (*value)(const GpuGauge&);
  };
  static constexpr GpuFamily kFamilies[] = {
      {"nibble_gpu_resident_bytes",
       "Bytes of GPU memory the resident weights take on this GPU "
       "(--backend=cuda).",
       [](const GpuGauge& gpu) { return gpu.usage.resident_bytes; }},
      {"nibble_gpu_reserved_bytes",
       "Bytes of GPU memory reserved on this GPU by uploads in progress.",
       [](const GpuGauge& gpu) { return gpu.usage.reserved_bytes; }},
      {"nibble_max_gpu_bytes",
       "The budget for GPU memory held by weights on this GPU "
       "(--max_gpu_bytes); 0 for none.",
       [](const GpuGauge& gpu) { return gpu.usage.max_bytes; }},
      {"nibble_gpu_free_bytes",
       "Bytes of memory free on this GPU, as the driver reports them.",
       [](const GpuGauge& gpu) { return gpu.free_bytes; }},
  };
  std::map<int, int64_t> weights_by_gpu;
  for (const WeightGauge& weight : snapshot.weights) {
    if (weight.gpu >= 0) ++weights_by_gpu[weight.gpu];
  }
  out.Family("nibble_gpu_weights", "gauge",
             "Resident weights on this GPU (--backend=cuda).");
  for (const GpuGauge& gpu : snapshot.gpus) {
    out.Sample("nibble_gpu_weights", {{"gpu", absl::StrCat(gpu.usage.gpu)}},
               weights_by_gpu[gpu.usage.gpu]);
  }
  for (const GpuFamily& family : kFamilies) {
    out.Family(family.name, "gauge", family.help);
    for (const GpuGauge& gpu : snapshot.gpus) {
      out.Sample(family.name, {{"gpu", absl::StrCat(gpu.usage.gpu)}},
                 family.value(gpu));
    }
  }
}

void RenderWeights(const MetricsSnapshot& snapshot, Exposition& out) {
  const std::vector<WeightGauge>& weights = snapshot.weights;
  int64_t total_bytes = 0;
  for (const WeightGauge& weight : weights) {
    total_bytes += weight.resident_bytes;
  }
  out.Gauge("nibble_weights", "Weights resident.",
            static_cast<int64_t>(weights.size()));
  out.Gauge("nibble_resident_weight_bytes",
            "Bytes of memory all resident weights take, packed.", total_bytes);
  out.Family("nibble_weight_bytes", "gauge",
             "Bytes of memory one resident weight takes, packed; none without "
             "weight labels.");
  for (const WeightGauge& weight : weights) {
    if (!snapshot.weight_labels) break;
    out.Sample("nibble_weight_bytes", {{"weight", weight.name}},
               weight.resident_bytes);
  }
  out.Gauge("nibble_reserved_weight_bytes",
            "Bytes reserved against the budget by uploads in progress.",
            snapshot.reserved_weight_bytes);
  out.Gauge("nibble_max_weight_bytes",
            "The budget for resident and reserved weight bytes "
            "(--max_weight_bytes); 0 for none.",
            snapshot.max_weight_bytes);
  out.Gauge("nibble_max_weights",
            "The most weights held resident plus uploads in progress "
            "(--max_weights); 0 for none.",
            snapshot.max_weights);
  out.Gauge("nibble_held_reply_bytes",
            "Bytes of matmul replies held for clients until they are sent.",
            snapshot.held_reply_bytes);
  out.Gauge("nibble_max_held_reply_bytes",
            "The budget for held reply bytes (--max_held_reply_bytes); 0 for "
            "none.",
            snapshot.max_held_reply_bytes);
  RenderGpus(snapshot, out);
}

void RenderBatcher(const BatcherStats& stats, bool weight_labels,
                   absl::string_view backend, Exposition& out) {
  // Without weight labels, one series of all weights.
  WeightMatmulCounts all_weights;
  for (const auto& [weight, counts] : stats.run_by_weight) {
    all_weights.requests += counts.requests;
    all_weights.rows += counts.rows;
  }
  out.Family("nibble_matmul_requests_total", "counter",
             "Matmul requests run, by weight name, or of all weights in one "
             "series without weight labels.");
  if (!weight_labels) {
    out.Sample("nibble_matmul_requests_total", {}, all_weights.requests);
  }
  for (const auto& [weight, counts] : stats.run_by_weight) {
    if (!weight_labels) break;
    out.Sample("nibble_matmul_requests_total", {{"weight", weight}},
               counts.requests);
  }
  out.Family("nibble_matmul_rows_total", "counter",
             "Rows of A run, by weight name, or of all weights in one series "
             "without weight labels.");
  if (!weight_labels) {
    out.Sample("nibble_matmul_rows_total", {}, all_weights.rows);
  }
  for (const auto& [weight, counts] : stats.run_by_weight) {
    if (!weight_labels) break;
    out.Sample("nibble_matmul_rows_total", {{"weight", weight}}, counts.rows);
  }
  out.Family("nibble_matmul_dropped_total", "counter",
             "Matmul requests admitted to no kernel call: refused because "
             "their weight's queue was full or the server was shutting down, "
             "or dropped from the queue past their deadline or cancelled.");
  out.Sample("nibble_matmul_dropped_total", {{"reason", "queue_full"}},
             stats.requests_refused_queue_full);
  out.Sample("nibble_matmul_dropped_total", {{"reason", "shutting_down"}},
             stats.requests_refused_shutting_down);
  out.Sample("nibble_matmul_dropped_total", {{"reason", "expired"}},
             stats.requests_expired);
  out.Sample("nibble_matmul_dropped_total", {{"reason", "cancelled"}},
             stats.requests_cancelled);

  int64_t queued_rows = 0;
  for (const auto& [weight, rows] : stats.queued_rows_by_weight) {
    queued_rows += rows;
  }
  out.Gauge("nibble_queued_rows",
            "Rows of A waiting for a kernel call, all weights.", queued_rows);
  out.Family("nibble_weight_queued_rows", "gauge",
             "Rows of A waiting for a kernel call, by weight name; weights "
             "with none are left out, and all without weight labels.");
  for (const auto& [weight, rows] : stats.queued_rows_by_weight) {
    if (!weight_labels) break;
    out.Sample("nibble_weight_queued_rows", {{"weight", weight}}, rows);
  }

  out.Family("nibble_batch_rows", "histogram",
             "Rows of A per kernel call: how well requests are merged.");
  out.HistogramSamples("nibble_batch_rows", {}, stats.batch_rows);
  out.Family("nibble_matmul_queue_seconds", "histogram",
             "Time a matmul request waited before its kernel call started; 0 "
             "for one run at once.");
  out.HistogramSamples("nibble_matmul_queue_seconds", {}, stats.queue_seconds);
  out.Family("nibble_matmul_kernel_seconds", "histogram",
             "Per matmul request run: its kernel call, which may serve several "
             "merged requests (on a GPU with the copies of A and C).");
  out.HistogramSamples("nibble_matmul_kernel_seconds", {{"backend", backend}},
                       stats.kernel_seconds);
  out.Family("nibble_matmul_reply_seconds", "histogram",
             "Per matmul request run: from its kernel call's end to its reply "
             "handed to gRPC, built and (unary) serialized; a batch's replies "
             "are handed over in turn by its reply threads.");
  out.HistogramSamples("nibble_matmul_reply_seconds", {{"backend", backend}},
                       stats.reply_seconds);
  out.Family("nibble_batch_compute_seconds", "histogram",
             "Wall time of one kernel call, which may serve several merged "
             "requests.");
  out.HistogramSamples("nibble_batch_compute_seconds", {},
                       stats.compute_seconds);
}

void RenderGpuRunStages(const cuda::RunStageTimes& stages, Exposition& out) {
  out.Family("nibble_gpu_runs_total", "counter",
             "Runs of the CUDA kernels (one per kernel call on the GPU).");
  out.Sample("nibble_gpu_runs_total", {}, stages.runs);
  out.Family("nibble_gpu_run_stage_seconds_total", "counter",
             "Host time of the CUDA kernels' runs by stage: waiting for a "
             "lane, gathering A into pinned staging, waiting for the GPU's "
             "copy in, kernel and copy out, scattering C into the replies.");
  for (const auto& [stage, nanoseconds] :
       {std::pair<absl::string_view, int64_t>{"lane_wait", stages.lane_wait_ns},
        {"gather", stages.gather_ns},
        {"device", stages.device_ns},
        {"scatter", stages.scatter_ns}}) {
    out.Sample("nibble_gpu_run_stage_seconds_total", {{"stage", stage}},
               FormatDouble(nanoseconds * 1e-9));
  }
}

}  // namespace

std::string RenderPrometheusText(const MetricsSnapshot& snapshot) {
  Exposition out;
  out.Family("nibble_build_info", "gauge",
             "Always 1; the version label names the nibbled build.");
  out.Sample("nibble_build_info", {{"version", NIBBLE_VERSION}}, 1);
  out.Gauge("nibble_serving",
            "Whether nibbled takes new calls (1) or is shutting down (0).",
            snapshot.serving ? 1 : 0);
  RenderRpcs(snapshot.rpcs, out);
  RenderWeights(snapshot, out);
  RenderBatcher(snapshot.batcher, snapshot.weight_labels, snapshot.backend,
                out);
  RenderGpuRunStages(snapshot.gpu_run_stages, out);
  return out.Take();
}

}  // namespace nibble::server
