// Tests how the Scheduler picks a kernel, with mock and with real CPU kernels.
#include "kernels/scheduler.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/format_kernel.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/gemm_kernel.h"
#include "kernels/tuning_table.h"
#include "tests/kernels/mock_gemm_kernel.h"

namespace nibble {
namespace {

using ::nibble::testing::MockGemmKernel;
using ::testing::_;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::NiceMock;
using ::testing::Return;

GemmProblem Problem(int64_t m, int64_t n, int threads = 2) {
  return GemmProblem{.m = m,
                     .n = n,
                     .k = 4096,
                     .format = WeightFormat::kU4b8,
                     .group_size = 128,
                     .dtype = DType::kF16,
                     .threads = threads};
}

// A rule for u4b8, group 128, 2 threads, like Problem().
TuningRule U4b8Rule(int64_t k, int64_t n, int64_t max_m,
                    KernelVariant variant) {
  return TuningRule{.isa = "",
                    .format = WeightFormat::kU4b8,
                    .group_size = 128,
                    .k = k,
                    .n = n,
                    .threads = 2,
                    .max_m = max_m,
                    .variant = variant};
}

class SchedulerTest : public ::testing::Test {
 protected:
  // Registers a mock kernel; `name` must outlive the test (a literal).
  MockGemmKernel& AddKernel(absl::string_view name, KernelVariant variant,
                            bool supports) {
    auto kernel = std::make_unique<NiceMock<MockGemmKernel>>();
    ON_CALL(*kernel, name()).WillByDefault(Return(name));
    ON_CALL(*kernel, variant()).WillByDefault(Return(variant));
    ON_CALL(*kernel, Supports(_)).WillByDefault(Return(supports));
    EXPECT_CALL(*kernel, Run(_, _, _)).Times(0);
    kernels_.push_back(std::move(kernel));
    return *kernels_.back();
  }

  // One kernel of every variant, all supporting every problem, registered in
  // an order unrelated to the scheduler's preference.
  void AddOneKernelPerVariant() {
    AddKernel("reference", KernelVariant::kReference, true);
    AddKernel("striped", KernelVariant::kStriped, true);
    AddKernel("double_buffered", KernelVariant::kDoubleBuffered, true);
    AddKernel("fused", KernelVariant::kFused, true);
  }

  Scheduler MakeScheduler(TuningTable table = TuningTable::Default(),
                          VariantRule rule = DefaultVariantRule) const {
    std::vector<const GemmKernel*> registered;
    for (const auto& kernel : kernels_) registered.push_back(kernel.get());
    return Scheduler(registered, table, std::move(rule));
  }

  // The name of the kernel picked for `problem`, or the error.
  std::string PickedName(const Scheduler& scheduler,
                         const GemmProblem& problem) const {
    const absl::StatusOr<const GemmKernel*> kernel = scheduler.Pick(problem);
    if (!kernel.ok()) return kernel.status().ToString();
    return std::string((*kernel)->name());
  }

 private:
  std::vector<std::unique_ptr<NiceMock<MockGemmKernel>>> kernels_;
};

// The built-in table is measured, so only what every measurement agrees on
// is tested: one row never takes double_buffered, many rows always do.
TEST_F(SchedulerTest, DefaultTableSendsOneRowAndManyRowsApart) {
  const Scheduler scheduler = MakeScheduler();
  EXPECT_NE(scheduler.PreferredVariant(Problem(1, 4096)),
            KernelVariant::kDoubleBuffered);
  EXPECT_EQ(scheduler.PreferredVariant(Problem(4096, 4096)),
            KernelVariant::kDoubleBuffered);
}

TEST_F(SchedulerTest, PreferredVariantFollowsAGivenTable) {
  const Scheduler scheduler = MakeScheduler(TuningTable({
      U4b8Rule(4096, 4096, 4, KernelVariant::kFused),
      U4b8Rule(4096, 4096, 0, KernelVariant::kDoubleBuffered),
      U4b8Rule(4096, 32, 0, KernelVariant::kStriped),
  }));
  EXPECT_EQ(scheduler.PreferredVariant(Problem(4, 4096)),
            KernelVariant::kFused);
  EXPECT_EQ(scheduler.PreferredVariant(Problem(5, 4096)),
            KernelVariant::kDoubleBuffered);
  EXPECT_EQ(scheduler.PreferredVariant(Problem(1, 32)),
            KernelVariant::kStriped);
  EXPECT_EQ(scheduler.PreferredVariant(Problem(64, 16)),
            KernelVariant::kStriped);
}

TEST_F(SchedulerTest, WithoutRulesForTheFormatFusedWinsUpToMOf8) {
  const Scheduler scheduler = MakeScheduler(
      TuningTable({TuningRule{.isa = "",
                              .format = WeightFormat::kFp4,
                              .group_size = 128,
                              .k = 4096,
                              .n = 4096,
                              .threads = 2,
                              .max_m = 0,
                              .variant = KernelVariant::kStriped}}));
  EXPECT_EQ(scheduler.PreferredVariant(Problem(8, 4096)),
            KernelVariant::kFused);
  EXPECT_EQ(scheduler.PreferredVariant(Problem(9, 4096)),
            KernelVariant::kDoubleBuffered);
  const Scheduler empty = MakeScheduler(TuningTable());
  EXPECT_EQ(empty.PreferredVariant(Problem(1, 4096)), KernelVariant::kFused);
  EXPECT_EQ(empty.PreferredVariant(Problem(64, 4096)),
            KernelVariant::kDoubleBuffered);
}

TuningTable FusedUpTo8Table() {
  return TuningTable({U4b8Rule(4096, 4096, 8, KernelVariant::kFused),
                      U4b8Rule(4096, 4096, 0, KernelVariant::kDoubleBuffered)});
}

TEST_F(SchedulerTest, RuleDecidesWhereTheTableHasNoRule) {
  AddOneKernelPerVariant();
  std::vector<int64_t> asked_m;
  const Scheduler scheduler =
      MakeScheduler(TuningTable(), [&asked_m](const GemmProblem& problem) {
        asked_m.push_back(problem.m);
        return problem.n >= 4096 ? KernelVariant::kStriped
                                 : KernelVariant::kDoubleBuffered;
      });
  EXPECT_EQ(scheduler.PreferredVariant(Problem(1, 4096)),
            KernelVariant::kStriped);
  EXPECT_EQ(PickedName(scheduler, Problem(2, 4096)), "striped");
  EXPECT_EQ(PickedName(scheduler, Problem(3, 64)), "double_buffered");
  EXPECT_THAT(asked_m, ElementsAre(1, 2, 3));
}

TEST_F(SchedulerTest, TableRulesWinOverTheRule) {
  AddOneKernelPerVariant();
  const Scheduler scheduler =
      MakeScheduler(FusedUpTo8Table(),
                    [](const GemmProblem&) { return KernelVariant::kStriped; });
  EXPECT_EQ(PickedName(scheduler, Problem(1, 4096)), "fused");
  EXPECT_EQ(PickedName(scheduler, Problem(64, 4096)), "double_buffered");
  // The table has no rule for fp4.
  GemmProblem fp4 = Problem(1, 4096);
  fp4.format = WeightFormat::kFp4;
  EXPECT_EQ(PickedName(scheduler, fp4), "striped");
}

// As nibbled's CUDA backend registers them: the accelerator's kernels first,
// then the CPU's, which run the shapes the accelerator's refuse.
TEST_F(SchedulerTest, RuleKeepsRegistrationOrderAcrossBackends) {
  MockGemmKernel& gpu = AddKernel("gpu_fused", KernelVariant::kFused, true);
  AddKernel("cpu_fused", KernelVariant::kFused, true);
  const Scheduler scheduler = MakeScheduler(
      TuningTable(), [](const GemmProblem&) { return KernelVariant::kFused; });
  EXPECT_EQ(PickedName(scheduler, Problem(1, 4096)), "gpu_fused");
  ON_CALL(gpu, Supports(_)).WillByDefault(Return(false));
  EXPECT_EQ(PickedName(scheduler, Problem(1, 4096)), "cpu_fused");
}

// As nibbled's cuda backend makes it: the GPU's kernels (of its level) before
// the CPU's, the table narrowed to the GPU's rules (cuda::ForGpu), and the
// GPU's rule where those are silent.
TEST_F(SchedulerTest, OnTheGpuTheGpusRulesPickAndTheGpuRuleFillsIn) {
  for (KernelVariant variant : cuda::kVariants) {
    ON_CALL(AddKernel(KernelVariantName(variant), variant, true), isa())
        .WillByDefault(Return("sm90"));
  }
  ON_CALL(AddKernel("cpu_fused", KernelVariant::kFused, true), isa())
      .WillByDefault(Return("avx2"));
  std::vector<int64_t> asked_m;
  const Scheduler scheduler =
      MakeScheduler(TuningTable::Default().ForGpu("sm90", 114),
                    [&asked_m](const GemmProblem& problem) {
                      asked_m.push_back(problem.m);
                      return KernelVariant::kFused;
                    });
  EXPECT_EQ(scheduler.table().isa(), "sm90");
  // The built-in sm90 rules for u4b8 g128, K=28672 N=8192.
  GemmProblem u4b8 = Problem(200, 8192);
  u4b8.k = 28672;
  EXPECT_EQ(PickedName(scheduler, u4b8), "double_buffered");
  u4b8.m = 4;
  EXPECT_EQ(PickedName(scheduler, u4b8), "fused");
  EXPECT_TRUE(asked_m.empty());
  // No sm90 rules for u4, though the CPU's levels have some.
  GemmProblem u4 = Problem(1024, 14336);
  u4.format = WeightFormat::kU4;
  EXPECT_EQ(PickedName(scheduler, u4), "fused");
  EXPECT_THAT(asked_m, ElementsAre(1024));

  // A table without rules for this GPU's level leaves every pick to the rule.
  const Scheduler without_rules =
      MakeScheduler(TuningTable::Default().ForGpu("sm80", 108),
                    [](const GemmProblem&) { return KernelVariant::kStriped; });
  EXPECT_EQ(without_rules.table().isa(), "");
  EXPECT_EQ(PickedName(without_rules, Problem(16, 14336)), "striped");
}

TEST_F(SchedulerTest, PicksFusedForSmallM) {
  AddOneKernelPerVariant();
  const Scheduler scheduler = MakeScheduler(FusedUpTo8Table());
  EXPECT_EQ(PickedName(scheduler, Problem(1, 4096)), "fused");
  EXPECT_EQ(PickedName(scheduler, Problem(8, 4096)), "fused");
}

TEST_F(SchedulerTest, PicksDoubleBufferedForLargeM) {
  AddOneKernelPerVariant();
  const Scheduler scheduler = MakeScheduler(FusedUpTo8Table());
  EXPECT_EQ(PickedName(scheduler, Problem(9, 4096)), "double_buffered");
  EXPECT_EQ(PickedName(scheduler, Problem(4096, 4096)), "double_buffered");
}

TEST_F(SchedulerTest, MaxMComesFromTheTable) {
  AddOneKernelPerVariant();
  const Scheduler scheduler = MakeScheduler(TuningTable({
      U4b8Rule(4096, 4096, 32, KernelVariant::kFused),
      U4b8Rule(4096, 4096, 0, KernelVariant::kDoubleBuffered),
  }));
  EXPECT_EQ(PickedName(scheduler, Problem(32, 4096)), "fused");
  EXPECT_EQ(PickedName(scheduler, Problem(33, 4096)), "double_buffered");
}

TEST_F(SchedulerTest, PicksStripedWhereTheTableSaysSo) {
  AddOneKernelPerVariant();
  const Scheduler scheduler = MakeScheduler(TuningTable({
      U4b8Rule(4096, 4096, 0, KernelVariant::kFused),
      U4b8Rule(4096, 32, 0, KernelVariant::kStriped),
  }));
  EXPECT_EQ(PickedName(scheduler, Problem(1, 32)), "striped");
  EXPECT_EQ(PickedName(scheduler, Problem(256, 48)), "striped");
  EXPECT_EQ(PickedName(scheduler, Problem(1, 4096)), "fused");
}

TEST_F(SchedulerTest, FallsBackToOtherVariantsThenTheReference) {
  AddKernel("reference", KernelVariant::kReference, true);
  AddKernel("striped", KernelVariant::kStriped, true);
  AddKernel("double_buffered", KernelVariant::kDoubleBuffered, false);
  AddKernel("fused", KernelVariant::kFused, true);
  const Scheduler scheduler = MakeScheduler();
  EXPECT_EQ(PickedName(scheduler, Problem(64, 4096)), "fused");
}

TEST_F(SchedulerTest, FallbackOrderIsFusedDoubleBufferedStripedReference) {
  AddKernel("reference", KernelVariant::kReference, true);
  AddKernel("striped", KernelVariant::kStriped, true);
  AddKernel("double_buffered", KernelVariant::kDoubleBuffered, true);
  AddKernel("fused", KernelVariant::kFused, false);
  EXPECT_EQ(PickedName(MakeScheduler(FusedUpTo8Table()), Problem(1, 4096)),
            "double_buffered");
}

TEST_F(SchedulerTest, FallsBackToStripedBeforeTheReference) {
  AddKernel("reference", KernelVariant::kReference, true);
  AddKernel("striped", KernelVariant::kStriped, true);
  AddKernel("double_buffered", KernelVariant::kDoubleBuffered, false);
  AddKernel("fused", KernelVariant::kFused, false);
  EXPECT_EQ(PickedName(MakeScheduler(), Problem(1, 4096)), "striped");
}

TEST_F(SchedulerTest, FallsBackToTheReferenceLast) {
  AddKernel("reference", KernelVariant::kReference, true);
  AddKernel("striped", KernelVariant::kStriped, false);
  AddKernel("double_buffered", KernelVariant::kDoubleBuffered, false);
  AddKernel("fused", KernelVariant::kFused, false);
  const Scheduler scheduler = MakeScheduler();
  EXPECT_EQ(PickedName(scheduler, Problem(1, 4096)), "reference");
  EXPECT_EQ(PickedName(scheduler, Problem(64, 4096)), "reference");
  EXPECT_EQ(PickedName(scheduler, Problem(1, 16)), "reference");
}

TEST_F(SchedulerTest, StripedPreferenceFallsBackToFused) {
  AddKernel("reference", KernelVariant::kReference, true);
  AddKernel("double_buffered", KernelVariant::kDoubleBuffered, true);
  AddKernel("fused", KernelVariant::kFused, true);
  const Scheduler scheduler = MakeScheduler(
      TuningTable({U4b8Rule(4096, 16, 0, KernelVariant::kStriped)}));
  EXPECT_EQ(PickedName(scheduler, Problem(64, 16)), "fused");
}

TEST_F(SchedulerTest, RegistrationOrderBreaksTies) {
  AddKernel("fused_first", KernelVariant::kFused, true);
  AddKernel("fused_second", KernelVariant::kFused, true);
  EXPECT_EQ(PickedName(MakeScheduler(), Problem(1, 4096)), "fused_first");
}

TEST_F(SchedulerTest, SkipsKernelsThatDoNotSupportTheProblem) {
  MockGemmKernel& unsupported =
      AddKernel("fused_unsupported", KernelVariant::kFused, false);
  AddKernel("fused_supported", KernelVariant::kFused, true);
  const GemmProblem problem = Problem(3, 4096);
  EXPECT_CALL(
      unsupported,
      Supports(AllOf(Field(&GemmProblem::m, 3), Field(&GemmProblem::n, 4096),
                     Field(&GemmProblem::format, WeightFormat::kU4b8),
                     Field(&GemmProblem::dtype, DType::kF16))))
      .WillOnce(Return(false));
  EXPECT_EQ(PickedName(MakeScheduler(), problem), "fused_supported");
}

TEST_F(SchedulerTest, NotFoundNamesTheProblemWhenNothingSupportsIt) {
  AddKernel("fused", KernelVariant::kFused, false);
  AddKernel("reference", KernelVariant::kReference, false);
  const GemmProblem problem = Problem(3, 40);
  const absl::StatusOr<const GemmKernel*> kernel =
      MakeScheduler().Pick(problem);
  ASSERT_FALSE(kernel.ok());
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(kernel.status().message()),
              HasSubstr("m=3 n=40 k=4096 u4b8 group=128 f16 threads=2"));
}

TEST_F(SchedulerTest, NotFoundWithNoKernels) {
  const absl::StatusOr<const GemmKernel*> kernel =
      MakeScheduler().Pick(Problem(1, 4096));
  EXPECT_EQ(kernel.status().code(), absl::StatusCode::kNotFound);
}

TEST_F(SchedulerTest, KeepsTheKernelsInRegistrationOrder) {
  const MockGemmKernel& first =
      AddKernel("first", KernelVariant::kReference, true);
  const MockGemmKernel& second =
      AddKernel("second", KernelVariant::kFused, true);
  const Scheduler scheduler = MakeScheduler();
  ASSERT_EQ(scheduler.kernels().size(), 2u);
  EXPECT_EQ(scheduler.kernels()[0], &first);
  EXPECT_EQ(scheduler.kernels()[1], &second);
}

// The problem of Problem(m, n) in `format`, at the format's own group size.
GemmProblem ProblemOfFormat(int64_t m, int64_t n, WeightFormat format) {
  GemmProblem problem = Problem(m, n);
  problem.format = format;
  if (FixedGroupSize(format) > 0) problem.group_size = FixedGroupSize(format);
  return problem;
}

TEST(CpuSchedulerTest, PicksAFastKernelOfTheProblemsFormat) {
  const Scheduler scheduler(cpu::CpuKernels());
  for (WeightFormat format : kAllWeightFormats) {
    for (int64_t m : {1, 4, 64, 256}) {
      for (int64_t n : {16, 4096}) {
        const GemmProblem problem = ProblemOfFormat(m, n, format);
        SCOPED_TRACE(problem.DebugString());
        const absl::StatusOr<const GemmKernel*> kernel =
            scheduler.Pick(problem);
        ASSERT_TRUE(kernel.ok()) << kernel.status();
        EXPECT_THAT(
            std::string((*kernel)->name()),
            HasSubstr(absl::StrCat("_", WeightFormatName(format), "_")));
        EXPECT_TRUE((*kernel)->Supports(problem));
        // Every format has vector kernels wherever the CPU has a vector ISA.
        if (cpu::DetectIsa() != cpu::Isa::kScalar) {
          EXPECT_NE((*kernel)->variant(), KernelVariant::kReference);
        }
      }
    }
  }
}

// The built-in table has no mxfp4 or nvfp4 rules; they follow fp4's.
TEST(CpuSchedulerTest, Fp4CodedFormatsFollowTheFp4RulesOfTheDefaultTable) {
  const Scheduler scheduler(cpu::CpuKernels());
  for (WeightFormat format : {WeightFormat::kMxfp4, WeightFormat::kNvfp4}) {
    for (int64_t m : {1, 2, 4, 8, 16, 64, 256}) {
      const GemmProblem problem = ProblemOfFormat(m, 4096, format);
      GemmProblem fp4 = problem;
      fp4.format = WeightFormat::kFp4;
      fp4.group_size = 32;
      SCOPED_TRACE(problem.DebugString());
      EXPECT_EQ(scheduler.PreferredVariant(problem),
                scheduler.PreferredVariant(fp4));
    }
  }
}

// A weight kept only in an accelerator's memory has no panels to read.
TEST(CpuSchedulerTest, NoCpuKernelTakesAWeightWithoutPanels) {
  for (cpu::Isa isa : {cpu::Isa::kScalar, cpu::DetectIsa()}) {
    const Scheduler scheduler(cpu::CpuKernels(isa));
    for (WeightFormat format : kAllWeightFormats) {
      GemmProblem problem = ProblemOfFormat(4, 4096, format);
      problem.cpu_panels = false;
      const absl::StatusOr<const GemmKernel*> kernel = scheduler.Pick(problem);
      EXPECT_EQ(kernel.status().code(), absl::StatusCode::kNotFound);
      EXPECT_THAT(kernel.status().message(), HasSubstr(" without CPU panels"));
    }
  }
}

// A problem never runs on a kernel lossier than it accepts; one that accepts
// int8 takes an int8 kernel from cpu::kMinConvertedRows rows, where the CPU
// has VNNI and the format has one, and its name says so.
TEST(CpuSchedulerTest, PicksKernelsOfTheAcceptedActivationPrecision) {
  const Scheduler scheduler(cpu::CpuKernels());
  const bool has_vnni = cpu::DetectIsa() >= cpu::Isa::kAvx512Vnni;
  for (WeightFormat format : kAllWeightFormats) {
    for (int64_t m : {1, 16, 64, 256}) {
      for (ActivationPrecision precision : kAllActivationPrecisions) {
        GemmProblem problem = ProblemOfFormat(m, 4096, format);
        problem.dtype = DType::kF32;
        problem.activation_precision = precision;
        SCOPED_TRACE(problem.DebugString());
        const absl::StatusOr<const GemmKernel*> kernel =
            scheduler.Pick(problem);
        ASSERT_TRUE(kernel.ok()) << kernel.status();
        EXPECT_LE(ActivationPrecisionOf(**kernel, problem.dtype), precision);
        // nvfp4's groups of 16 have no int8 kernel.
        const bool int8 = precision == ActivationPrecision::kInt8 && has_vnni &&
                          format != WeightFormat::kNvfp4 &&
                          m >= cpu::kMinConvertedRows;
        EXPECT_EQ((*kernel)->QuantizesActivationsToInt8(), int8)
            << (*kernel)->name();
        EXPECT_EQ(absl::EndsWith((*kernel)->name(), "_int8"), int8)
            << (*kernel)->name();
      }
    }
  }
}

// Each bf16 level rounds f32 and f16 A from its own rows, whatever variant a
// tuning table prefers: avx512_bf16 from one row, amx from its tiles'
// cpu::kMinConvertedRows (fewer stay exact there, as its rules were
// measured). bf16 A, which needs no rounding, takes them at any M, and a
// problem that accepts only exact products never does.
TEST(CpuSchedulerTest, EachBf16LevelRoundsF32OrF16ActivationsFromItsRows) {
  const struct {
    cpu::Isa isa;
    int64_t min_rounded_rows;
  } levels[] = {{cpu::Isa::kAvx512Bf16, 1},
                {cpu::Isa::kAmx, cpu::kMinConvertedRows}};
  for (const auto& level : levels) {
    for (KernelVariant variant :
         {KernelVariant::kFused, KernelVariant::kDoubleBuffered}) {
      const Scheduler scheduler(
          cpu::CpuKernels(level.isa),
          TuningTable({U4b8Rule(4096, 4096, 0, variant)}));
      for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
        for (int64_t m : {int64_t{1}, int64_t{4}, cpu::kMinConvertedRows - 1,
                          cpu::kMinConvertedRows}) {
          for (ActivationPrecision precision :
               {ActivationPrecision::kExact, ActivationPrecision::kBf16}) {
            GemmProblem problem = Problem(m, 4096);
            problem.dtype = dtype;
            problem.activation_precision = precision;
            SCOPED_TRACE(absl::StrCat(cpu::IsaName(level.isa), " ",
                                      KernelVariantName(variant), " ",
                                      problem.DebugString()));
            const absl::StatusOr<const GemmKernel*> kernel =
                scheduler.Pick(problem);
            ASSERT_TRUE(kernel.ok()) << kernel.status();
            EXPECT_EQ((*kernel)->variant(), variant);
            EXPECT_EQ((*kernel)->RoundsActivationsToBf16(dtype),
                      dtype != DType::kBF16 &&
                          precision == ActivationPrecision::kBf16 &&
                          m >= level.min_rounded_rows)
                << (*kernel)->name();
          }
        }
      }
    }
  }
}

TEST(ActivationPrecisionTest, ParsesItsNamesAndRefusesOthers) {
  for (ActivationPrecision precision : kAllActivationPrecisions) {
    const absl::StatusOr<ActivationPrecision> parsed =
        ParseActivationPrecision(ActivationPrecisionName(precision));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, precision);
  }
  const absl::StatusOr<ActivationPrecision> bad =
      ParseActivationPrecision("fp8");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("\"fp8\": use exact, bf16 or int8"));
}

TEST(CpuSchedulerTest, ReadsTheBuiltInRulesOfItsKernelsLevel) {
  for (cpu::Isa isa : {cpu::Isa::kAvx2, cpu::Isa::kAvx512,
                       cpu::Isa::kAvx512Bf16, cpu::Isa::kAmx}) {
    EXPECT_EQ(Scheduler(cpu::CpuKernels(isa)).table().isa(), cpu::IsaName(isa));
  }
  EXPECT_EQ(Scheduler(cpu::CpuKernels(cpu::Isa::kScalar)).table().isa(), "");
}

TEST(CpuSchedulerTest, FallsBackToTheRulesOfTheNearestLevelBelow) {
  const TuningTable avx2_only({TuningRule{.isa = "avx2",
                                          .format = WeightFormat::kU4b8,
                                          .group_size = 128,
                                          .k = 4096,
                                          .n = 4096,
                                          .threads = 2,
                                          .max_m = 0,
                                          .variant = KernelVariant::kStriped}});
  const Scheduler scheduler(cpu::CpuKernels(cpu::Isa::kAmx), avx2_only);
  EXPECT_EQ(scheduler.table().isa(), "avx2");
  EXPECT_EQ(scheduler.PreferredVariant(Problem(64, 4096)),
            KernelVariant::kStriped);
}

TEST(CpuSchedulerTest, PicksTheScalarReferenceAtTheScalarLevel) {
  const Scheduler scheduler(cpu::CpuKernels(cpu::Isa::kScalar));
  for (WeightFormat format : kAllWeightFormats) {
    const GemmProblem problem = ProblemOfFormat(1, 4096, format);
    const absl::StatusOr<const GemmKernel*> kernel = scheduler.Pick(problem);
    ASSERT_TRUE(kernel.ok()) << kernel.status();
    EXPECT_EQ((*kernel)->name(),
              absl::StrCat("reference_", WeightFormatName(format), "_scalar"));
  }
}

}  // namespace
}  // namespace nibble
