// Tests the tuning table as the CUDA backend reads it, without a GPU: GPU
// levels named by compute capability, rules looked up at the GPU's SM count,
// and the built-in GPU rules.
#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/gemm_kernel.h"
#include "kernels/tuning_table.h"

namespace nibble {
namespace {

using ::testing::Optional;

constexpr KernelVariant kFused = KernelVariant::kFused;
constexpr KernelVariant kDoubleBuffered = KernelVariant::kDoubleBuffered;
constexpr KernelVariant kStriped = KernelVariant::kStriped;

GemmProblem Problem(int64_t m, int64_t k, int64_t n,
                    WeightFormat format = WeightFormat::kU4b8,
                    int64_t group = 128, int threads = 8) {
  return GemmProblem{.m = m,
                     .n = n,
                     .k = k,
                     .format = format,
                     .group_size = group,
                     .dtype = DType::kF16,
                     .threads = threads};
}

TuningTable ParsedTable(absl::string_view text) {
  absl::StatusOr<TuningTable> table = TuningTable::Parse(text);
  EXPECT_TRUE(table.ok()) << table.status();
  return table.ok() ? *table : TuningTable();
}

TEST(GpuLevelTest, NamesTheComputeCapability) {
  EXPECT_EQ(cuda::GpuLevelName(90), "sm90");
  EXPECT_EQ(cuda::GpuLevelName(80), "sm80");
  EXPECT_EQ(cuda::GpuLevelName(100), "sm100");
}

TEST(GpuLevelTest, TablesParseAndWriteBackEveryLevelName) {
  for (const int capability : {75, 80, 89, 90, 100, 120}) {
    const std::string level = cuda::GpuLevelName(capability);
    const std::string text =
        absl::StrCat("# isa format group k n threads max_m variant\n", level,
                     " u4b8 128 4096 14336 132 0 striped\n");
    const TuningTable table = ParsedTable(text);
    ASSERT_EQ(table.rules().size(), 1u) << level;
    EXPECT_EQ(table.rules()[0].isa, level);
    EXPECT_EQ(table.isa(), level);
    EXPECT_EQ(table.Serialize(), text);
  }
}

TEST(GpuLevelTest, WithoutAGpuThereAreNoGpuRules) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  const TuningTable table = cuda::ForGpu(TuningTable::Default(), 0);
  EXPECT_TRUE(table.rules().empty());
  EXPECT_EQ(table.isa(), "");
}

TEST(GpuTuningTableTest, AnswersAGpuWithFewerSmsFromTheNearestSmCount) {
  const TuningTable table = ParsedTable(
      "sm90 u4b8 128 4096 14336 132 15 fused\n"
      "sm90 u4b8 128 4096 14336 132 0 striped\n");
  // An H100 PCIe has 114 SMs; the host's thread count plays no part.
  for (const int threads : {1, 2, 64}) {
    const TuningTable h100 = table.ForGpu("sm90", 114);
    EXPECT_EQ(h100.isa(), "sm90");
    EXPECT_THAT(
        h100.Lookup(Problem(1, 4096, 14336, WeightFormat::kU4b8, 128, threads)),
        Optional(kFused));
    EXPECT_THAT(h100.Lookup(Problem(64, 4096, 14336, WeightFormat::kU4b8, 128,
                                    threads)),
                Optional(kStriped));
  }
}

TEST(GpuTuningTableTest, PicksTheRulesOfTheNearestSmCount) {
  const TuningTable table = ParsedTable(
      "sm90 u4b8 128 4096 14336 132 0 striped\n"
      "sm90 u4b8 128 4096 14336 66 0 fused\n");
  const GemmProblem problem =
      Problem(16, 4096, 14336, WeightFormat::kU4b8, 128, /*threads=*/132);
  EXPECT_THAT(table.ForGpu("sm90", 132).Lookup(problem), Optional(kStriped));
  EXPECT_THAT(table.ForGpu("sm90", 114).Lookup(problem), Optional(kStriped));
  EXPECT_THAT(table.ForGpu("sm90", 78).Lookup(problem), Optional(kFused));
  EXPECT_THAT(table.ForGpu("sm90", 16).Lookup(problem), Optional(kFused));
}

// Rules of two GPUs, a CPU level and every level, as one file may hold them.
TuningTable TwoGpuTable() {
  return ParsedTable(
      "sm80 u4b8 128 4096 14336 108 0 fused\n"
      "sm90 u4b8 128 4096 14336 132 0 double_buffered\n"
      "avx2 u4b8 128 4096 14336 2 0 striped\n"
      "fp4 32 4096 14336 2 0 striped\n");
}

TEST(GpuTuningTableTest, ATableOfTwoGpuLevelsAnswersEachWithItsOwnRules) {
  const GemmProblem problem = Problem(16, 4096, 14336);
  const TuningTable sm80 = TwoGpuTable().ForGpu("sm80", 108);
  EXPECT_EQ(sm80.isa(), "sm80");
  EXPECT_THAT(sm80.Lookup(problem), Optional(kFused));
  const TuningTable sm90 = TwoGpuTable().ForGpu("sm90", 132);
  EXPECT_EQ(sm90.isa(), "sm90");
  EXPECT_THAT(sm90.Lookup(problem), Optional(kDoubleBuffered));
  ASSERT_EQ(sm90.rules().size(), 1u);
  EXPECT_EQ(sm90.rules()[0].isa, "sm90");
}

TEST(GpuTuningTableTest, NoRulesOfOtherLevelsAnswerAGpu) {
  // Neither the CPU's rules nor those of every level: measured on a CPU.
  for (const absl::string_view level : {"sm89", "sm100", ""}) {
    const TuningTable table = TwoGpuTable().ForGpu(level, 128);
    EXPECT_EQ(table.isa(), "") << level;
    EXPECT_EQ(table.Lookup(Problem(16, 4096, 14336)), std::nullopt) << level;
    EXPECT_EQ(table.Lookup(Problem(16, 4096, 14336, WeightFormat::kFp4, 32)),
              std::nullopt)
        << level;
  }
}

TEST(GpuTuningTableTest, ForIsasKeepsTheGpusSmCount) {
  const TuningTable table = ParsedTable(
      "sm90 u4b8 128 4096 14336 132 0 striped\n"
      "sm90 u4b8 128 4096 14336 16 0 fused\n");
  const absl::string_view levels[] = {"sm90", "avx2", "scalar"};
  const TuningTable narrowed = table.ForGpu("sm90", 132).ForIsas(levels);
  EXPECT_EQ(narrowed.isa(), "sm90");
  EXPECT_THAT(narrowed.Lookup(Problem(1, 4096, 14336, WeightFormat::kU4b8, 128,
                                      /*threads=*/16)),
              Optional(kStriped));
}

// The built-in sm90 rules: H100 measurements (default_gpu_tuning_table.inc).
TuningTable BuiltInSm90() { return TuningTable::Default().ForGpu("sm90", 132); }

TEST(BuiltInGpuTableTest, HasSm90RulesOfTheCudaBackendsVariants) {
  const TuningTable table = BuiltInSm90();
  ASSERT_FALSE(table.rules().empty());
  for (const TuningRule& rule : table.rules()) {
    SCOPED_TRACE(TuningTable({rule}).Serialize());
    EXPECT_EQ(rule.threads, 132);
    EXPECT_NE(std::find(std::begin(cuda::kVariants), std::end(cuda::kVariants),
                        rule.variant),
              std::end(cuda::kVariants));
  }
}

TEST(BuiltInGpuTableTest, CoversTheMeasuredFormatsAndShapes) {
  const TuningTable table = BuiltInSm90();
  const struct {
    WeightFormat format;
    int64_t group;
  } measured[] = {{WeightFormat::kU4b8, 128},
                  {WeightFormat::kFp4, 32},
                  {WeightFormat::kMxfp4, 32},
                  {WeightFormat::kNvfp4, 16}};
  for (const auto& [format, group] : measured) {
    for (const auto& [k, n] : {std::pair<int64_t, int64_t>{4096, 14336},
                               std::pair<int64_t, int64_t>{14336, 4096}}) {
      const bool has_rule = std::any_of(
          table.rules().begin(), table.rules().end(), [&](const TuningRule& r) {
            return r.format == format && r.group_size == group && r.k == k &&
                   r.n == n && r.max_m == 0;
          });
      EXPECT_TRUE(has_rule)
          << WeightFormatName(format) << " g" << group << " " << k << "x" << n;
    }
  }
}

TEST(BuiltInGpuTableTest, FollowsTheH100Measurements) {
  const TuningTable table = BuiltInSm90();
  // u4b8 g128, K=8192 N=28672: double_buffered at M = 1 (49.9 us against
  // fused's 51.1), 16 (54.1 against striped's 60.6) and 1024 (766.7
  // against 806.2).
  EXPECT_THAT(table.Lookup(Problem(1, 8192, 28672)), Optional(kDoubleBuffered));
  EXPECT_THAT(table.Lookup(Problem(16, 8192, 28672)),
              Optional(kDoubleBuffered));
  EXPECT_THAT(table.Lookup(Problem(1024, 8192, 28672)),
              Optional(kDoubleBuffered));
  // K=28672 N=8192: fused up to M = 8 (49.4 us at M = 1 against
  // double_buffered's 50.5), double_buffered from 9.
  EXPECT_THAT(table.Lookup(Problem(1, 28672, 8192)), Optional(kFused));
  EXPECT_THAT(table.Lookup(Problem(9, 28672, 8192)), Optional(kDoubleBuffered));
  // K=4096 N=14336 at M = 1024: double_buffered (194.2 us against striped's
  // 197.5).
  EXPECT_THAT(table.Lookup(Problem(1024, 4096, 14336)),
              Optional(kDoubleBuffered));
  // u4b8 g128, K=14336 N=4096: double_buffered at every M.
  EXPECT_THAT(table.Lookup(Problem(64, 14336, 4096)),
              Optional(kDoubleBuffered));
}

TEST(BuiltInGpuTableTest, CpuLevelsNeverReadTheGpuRules) {
  std::vector<TuningRule> avx2_rules;
  for (const TuningRule& rule : TuningTable::Default().rules()) {
    if (rule.isa == "avx2") avx2_rules.push_back(rule);
  }
  const absl::string_view levels[] = {"avx2", "scalar"};
  const TuningTable cpu = TuningTable::Default().ForIsas(levels);
  EXPECT_EQ(cpu.isa(), "avx2");
  // The shape and thread count of sm90 rules, which would be the nearest.
  const GemmProblem problem =
      Problem(1024, 4096, 14336, WeightFormat::kU4b8, 128, /*threads=*/132);
  EXPECT_EQ(cpu.Lookup(problem), TuningTable(avx2_rules).Lookup(problem));
}

}  // namespace
}  // namespace nibble
