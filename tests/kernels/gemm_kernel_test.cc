// Tests the kernel variant names and the GemmProblem helpers.
#include "kernels/gemm_kernel.h"

#include "absl/status/statusor.h"
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

}  // namespace
}  // namespace nibble
