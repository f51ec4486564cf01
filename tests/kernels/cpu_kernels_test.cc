// Tests the CPU kernel registry and ISA detection of kernels/cpu/cpu_kernels.h.
#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"
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
  EXPECT_EQ(IsaName(Isa::kAvx512), "avx512");
  EXPECT_EQ(IsaName(Isa::kAvx512Vnni), "avx512_vnni");
  EXPECT_EQ(IsaName(Isa::kAvx512Bf16), "avx512_bf16");
  EXPECT_EQ(IsaName(Isa::kAmx), "amx");
}

TEST(CpuKernelsTest, ScalarLevelHasOnlyTheReferences) {
  EXPECT_THAT(Names(CpuKernels(Isa::kScalar)),
              ElementsAre("reference_fp4_scalar", "reference_u4b8_scalar",
                          "reference_u4_scalar", "reference_mxfp4_scalar",
                          "reference_nvfp4_scalar"));
}

// Each vector ISA has 3 variants for each of the 5 formats; AVX-512 BF16 and
// AMX have double_buffered for each, AVX-512 VNNI (int8, listed first) for
// each but nvfp4.
TEST(CpuKernelsTest, EachLevelListsItsFastestKernelsFirst) {
  const std::vector<std::string> avx2 = Names(CpuKernels(Isa::kAvx2));
  ASSERT_EQ(avx2.size(), 20u);
  EXPECT_EQ(avx2.front(), "fused_fp4_avx2");
  EXPECT_EQ(avx2.back(), "reference_nvfp4_scalar");
  const std::vector<std::string> avx512 = Names(CpuKernels(Isa::kAvx512));
  ASSERT_EQ(avx512.size(), 35u);
  EXPECT_EQ(avx512.front(), "fused_fp4_avx512");
  EXPECT_EQ(avx512[15], "fused_fp4_avx2");
  const std::vector<std::string> vnni = Names(CpuKernels(Isa::kAvx512Vnni));
  ASSERT_EQ(vnni.size(), 39u);
  EXPECT_EQ(vnni.front(), "double_buffered_fp4_avx512_vnni_int8");
  EXPECT_EQ(vnni[3], "double_buffered_mxfp4_avx512_vnni_int8");
  EXPECT_EQ(vnni[4], "fused_fp4_avx512");
  const std::vector<std::string> bf16 = Names(CpuKernels(Isa::kAvx512Bf16));
  ASSERT_EQ(bf16.size(), 49u);
  EXPECT_EQ(bf16.front(), "double_buffered_fp4_avx512_vnni_int8");
  EXPECT_EQ(bf16[4], "double_buffered_fp4_avx512_bf16");
  EXPECT_EQ(bf16[8], "double_buffered_nvfp4_avx512_bf16");
  // The bf16 fused kernels before the fp32 ones.
  EXPECT_EQ(bf16[9], "fused_fp4_avx512_bf16");
  EXPECT_EQ(bf16[13], "fused_nvfp4_avx512_bf16");
  EXPECT_EQ(bf16[14], "fused_fp4_avx512");
  const std::vector<std::string> amx = Names(CpuKernels(Isa::kAmx));
  ASSERT_EQ(amx.size(), 54u);
  EXPECT_EQ(amx[4], "double_buffered_fp4_amx");
  EXPECT_EQ(amx[8], "double_buffered_nvfp4_amx");
  EXPECT_EQ(amx[9], "double_buffered_fp4_avx512_bf16");
}

// AllCpuKernels has the avx512_bf16 kernels twice, made for the two bf16
// levels; each level lists a name once.
TEST(CpuKernelsTest, EveryLevelListsEachKernelOnce) {
  for (Isa isa : kAllIsas) {
    std::vector<std::string> names = Names(CpuKernels(isa));
    std::sort(names.begin(), names.end());
    EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end())
        << IsaName(isa);
  }
}

TEST(CpuKernelsTest, EveryLevelHasEveryVariantForEveryFormat) {
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512}) {
    for (KernelVariant variant :
         {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
          KernelVariant::kStriped}) {
      for (WeightFormat format : kAllWeightFormats) {
        const std::string name =
            absl::StrCat(KernelVariantName(variant), "_",
                         WeightFormatName(format), "_", IsaName(isa));
        EXPECT_THAT(Names(CpuKernels(isa)), ::testing::Contains(name));
      }
    }
  }
}

TEST(CpuKernelsTest, Bf16LevelsHaveDoubleBufferedForEveryFormat) {
  for (Isa isa : {Isa::kAvx512Bf16, Isa::kAmx}) {
    for (WeightFormat format : kAllWeightFormats) {
      EXPECT_THAT(Names(CpuKernels(isa)),
                  ::testing::Contains(absl::StrCat("double_buffered_",
                                                   WeightFormatName(format),
                                                   "_", IsaName(isa))));
    }
  }
}

// An int8 kernel's name ends in its precision, after the ISA.
TEST(CpuKernelsTest, EveryKernelNamesItsVariantAndIsa) {
  for (const CpuKernel& entry : AllCpuKernels()) {
    const absl::string_view name = entry.kernel->name();
    EXPECT_TRUE(
        absl::StartsWith(name, KernelVariantName(entry.kernel->variant())))
        << name;
    const std::string suffix =
        entry.kernel->QuantizesActivationsToInt8() ? "_int8" : "";
    EXPECT_TRUE(
        absl::EndsWith(name, absl::StrCat("_", IsaName(entry.isa), suffix)))
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
  EXPECT_EQ(DetectIsa(), std::min(hardware, Isa::kAvx2));
  ASSERT_EQ(setenv("NIBBLE_ISA", "avx512", /*overwrite=*/1), 0);
  EXPECT_EQ(DetectIsa(), std::min(hardware, Isa::kAvx512));
  ASSERT_EQ(setenv("NIBBLE_ISA", "avx512_bf16", /*overwrite=*/1), 0);
  EXPECT_EQ(DetectIsa(), std::min(hardware, Isa::kAvx512Bf16));
  ASSERT_EQ(setenv("NIBBLE_ISA", "amx", /*overwrite=*/1), 0);
  EXPECT_EQ(DetectIsa(), hardware);

  if (saved.has_value()) {
    ASSERT_EQ(setenv("NIBBLE_ISA", saved->c_str(), /*overwrite=*/1), 0);
  } else {
    ASSERT_EQ(unsetenv("NIBBLE_ISA"), 0);
  }
}

}  // namespace
}  // namespace nibble::cpu
