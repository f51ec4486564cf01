// Tests the CPU kernel registry and ISA detection of kernels/cpu/cpu_kernels.h.
#include "kernels/cpu/cpu_kernels.h"

#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gemm_kernel.h"

namespace nibble::cpu {
namespace {

using ::testing::ElementsAre;

std::vector<std::string> Names(const std::vector<const GemmKernel*>& kernels) {
  std::vector<std::string> names;
  for (const GemmKernel* kernel : kernels) {
    names.emplace_back(kernel->name());
  }
  return names;
}

TEST(CpuKernelsTest, IsaNames) {
  EXPECT_EQ(IsaName(Isa::kScalar), "scalar");
  EXPECT_EQ(IsaName(Isa::kAvx2), "avx2");
}

TEST(CpuKernelsTest, ScalarLevelHasOnlyTheReferences) {
  EXPECT_THAT(Names(CpuKernels(Isa::kScalar)),
              ElementsAre("reference_fp4_scalar", "reference_u4b8_scalar",
                          "reference_u4_scalar"));
}

TEST(CpuKernelsTest, Avx2LevelListsFusedKernelsBeforeTheReferences) {
  EXPECT_THAT(Names(CpuKernels(Isa::kAvx2)),
              ElementsAre("fused_fp4_avx2", "fused_u4b8_avx2", "fused_u4_avx2",
                          "reference_fp4_scalar", "reference_u4b8_scalar",
                          "reference_u4_scalar"));
}

TEST(CpuKernelsTest, EveryKernelNamesItsVariantAndIsa) {
  for (const CpuKernel& entry : AllCpuKernels()) {
    const absl::string_view name = entry.kernel->name();
    EXPECT_TRUE(
        absl::StartsWith(name, KernelVariantName(entry.kernel->variant())))
        << name;
    EXPECT_TRUE(absl::EndsWith(name, absl::StrCat("_", IsaName(entry.isa))))
        << name;
  }
}

TEST(CpuKernelsTest, NibbleIsaEnvironmentVariableCapsTheLevel) {
  const char* original = std::getenv("NIBBLE_ISA");
  const std::optional<std::string> saved =
      original != nullptr ? std::optional<std::string>(original) : std::nullopt;
  ASSERT_EQ(unsetenv("NIBBLE_ISA"), 0);
  const Isa hardware = DetectIsa();

  ASSERT_EQ(setenv("NIBBLE_ISA", "scalar", /*overwrite=*/1), 0);
  EXPECT_EQ(DetectIsa(), Isa::kScalar);
  EXPECT_EQ(Names(CpuKernels()), Names(CpuKernels(Isa::kScalar)));
  ASSERT_EQ(setenv("NIBBLE_ISA", "avx2", /*overwrite=*/1), 0);
  EXPECT_EQ(DetectIsa(), hardware);
  ASSERT_EQ(setenv("NIBBLE_ISA", "avx512", /*overwrite=*/1), 0);
  EXPECT_EQ(DetectIsa(), hardware);

  if (saved.has_value()) {
    ASSERT_EQ(setenv("NIBBLE_ISA", saved->c_str(), /*overwrite=*/1), 0);
  } else {
    ASSERT_EQ(unsetenv("NIBBLE_ISA"), 0);
  }
}

}  // namespace
}  // namespace nibble::cpu
