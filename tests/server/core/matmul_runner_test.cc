// Tests request validation and kernel dispatch of the matmul runner, with a
// mocked kernel so that only the runner's own logic is under test.
#include "server/core/matmul_runner.h"

#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/kernels/mock_gemm_kernel.h"

namespace nibble::server {
namespace {

using ::testing::_;
using ::testing::DoAll;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using ::testing::Return;
using ::testing::SaveArg;

class MatmulRunnerTest : public ::testing::Test {
 protected:
  MatmulRunnerTest()
      : weight_(*PackedWeight::Pack(
            RandomQuantizedWeight({WeightFormat::kFp4, 64, 24, 32}, 5))),
        pool_(2),
        scheduler_({&kernel_}),
        runner_(&scheduler_, &pool_) {
    ON_CALL(kernel_, name()).WillByDefault(Return("fused_fp4_mock"));
    ON_CALL(kernel_, variant()).WillByDefault(Return(KernelVariant::kFused));
    ON_CALL(kernel_, Supports).WillByDefault(Return(true));
  }

  static std::string Activations(int64_t m, int64_t k, DType dtype) {
    return std::string(m * k * DTypeSize(dtype), '\x01');
  }

  NiceMock<testing::MockGemmKernel> kernel_;
  PackedWeight weight_;
  ThreadPool pool_;
  Scheduler scheduler_;
  MatmulRunner runner_;
};

// The problem carries the precision; a kernel lossier than it never runs,
// and one that quantizes A loses precision.
TEST_F(MatmulRunnerTest, RunsAtTheGivenActivationPrecision) {
  ON_CALL(kernel_, QuantizesActivationsToInt8).WillByDefault(Return(true));
  EXPECT_TRUE(runner_.LosesPrecision(weight_, 3, DType::kF32,
                                     ActivationPrecision::kInt8));
  EXPECT_FALSE(runner_.LosesPrecision(weight_, 3, DType::kF32,
                                      ActivationPrecision::kBf16));
  GemmProblem problem;
  EXPECT_CALL(kernel_, Run)
      .WillOnce(DoAll(SaveArg<0>(&problem), Return(absl::OkStatus())));
  const std::string a = Activations(3, 64, DType::kF32);
  std::string c(3 * 24 * sizeof(float), '\0');
  const RowBlock block{.a = a.data(), .c = c.data(), .rows = 3};
  absl::StatusOr<MatmulRun> run = runner_.RunBlocks(
      weight_, DType::kF32, ActivationPrecision::kInt8, {block});
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(problem.activation_precision, ActivationPrecision::kInt8);
  EXPECT_EQ(
      runner_
          .RunBlocks(weight_, DType::kF32, ActivationPrecision::kExact, {block})
          .status()
          .code(),
      absl::StatusCode::kNotFound);
}

TEST_F(MatmulRunnerTest, RunsThePickedKernelOnTheRequestShape) {
  GemmProblem problem;
  GemmOperands operands;
  EXPECT_CALL(kernel_, Run)
      .WillOnce(DoAll(SaveArg<0>(&problem), SaveArg<1>(&operands),
                      Return(absl::OkStatus())));
  const std::string a = Activations(3, 64, DType::kBF16);
  absl::StatusOr<MatmulResult> result =
      runner_.Run(weight_, "w", 3, 64, DType::kBF16, a);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->kernel, "fused_fp4_mock");
  EXPECT_EQ(result->c.size(), 3u * 24 * 2);
  EXPECT_GE(result->compute_time_ns, 0);
  EXPECT_EQ(problem.m, 3);
  EXPECT_EQ(problem.n, 24);
  EXPECT_EQ(problem.k, 64);
  EXPECT_EQ(problem.format, WeightFormat::kFp4);
  EXPECT_EQ(problem.group_size, 32);
  EXPECT_EQ(problem.dtype, DType::kBF16);
  EXPECT_EQ(problem.threads, 2);
  EXPECT_EQ(operands.b, &weight_);
  EXPECT_EQ(operands.a, a.data());
}

TEST_F(MatmulRunnerTest, KernelReadsAGatheredByTheActivationOrder) {
  constexpr uint64_t kSeed = 8;
  constexpr int64_t kM = 3;
  constexpr int64_t kK = 64;
  QuantizedWeight canonical =
      RandomQuantizedWeight({WeightFormat::kFp4, kK, 24, 32}, kSeed);
  canonical.activation_order = RandomActivationOrder(kK, kSeed);
  const PackedWeight ordered = *PackedWeight::Pack(canonical);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const int64_t element_bytes = DTypeSize(dtype);
    std::string a(kM * kK * element_bytes, '\0');
    std::mt19937 rng(kSeed);
    for (char& byte : a) byte = static_cast<char>(rng());
    std::string seen;
    EXPECT_CALL(kernel_, Run)
        .WillOnce(
            [&](const GemmProblem&, const GemmOperands& operands, ThreadPool&) {
              seen.assign(static_cast<const char*>(operands.a), a.size());
              return absl::OkStatus();
            });
    ASSERT_TRUE(runner_.Run(ordered, "w", kM, kK, dtype, a).ok());
    ASSERT_EQ(seen.size(), a.size());
    for (int64_t i = 0; i < kM; ++i) {
      for (int64_t r = 0; r < kK; ++r) {
        const int64_t column = canonical.activation_order[r];
        ASSERT_EQ(seen.substr((i * kK + r) * element_bytes, element_bytes),
                  a.substr((i * kK + column) * element_bytes, element_bytes))
            << DTypeName(dtype) << " row " << i << " column " << r << " seed "
            << kSeed;
      }
    }
  }
}

TEST_F(MatmulRunnerTest, BlocksRunAsOneCallGatheredByTheActivationOrder) {
  constexpr uint64_t kSeed = 9;
  constexpr int64_t kK = 64;
  constexpr int64_t kN = 24;
  QuantizedWeight canonical =
      RandomQuantizedWeight({WeightFormat::kFp4, kK, kN, 32}, kSeed);
  canonical.activation_order = RandomActivationOrder(kK, kSeed);
  const PackedWeight ordered = *PackedWeight::Pack(canonical);
  const std::vector<int64_t> rows = {2, 1, 3};
  std::mt19937 rng(kSeed);
  std::vector<std::string> a;
  std::vector<std::string> c;
  std::vector<RowBlock> blocks;
  for (int64_t m : rows) {
    a.emplace_back(m * kK * sizeof(float), '\0');
    for (char& byte : a.back()) byte = static_cast<char>(rng());
    c.emplace_back(m * kN * sizeof(float), '\0');
  }
  for (size_t b = 0; b < rows.size(); ++b) {
    blocks.push_back({.a = a[b].data(), .c = c[b].data(), .rows = rows[b]});
  }
  std::string seen;
  // The kernel writes row i of C full of the byte i + 1.
  EXPECT_CALL(kernel_, Run)
      .WillOnce([&](const GemmProblem& problem, const GemmOperands& operands,
                    ThreadPool&) {
        EXPECT_EQ(problem.m, 6);
        seen.assign(static_cast<const char*>(operands.a),
                    problem.m * kK * sizeof(float));
        for (int64_t i = 0; i < problem.m; ++i) {
          std::memset(static_cast<char*>(operands.c) + i * kN * sizeof(float),
                      static_cast<int>(i + 1), kN * sizeof(float));
        }
        return absl::OkStatus();
      });
  absl::StatusOr<MatmulRun> run = runner_.RunBlocks(
      ordered, DType::kF32, ActivationPrecision::kBf16, blocks);
  ASSERT_TRUE(run.ok()) << run.status();
  EXPECT_EQ(run->kernel, "fused_fp4_mock");
  int64_t row = 0;
  for (size_t b = 0; b < rows.size(); ++b) {
    for (int64_t i = 0; i < rows[b]; ++i, ++row) {
      EXPECT_EQ(c[b].substr(i * kN * sizeof(float), kN * sizeof(float)),
                std::string(kN * sizeof(float), static_cast<char>(row + 1)))
          << "block " << b << " row " << i;
      for (int64_t r = 0; r < kK; ++r) {
        const int64_t column = canonical.activation_order[r];
        ASSERT_EQ(seen.substr((row * kK + r) * sizeof(float), sizeof(float)),
                  a[b].substr((i * kK + column) * sizeof(float), sizeof(float)))
            << "block " << b << " row " << i << " column " << r << " seed "
            << kSeed;
      }
    }
  }
}

TEST_F(MatmulRunnerTest, BlocksWithoutRowsAreRefused) {
  EXPECT_CALL(kernel_, Run).Times(0);
  EXPECT_EQ(
      runner_.RunBlocks(weight_, DType::kF32, ActivationPrecision::kBf16, {})
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

TEST_F(MatmulRunnerTest, ZeroKMeansTheWeightsK) {
  EXPECT_CALL(kernel_, Run).WillOnce(Return(absl::OkStatus()));
  EXPECT_TRUE(
      runner_
          .Run(weight_, "w", 1, 0, DType::kF32, Activations(1, 64, DType::kF32))
          .ok());
}

TEST_F(MatmulRunnerTest, RefusesBadShapesWithoutRunning) {
  EXPECT_CALL(kernel_, Run).Times(0);
  const std::string a = Activations(2, 64, DType::kF32);
  absl::Status status =
      runner_.Run(weight_, "w", 0, 64, DType::kF32, "").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("m=0"));

  status = runner_.Run(weight_, "w", -2, 64, DType::kF32, a).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);

  status = runner_.Run(weight_, "w", 2, 32, DType::kF32, a).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("k=32 does not match weight \"w\", which has k=64"));

  status = runner_.Run(weight_, "w", 2, 64, DType::kF16, a).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("A has 512 bytes"));

  status = runner_
               .Run(weight_, "w", std::numeric_limits<int64_t>::max(), 64,
                    DType::kF32, a)
               .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(MatmulRunnerTest, KernelFailureIsReturned) {
  EXPECT_CALL(kernel_, Run).WillOnce(Return(absl::InternalError("boom")));
  absl::Status status = runner_
                            .Run(weight_, "w", 1, 64, DType::kF32,
                                 Activations(1, 64, DType::kF32))
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(status.message(), "boom");
}

TEST_F(MatmulRunnerTest, NoSupportingKernelIsNotFound) {
  ON_CALL(kernel_, Supports).WillByDefault(Return(false));
  EXPECT_CALL(kernel_, Run).Times(0);
  absl::Status status = runner_
                            .Run(weight_, "w", 1, 64, DType::kF32,
                                 Activations(1, 64, DType::kF32))
                            .status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("no kernel supports m=1 n=24 k=64"));
}

}  // namespace
}  // namespace nibble::server
