#include "server/edge/triton_conversions.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/edge/kserve_conversions.h"

namespace nibble::server {
namespace {

uint64_t Nanoseconds(absl::Duration duration) {
  return static_cast<uint64_t>(
      std::max<int64_t>(0, absl::ToInt64Nanoseconds(duration)));
}

void SetDuration(int64_t count, absl::Duration total,
                 inference::StatisticDuration* duration) {
  duration->set_count(static_cast<uint64_t>(count));
  duration->set_ns(Nanoseconds(total));
}

void SetParameter(inference::ModelConfig* config, const std::string& key,
                  std::string value) {
  (*config->mutable_parameters())[key].set_string_value(std::move(value));
}

}  // namespace

void FillTritonModelConfig(absl::string_view model_name, const WeightSpec& spec,
                           const BatcherOptions& batching,
                           inference::ModelConfig* config) {
  config->set_name(std::string(model_name));
  config->set_platform(kKServePlatform);
  config->set_backend(kKServePlatform);
  config->set_max_batch_size(static_cast<int32_t>(std::min<int64_t>(
      batching.max_batch_rows, std::numeric_limits<int32_t>::max())));
  inference::ModelInput* input = config->add_input();
  input->set_name(kKServeInputName);
  input->set_data_type(inference::TYPE_FP32);
  input->add_dims(spec.k);
  inference::ModelOutput* output = config->add_output();
  output->set_name(kKServeOutputName);
  output->set_data_type(inference::TYPE_FP32);
  output->add_dims(spec.n);
  config->mutable_dynamic_batching()->set_max_queue_delay_microseconds(
      static_cast<uint64_t>(std::max<int64_t>(
          0, absl::ToInt64Microseconds(batching.max_batch_delay))));
  SetParameter(config, "format", std::string(WeightFormatName(spec.format)));
  SetParameter(config, "group_size", absl::StrCat(spec.group_size));
  SetParameter(config, "k", absl::StrCat(spec.k));
  SetParameter(config, "n", absl::StrCat(spec.n));
}

void FillTritonModelStatistics(absl::string_view model_name,
                               const WeightMatmulCounts& counts,
                               inference::ModelStatistics* statistics) {
  statistics->set_name(std::string(model_name));
  statistics->set_version(kKServeModelVersion);
  if (counts.last_run != absl::InfinitePast()) {
    statistics->set_last_inference(
        static_cast<uint64_t>(absl::ToUnixMillis(counts.last_run)));
  }
  statistics->set_inference_count(
      static_cast<uint64_t>(counts.rows - counts.failed_rows));
  statistics->set_execution_count(static_cast<uint64_t>(counts.batches));
  inference::InferStatistics* infer = statistics->mutable_inference_stats();
  const absl::Duration request_time = counts.queue_time + counts.compute_time;
  SetDuration(counts.requests - counts.failed_requests,
              request_time - counts.failed_time, infer->mutable_success());
  SetDuration(counts.failed_requests, counts.failed_time,
              infer->mutable_fail());
  SetDuration(counts.requests, counts.queue_time, infer->mutable_queue());
  SetDuration(counts.requests, absl::ZeroDuration(),
              infer->mutable_compute_input());
  SetDuration(counts.requests, counts.compute_time,
              infer->mutable_compute_infer());
  SetDuration(counts.requests, absl::ZeroDuration(),
              infer->mutable_compute_output());
  for (const auto& [rows, size] : counts.batches_by_rows) {
    inference::InferBatchStatistics* batch = statistics->add_batch_stats();
    batch->set_batch_size(static_cast<uint64_t>(rows));
    SetDuration(size.batches, absl::ZeroDuration(),
                batch->mutable_compute_input());
    SetDuration(size.batches, size.compute_time,
                batch->mutable_compute_infer());
    SetDuration(size.batches, absl::ZeroDuration(),
                batch->mutable_compute_output());
  }
}

}  // namespace nibble::server
