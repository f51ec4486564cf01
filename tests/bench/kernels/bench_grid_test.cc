// Tests which kernels nibble-bench times for a problem, with mock kernels,
// and one small grid on the real CPU kernels.
#include "bench/kernels/bench_grid.h"

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/scheduler.h"
#include "tests/kernels/mock_gemm_kernel.h"

namespace nibble::bench {
namespace {

using ::nibble::testing::MockGemmKernel;
using ::testing::_;
using ::testing::NiceMock;
using ::testing::Return;

class FastKernelsTest : public ::testing::Test {
 protected:
  const GemmKernel* Add(absl::string_view name, KernelVariant variant,
                        bool supports) {
    auto kernel = std::make_unique<NiceMock<MockGemmKernel>>();
    ON_CALL(*kernel, name()).WillByDefault(Return(name));
    ON_CALL(*kernel, variant()).WillByDefault(Return(variant));
    ON_CALL(*kernel, Supports(_)).WillByDefault(Return(supports));
    kernels_.push_back(std::move(kernel));
    registered_.push_back(kernels_.back().get());
    return registered_.back();
  }

  std::vector<const GemmKernel*> registered_;

 private:
  std::vector<std::unique_ptr<NiceMock<MockGemmKernel>>> kernels_;
};

TEST_F(FastKernelsTest, FirstSupportingKernelOfEachFastVariantInOrder) {
  const GemmKernel* striped = Add("striped", KernelVariant::kStriped, true);
  Add("fused_unsupported", KernelVariant::kFused, false);
  const GemmKernel* fused = Add("fused", KernelVariant::kFused, true);
  Add("fused_second", KernelVariant::kFused, true);
  Add("reference", KernelVariant::kReference, true);
  EXPECT_THAT(FastKernels(registered_, GemmProblem{}),
              ::testing::ElementsAre(fused, striped));
}

PointResult TimedPoint(double fused_us, double striped_us) {
  PointResult point;
  point.kernels = {
      {.kernel = "fused", .timing = {.median_us = fused_us, .calls = 3}},
      {.kernel = "striped", .timing = {.median_us = striped_us, .calls = 5}}};
  return point;
}

TEST(MedianOverRoundsTest, TakesEachKernelsMedianAndSumsTheCalls) {
  const std::vector<PointResult> merged =
      MedianOverRounds({{TimedPoint(10, 40), TimedPoint(1, 2)},
                        {TimedPoint(30, 20), TimedPoint(3, 2)},
                        {TimedPoint(20, 90), TimedPoint(2, 2)}});
  ASSERT_EQ(merged.size(), 2u);
  EXPECT_EQ(merged[0].kernels[0].timing.median_us, 20);
  EXPECT_EQ(merged[0].kernels[1].timing.median_us, 40);
  EXPECT_EQ(merged[0].kernels[0].timing.calls, 9);
  EXPECT_EQ(merged[1].kernels[0].timing.median_us, 2);
  EXPECT_EQ(merged[1].kernels[1].timing.calls, 15);
  EXPECT_TRUE(MedianOverRounds({}).empty());
}

// Each dtype times the kernels that support it: at one row the fused one is
// the bf16 fused kernel for bf16 A where the CPU has AVX-512 BF16, and for
// f32 and f16 A too on the avx512_bf16 level (the amx level rounds them
// from 16 rows).
TEST(TimeWeightDtypeTest, TimesTheKernelsOfTheDtype) {
  ThreadPool pool(2);
  const Scheduler scheduler(cpu::CpuKernels());
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const absl::StatusOr<std::vector<PointResult>> results =
        TimeWeight({WeightFormat::kU4b8, 32}, {256, 64}, {1},
                   ActivationPrecision::kBf16, dtype, scheduler, pool,
                   /*repeats=*/2, /*llc_bytes=*/1 << 20, [](int64_t) {});
    ASSERT_TRUE(results.ok()) << results.status();
    ASSERT_EQ(results->size(), 1u);
    const std::vector<const GemmKernel*> fast =
        FastKernels(scheduler.kernels(), {.m = 1,
                                          .n = 64,
                                          .k = 256,
                                          .format = WeightFormat::kU4b8,
                                          .group_size = 32,
                                          .dtype = dtype,
                                          .threads = 2});
    ASSERT_FALSE(fast.empty());
    EXPECT_EQ(results->front().kernels.front().kernel, fast.front()->name());
    EXPECT_EQ(results->front().kernels.front().kernel.find("_avx512_bf16") !=
                  std::string::npos,
              dtype == DType::kBF16
                  ? cpu::DetectIsa() >= cpu::Isa::kAvx512Bf16
                  : cpu::DetectIsa() == cpu::Isa::kAvx512Bf16);
  }
}

class TimeWeightTest : public ::testing::TestWithParam<ActivationPrecision> {};

INSTANTIATE_TEST_SUITE_P(EveryPrecision, TimeWeightTest,
                         ::testing::ValuesIn(kAllActivationPrecisions));

TEST_P(TimeWeightTest, TimesEveryFastVariantAndMarksThePick) {
  ThreadPool pool(2);
  const Scheduler scheduler(cpu::CpuKernels());
  std::vector<int64_t> announced;
  const absl::StatusOr<std::vector<PointResult>> results =
      TimeWeight({WeightFormat::kU4, 32}, {256, 64}, {1, 9}, GetParam(),
                 DType::kF32, scheduler, pool,
                 /*repeats=*/2, /*llc_bytes=*/1 << 20,
                 [&](int64_t m) { announced.push_back(m); });
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_THAT(announced, ::testing::ElementsAre(1, 9));
  ASSERT_EQ(results->size(), 2u);
  for (const PointResult& result : *results) {
    SCOPED_TRACE(result.m);
    EXPECT_EQ(result.threads, 2);
    EXPECT_EQ(result.weight_bytes, 256 / 2 * 64 + 256 / 32 * 64 * 3);
    GemmProblem problem{.m = result.m,
                        .n = 64,
                        .k = 256,
                        .format = WeightFormat::kU4,
                        .group_size = 32,
                        .dtype = DType::kF32,
                        .threads = 2};
    // The fast variants as the default picks among them; the pick as asked.
    const std::vector<const GemmKernel*> fast =
        FastKernels(scheduler.kernels(), problem);
    problem.activation_precision = GetParam();
    ASSERT_GE(result.kernels.size(), fast.size());
    for (size_t i = 0; i < fast.size(); ++i) {
      EXPECT_EQ(result.kernels[i].kernel, fast[i]->name());
      EXPECT_EQ(result.kernels[i].timing.calls, 2);
      EXPECT_GT(result.kernels[i].timing.median_us, 0);
    }
    int picks = 0;
    for (const KernelTiming& timing : result.kernels) {
      if (timing.pick) {
        ++picks;
        EXPECT_EQ(timing.kernel, result.pick);
      }
    }
    EXPECT_EQ(picks, 1);
    EXPECT_EQ(result.pick, (*scheduler.Pick(problem))->name());
  }
}

}  // namespace
}  // namespace nibble::bench
