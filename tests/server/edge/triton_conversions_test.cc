// Triton's model configuration and statistics as nibbled fills them, from
// hand-made specs, batcher options and counts.
#include "server/edge/triton_conversions.h"

#include <cstdint>
#include <random>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::ElementsAre;

TEST(TritonModelConfigTest, TensorsBatchingAndWeightParameters) {
  const WeightSpec spec{WeightFormat::kNvfp4, 256, 72, 16, 0.5f};
  inference::ModelConfig config;
  FillTritonModelConfig(
      "proj", spec,
      {.max_batch_rows = 24, .max_batch_delay = absl::Microseconds(300)},
      &config);
  EXPECT_EQ(config.name(), "proj");
  EXPECT_EQ(config.platform(), "nibble");
  EXPECT_EQ(config.max_batch_size(), 24);
  ASSERT_EQ(config.input_size(), 1);
  EXPECT_EQ(config.input(0).name(), "a");
  EXPECT_EQ(config.input(0).data_type(), inference::TYPE_FP32);
  EXPECT_THAT(config.input(0).dims(), ElementsAre(256));
  ASSERT_EQ(config.output_size(), 1);
  EXPECT_EQ(config.output(0).name(), "c");
  EXPECT_THAT(config.output(0).dims(), ElementsAre(72));
  EXPECT_EQ(config.dynamic_batching().max_queue_delay_microseconds(), 300u);
  EXPECT_EQ(config.parameters().at("format").string_value(), "nvfp4");
  EXPECT_EQ(config.parameters().at("group_size").string_value(), "16");
  EXPECT_EQ(config.parameters().at("k").string_value(), "256");
  EXPECT_EQ(config.parameters().at("n").string_value(), "72");
}

TEST(TritonModelConfigTest, MaxBatchSizeIsCutToInt32) {
  inference::ModelConfig config;
  FillTritonModelConfig("w", {WeightFormat::kU4, 64, 8, 32},
                        {.max_batch_rows = int64_t{1} << 40}, &config);
  EXPECT_EQ(config.max_batch_size(), 2147483647);
}

TEST(TritonModelStatisticsTest, NothingRunIsAllZeroWithNoLastInference) {
  inference::ModelStatistics statistics;
  FillTritonModelStatistics("idle", WeightMatmulCounts{}, &statistics);
  EXPECT_EQ(statistics.name(), "idle");
  EXPECT_EQ(statistics.version(), "1");
  EXPECT_EQ(statistics.last_inference(), 0u);
  EXPECT_EQ(statistics.inference_count(), 0u);
  EXPECT_EQ(statistics.execution_count(), 0u);
  EXPECT_EQ(statistics.inference_stats().success().count(), 0u);
  EXPECT_EQ(statistics.batch_stats_size(), 0);
}

TEST(TritonModelStatisticsTest, CountsAndDurationsFollowTheBatcher) {
  const uint64_t seed = 7350;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> small(1, 1000);
  WeightMatmulCounts counts;
  counts.requests = 40 + small(rng);
  counts.failed_requests = small(rng) % 40;
  counts.rows = 2 * counts.requests;
  counts.failed_rows = 2 * counts.failed_requests;
  counts.queue_time = absl::Microseconds(small(rng));
  counts.compute_time = absl::Microseconds(small(rng));
  counts.failed_time = (counts.queue_time + counts.compute_time) / 4;
  counts.last_run = absl::FromUnixMillis(1'700'000'000'123);
  counts.batches_by_rows[1] = {.batches = 3,
                               .compute_time = absl::Nanoseconds(30)};
  counts.batches_by_rows[7] = {.batches = 2,
                               .compute_time = absl::Nanoseconds(500)};
  counts.batches = 5;

  inference::ModelStatistics statistics;
  FillTritonModelStatistics("w", counts, &statistics);
  EXPECT_EQ(statistics.last_inference(), 1'700'000'000'123u);
  EXPECT_EQ(statistics.inference_count(),
            static_cast<uint64_t>(counts.rows - counts.failed_rows));
  EXPECT_EQ(statistics.execution_count(), 5u);
  const inference::InferStatistics& infer = statistics.inference_stats();
  const auto ns = [](absl::Duration d) {
    return static_cast<uint64_t>(absl::ToInt64Nanoseconds(d));
  };
  EXPECT_EQ(infer.success().count(),
            static_cast<uint64_t>(counts.requests - counts.failed_requests));
  EXPECT_EQ(infer.fail().count(),
            static_cast<uint64_t>(counts.failed_requests));
  EXPECT_EQ(infer.success().ns() + infer.fail().ns(),
            ns(counts.queue_time + counts.compute_time));
  EXPECT_EQ(infer.fail().ns(), ns(counts.failed_time));
  EXPECT_EQ(infer.queue().count(), static_cast<uint64_t>(counts.requests));
  EXPECT_EQ(infer.queue().ns(), ns(counts.queue_time));
  EXPECT_EQ(infer.compute_infer().ns(), ns(counts.compute_time));
  EXPECT_EQ(infer.compute_input().ns(), 0u);
  EXPECT_EQ(infer.compute_output().ns(), 0u);
  ASSERT_EQ(statistics.batch_stats_size(), 2);
  EXPECT_EQ(statistics.batch_stats(0).batch_size(), 1u);
  EXPECT_EQ(statistics.batch_stats(0).compute_infer().count(), 3u);
  EXPECT_EQ(statistics.batch_stats(0).compute_infer().ns(), 30u);
  EXPECT_EQ(statistics.batch_stats(1).batch_size(), 7u);
  EXPECT_EQ(statistics.batch_stats(1).compute_infer().count(), 2u);
  EXPECT_EQ(statistics.batch_stats(1).compute_infer().ns(), 500u);
}

}  // namespace
}  // namespace nibble::server
