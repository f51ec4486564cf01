// Tests the kernel variant names, the GemmProblem helpers and RunBlocks'
// gathering and scattering.
#include "kernels/gemm_kernel.h"

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "base/thread_pool.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "kernels/packed_weight.h"

namespace nibble {
namespace {

TEST(GemmKernelTest, KernelVariantNames) {
  EXPECT_EQ(KernelVariantName(KernelVariant::kReference), "reference");
  EXPECT_EQ(KernelVariantName(KernelVariant::kFused), "fused");
  EXPECT_EQ(KernelVariantName(KernelVariant::kDoubleBuffered),
            "double_buffered");
  EXPECT_EQ(KernelVariantName(KernelVariant::kStriped), "striped");
}

TEST(GemmKernelTest, DebugStringNamesEveryField) {
  const GemmProblem problem{.m = 4,
                            .n = 4096,
                            .k = 2048,
                            .format = WeightFormat::kU4,
                            .group_size = 128,
                            .dtype = DType::kBF16,
                            .threads = 3};
  EXPECT_EQ(problem.DebugString(),
            "m=4 n=4096 k=2048 u4 group=128 bf16 threads=3");
}

TEST(GemmKernelTest, MakeGemmProblemTakesTheShapeFromTheWeight) {
  const WeightSpec spec{WeightFormat::kFp4, /*k=*/256, /*n=*/40,
                        /*group_size=*/64};
  const absl::StatusOr<PackedWeight> packed =
      PackedWeight::Pack(RandomQuantizedWeight(spec, /*seed=*/5));
  ASSERT_TRUE(packed.ok()) << packed.status();
  const GemmProblem problem =
      MakeGemmProblem(*packed, /*m=*/7, DType::kF16, /*threads=*/2);
  EXPECT_EQ(problem.m, 7);
  EXPECT_EQ(problem.n, 40);
  EXPECT_EQ(problem.k, 256);
  EXPECT_EQ(problem.format, WeightFormat::kFp4);
  EXPECT_EQ(problem.group_size, 64);
  EXPECT_EQ(problem.dtype, DType::kF16);
  EXPECT_EQ(problem.threads, 2);
}

// C [i][j] = (sum of row i of A) * (j + 1), in f32: each row of C tells which
// row of A it came from.
class RowSumKernel final : public GemmKernel {
 public:
  absl::string_view name() const override { return "row_sum"; }
  KernelVariant variant() const override { return KernelVariant::kReference; }
  bool Supports(const GemmProblem&) const override { return true; }
  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool&) const override {
    const auto* a = static_cast<const float*>(operands.a);
    auto* c = static_cast<float*>(operands.c);
    for (int64_t i = 0; i < problem.m; ++i) {
      float sum = 0;
      for (int64_t k = 0; k < problem.k; ++k) sum += a[i * problem.k + k];
      for (int64_t j = 0; j < problem.n; ++j) {
        c[i * problem.n + j] = sum * static_cast<float>(j + 1);
      }
    }
    ++runs;
    return absl::OkStatus();
  }
  mutable int runs = 0;
};

TEST(GemmKernelTest, RunBlocksGathersAAndScattersCInOneRun) {
  constexpr uint64_t kSeed = 20261125;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  constexpr int64_t kK = 8;
  constexpr int64_t kN = 5;
  const std::vector<int64_t> rows = {3, 1, 4};
  std::vector<std::vector<float>> a(rows.size());
  std::vector<std::vector<float>> c(rows.size());
  std::vector<RowBlock> blocks;
  int64_t m = 0;
  for (size_t b = 0; b < rows.size(); ++b) {
    a[b].resize(rows[b] * kK);
    for (float& value : a[b]) value = uniform(rng);
    c[b].assign(rows[b] * kN, -1.0f);
    blocks.push_back({.a = a[b].data(), .c = c[b].data(), .rows = rows[b]});
    m += rows[b];
  }
  const GemmProblem problem{.m = m, .n = kN, .k = kK, .dtype = DType::kF32};
  RowSumKernel kernel;
  ThreadPool pool(1);
  ASSERT_TRUE(kernel.RunBlocks(problem, nullptr, nullptr, blocks, pool).ok());
  EXPECT_EQ(kernel.runs, 1);
  for (size_t b = 0; b < rows.size(); ++b) {
    for (int64_t i = 0; i < rows[b]; ++i) {
      float sum = 0;
      for (int64_t k = 0; k < kK; ++k) sum += a[b][i * kK + k];
      for (int64_t j = 0; j < kN; ++j) {
        EXPECT_FLOAT_EQ(c[b][i * kN + j], sum * static_cast<float>(j + 1))
            << "block " << b << " row " << i << " column " << j;
      }
    }
  }
}

}  // namespace
}  // namespace nibble
