// Tests the tuning table's text form, its file loading and its lookup.
#include "kernels/tuning_table.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/gemm_kernel.h"

namespace nibble {
namespace {

using ::testing::HasSubstr;
using ::testing::Optional;

constexpr KernelVariant kFused = KernelVariant::kFused;
constexpr KernelVariant kDoubleBuffered = KernelVariant::kDoubleBuffered;
constexpr KernelVariant kStriped = KernelVariant::kStriped;

TuningRule Rule(WeightFormat format, int64_t group, int64_t k, int64_t n,
                int threads, int64_t max_m, KernelVariant variant,
                std::string isa = "") {
  return TuningRule{.isa = std::move(isa),
                    .format = format,
                    .group_size = group,
                    .k = k,
                    .n = n,
                    .threads = threads,
                    .max_m = max_m,
                    .variant = variant};
}

TuningRule U4b8Rule(int64_t k, int64_t n, int64_t max_m,
                    KernelVariant variant) {
  return Rule(WeightFormat::kU4b8, 128, k, n, 2, max_m, variant);
}

GemmProblem Problem(int64_t m, int64_t k, int64_t n,
                    WeightFormat format = WeightFormat::kU4b8,
                    int64_t group = 128, int threads = 2) {
  return GemmProblem{.m = m,
                     .n = n,
                     .k = k,
                     .format = format,
                     .group_size = group,
                     .dtype = DType::kF32,
                     .threads = threads};
}

// The error Parse gives for `text`, or "ok".
std::string ParseError(const std::string& text) {
  const absl::StatusOr<TuningTable> table = TuningTable::Parse(text);
  if (table.ok()) return "ok";
  EXPECT_EQ(table.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(table.status().message());
}

TEST(TuningTableTest, ParsesRulesCommentsAndBlankLines) {
  const absl::StatusOr<TuningTable> table = TuningTable::Parse(
      "# format group k n threads max_m variant\n"
      "\n"
      "u4b8 128 4096 14336 2 4 fused   # small m\n"
      "  fp4\t32 4096 4096 8 0 double_buffered\r\n"
      "u4 64 8192 28672 1 16 striped\n"
      "u4 64 8192 28672 1 0 reference");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rules(),
            (std::vector<TuningRule>{
                Rule(WeightFormat::kU4b8, 128, 4096, 14336, 2, 4, kFused),
                Rule(WeightFormat::kFp4, 32, 4096, 4096, 8, 0, kDoubleBuffered),
                Rule(WeightFormat::kU4, 64, 8192, 28672, 1, 16, kStriped),
                Rule(WeightFormat::kU4, 64, 8192, 28672, 1, 0,
                     KernelVariant::kReference)}));
}

TEST(TuningTableTest, EmptyTextIsAnEmptyTable) {
  const absl::StatusOr<TuningTable> table =
      TuningTable::Parse("# nothing measured\n\n");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_TRUE(table->rules().empty());
}

TEST(TuningTableTest, ParseErrorsNameTheLineAndTheProblem) {
  const std::string good = "u4b8 128 4096 4096 2 8 fused\n";
  EXPECT_EQ(ParseError(good), "ok");
  EXPECT_EQ(ParseError("# header\n" + good + "u4b8 128 4096 4096 2 fused\n"),
            "line 3: expected 7 columns (format group k n threads max_m "
            "variant), or 8 with the ISA level first, got 6");
  EXPECT_THAT(ParseError(good + "avx2 u4b8 128 4096 4096 2 8 fused extra\n"),
              HasSubstr("line 2: expected 7 columns"));
  EXPECT_EQ(ParseError("u4b8 128 4096 4096 2 8 fused 1\n"),
            "line 1: the first of 8 columns must be an ISA level (scalar, "
            "avx2, avx512, avx512_vnni, avx512_bf16, amx) or a GPU level (sm "
            "and the compute capability, e.g. sm90), got \"u4b8\"");
  EXPECT_THAT(ParseError("AVX2 u4b8 128 4096 4096 2 8 fused\n"),
              HasSubstr("got \"AVX2\""));
  EXPECT_THAT(ParseError("avx512bf16 u4b8 128 4096 4096 2 8 fused\n"),
              HasSubstr("got \"avx512bf16\""));
  for (absl::string_view level : {"sm", "sm_90", "SM90", "sm90a"}) {
    EXPECT_THAT(
        ParseError(absl::StrCat(level, " u4b8 128 4096 4096 2 8 fused")),
        HasSubstr(absl::StrCat("got \"", level, "\"")));
  }
  EXPECT_EQ(ParseError("int4 128 4096 4096 2 8 fused"),
            "line 1: unknown weight format \"int4\": use fp4, u4b8, u4, mxfp4 "
            "or nvfp4");
  EXPECT_EQ(ParseError("u4b8 128 4096 4096 2 8 split_k"),
            "line 1: unknown variant \"split_k\": use fused, double_buffered, "
            "striped or reference");
  EXPECT_EQ(ParseError("\n\nu4b8 0 4096 4096 2 8 fused"),
            "line 3: group must be a positive integer, got \"0\"");
  EXPECT_EQ(ParseError("u4b8 128 -4096 4096 2 8 fused"),
            "line 1: k must be a positive integer, got \"-4096\"");
  EXPECT_EQ(ParseError("u4b8 128 4096 4k 2 8 fused"),
            "line 1: n must be a positive integer, got \"4k\"");
  EXPECT_EQ(ParseError("u4b8 128 4096 4096 0 8 fused"),
            "line 1: threads must be a positive integer, got \"0\"");
  EXPECT_EQ(ParseError("u4b8 128 4096 4096 2 -1 fused"),
            "line 1: max_m must be 0 (no bound) or a positive integer, got "
            "\"-1\"");
  EXPECT_EQ(ParseError("u4b8 128 4096 99999999 2 8 fused"),
            "line 1: n must be at most 1048576, got \"99999999\"");
}

TEST(TuningTableTest, RepeatedRuleIsAnError) {
  EXPECT_EQ(ParseError("u4b8 128 4096 4096 2 8 fused\n"
                       "u4b8 128 4096 4096 2 0 double_buffered\n"
                       "u4b8 128 4096 4096 2 8 striped\n"),
            "line 3: repeats the isa, format, group, k, n, threads and max_m "
            "of line 1; keep one of them");
  EXPECT_EQ(ParseError("amx u4b8 128 4096 4096 2 8 fused\n"
                       "avx2 u4b8 128 4096 4096 2 8 striped\n"
                       "u4b8 128 4096 4096 2 8 striped\n"),
            "ok");
}

TEST(TuningTableTest, ParsesAndSerializesTheIsaLevel) {
  const absl::StatusOr<TuningTable> table = TuningTable::Parse(
      "avx512_bf16 u4b8 128 4096 4096 2 7 fused\n"
      "u4b8 128 4096 4096 2 0 double_buffered\n");
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rules(),
            (std::vector<TuningRule>{Rule(WeightFormat::kU4b8, 128, 4096, 4096,
                                          2, 7, kFused, "avx512_bf16"),
                                     Rule(WeightFormat::kU4b8, 128, 4096, 4096,
                                          2, 0, kDoubleBuffered)}));
  EXPECT_EQ(table->isa(), "avx512_bf16");
  EXPECT_EQ(table->Serialize(),
            "# isa format group k n threads max_m variant\n"
            "avx512_bf16 u4b8 128 4096 4096 2 7 fused\n"
            "u4b8 128 4096 4096 2 0 double_buffered\n");
}

// Levels as a scheduler's kernels list them: the CPU's own first.
constexpr absl::string_view kBf16Levels[] = {"avx512_bf16", "avx512", "avx2",
                                             "scalar"};

TuningTable TwoLevelTable() {
  return TuningTable(
      {Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 15, kFused, "amx"),
       Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 0, kDoubleBuffered, "amx"),
       Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 0, kStriped, "avx512")});
}

TEST(TuningTableTest, AnswersWithTheFirstLevelItListsUntilOneIsPicked) {
  const TuningTable table = TwoLevelTable();
  EXPECT_EQ(table.isa(), "amx");
  EXPECT_THAT(table.Lookup(Problem(16, 4096, 4096)), Optional(kDoubleBuffered));
}

TEST(TuningTableTest, ALevelsOwnRuleOverridesAnEveryLevelRuleOfTheSameBound) {
  for (const bool level_rule_first : {false, true}) {
    std::vector<TuningRule> rules = {
        Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 8, kFused),
        Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 8, kStriped, "amx")};
    if (level_rule_first) std::swap(rules[0], rules[1]);
    const TuningTable table(std::move(rules));
    EXPECT_EQ(table.isa(), "amx");
    EXPECT_THAT(table.Lookup(Problem(4, 4096, 4096)), Optional(kStriped))
        << "level rule first: " << level_rule_first;
    const absl::string_view scalar[] = {"scalar"};
    EXPECT_THAT(table.ForIsas(scalar).Lookup(Problem(4, 4096, 4096)),
                Optional(kFused));
  }
}

TEST(TuningTableTest, ForIsasFallsBackToTheNearestLevelBelow) {
  const TuningTable table = TwoLevelTable().ForIsas(kBf16Levels);
  EXPECT_EQ(table.isa(), "avx512");
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096)), Optional(kStriped));
  EXPECT_THAT(table.Lookup(Problem(16, 4096, 4096)), Optional(kStriped));

  const absl::string_view amx_first[] = {"amx", "avx512_bf16", "avx512"};
  EXPECT_EQ(TwoLevelTable().ForIsas(amx_first).isa(), "amx");
}

TEST(TuningTableTest, ForIsasWithNoLevelOfItsOwnAnswersOnlyEveryLevelRules) {
  const absl::string_view scalar[] = {"scalar"};
  EXPECT_EQ(TwoLevelTable().ForIsas(scalar).isa(), "");
  EXPECT_EQ(TwoLevelTable().ForIsas(scalar).Lookup(Problem(1, 4096, 4096)),
            std::nullopt);

  TuningTable with_any_level(
      {Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 0, kFused),
       Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 0, kStriped, "amx")});
  EXPECT_THAT(with_any_level.ForIsas(scalar).Lookup(Problem(64, 4096, 4096)),
              Optional(kFused));
  EXPECT_EQ(with_any_level.ForIsas({}).isa(), "amx");
}

TEST(TuningTableTest, DefaultHasRulesForEveryVectorLevel) {
  for (absl::string_view level : {"amx", "avx512_bf16", "avx512", "avx2"}) {
    const absl::string_view levels[] = {level};
    const TuningTable table = TuningTable::Default().ForIsas(levels);
    EXPECT_EQ(table.isa(), level);
    for (WeightFormat format : {WeightFormat::kFp4, WeightFormat::kU4b8,
                                WeightFormat::kU4, WeightFormat::kNvfp4}) {
      EXPECT_NE(table.Lookup(Problem(
                    16, 4096, 4096, format,
                    FixedGroupSize(format) > 0 ? FixedGroupSize(format) : 128)),
                std::nullopt)
          << level << " " << WeightFormatName(format);
    }
  }
}

TEST(TuningTableTest, SerializeRoundTrips) {
  const TuningTable table({
      Rule(WeightFormat::kFp4, 32, 4096, 14336, 2, 8, kFused),
      Rule(WeightFormat::kFp4, 32, 4096, 14336, 2, 0, kDoubleBuffered),
      Rule(WeightFormat::kU4, 128, 8192, 28672, 16, 3, kStriped),
      Rule(WeightFormat::kU4b8, 64, 14336, 4096, 1, 0,
           KernelVariant::kReference),
  });
  const std::string text = table.Serialize();
  EXPECT_THAT(text, ::testing::StartsWith("# "));
  const absl::StatusOr<TuningTable> parsed = TuningTable::Parse(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status() << "\n" << text;
  EXPECT_EQ(parsed->rules(), table.rules());
  EXPECT_EQ(parsed->Serialize(), text);
}

// A file name of this process alone: ctest runs this binary once per ISA
// level, at the same time.
std::string ScratchPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "." + std::to_string(getpid());
}

TEST(TuningTableTest, LoadReadsAFile) {
  const std::string path = ScratchPath("tuning_table_test.txt");
  std::ofstream(path) << "u4 128 4096 4096 2 0 striped\n";
  const absl::StatusOr<TuningTable> table = TuningTable::Load(path);
  ASSERT_TRUE(table.ok()) << table.status();
  EXPECT_EQ(table->rules(),
            std::vector<TuningRule>{
                Rule(WeightFormat::kU4, 128, 4096, 4096, 2, 0, kStriped)});
  std::remove(path.c_str());
}

TEST(TuningTableTest, LoadErrorsNameTheFile) {
  const std::string missing = ::testing::TempDir() + "/no_such_table.txt";
  const absl::StatusOr<TuningTable> not_found = TuningTable::Load(missing);
  EXPECT_EQ(not_found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(not_found.status().message()), HasSubstr(missing));

  const std::string path = ScratchPath("bad_tuning_table.txt");
  std::ofstream(path) << "# ok\nu4 128 4096 4096 2 0 sideways\n";
  const absl::StatusOr<TuningTable> bad = TuningTable::Load(path);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()),
              HasSubstr(path + ": line 2: unknown variant \"sideways\""));
  std::remove(path.c_str());
}

TEST(TuningTableTest, LookupWithoutRulesOfTheFormatIsNullopt) {
  EXPECT_EQ(TuningTable().Lookup(Problem(1, 4096, 4096)), std::nullopt);
  const TuningTable table(
      {Rule(WeightFormat::kFp4, 128, 4096, 4096, 2, 0, kStriped)});
  EXPECT_EQ(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kU4b8)),
            std::nullopt);
  EXPECT_EQ(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kU4)),
            std::nullopt);
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kFp4)),
              Optional(kStriped));
}

TEST(TuningTableTest, Fp4CodedFormatsWithoutRulesTakeTheFp4Rules) {
  const TuningTable fp4_only({
      Rule(WeightFormat::kFp4, 32, 4096, 4096, 2, 3, kStriped),
      Rule(WeightFormat::kFp4, 32, 4096, 4096, 2, 0, kFused),
      Rule(WeightFormat::kFp4, 128, 4096, 4096, 2, 0, kDoubleBuffered),
  });
  EXPECT_THAT(fp4_only.Lookup(Problem(1, 4096, 4096, WeightFormat::kMxfp4, 32)),
              Optional(kStriped));
  EXPECT_THAT(fp4_only.Lookup(Problem(8, 4096, 4096, WeightFormat::kMxfp4, 32)),
              Optional(kFused));
  // nvfp4's group of 16 is nearest the fp4 rules of group 32.
  EXPECT_THAT(fp4_only.Lookup(Problem(1, 4096, 4096, WeightFormat::kNvfp4, 16)),
              Optional(kStriped));
  EXPECT_THAT(
      fp4_only.Lookup(Problem(64, 4096, 4096, WeightFormat::kNvfp4, 16)),
      Optional(kFused));

  // Rules of their own win over fp4's.
  const TuningTable with_mxfp4({
      Rule(WeightFormat::kFp4, 32, 4096, 4096, 2, 0, kStriped),
      Rule(WeightFormat::kMxfp4, 32, 65536, 65536, 2, 0, kDoubleBuffered),
  });
  EXPECT_THAT(
      with_mxfp4.Lookup(Problem(1, 4096, 4096, WeightFormat::kMxfp4, 32)),
      Optional(kDoubleBuffered));
  EXPECT_THAT(
      with_mxfp4.Lookup(Problem(1, 4096, 4096, WeightFormat::kNvfp4, 16)),
      Optional(kStriped));
  // The INT4 formats have no stand-in.
  EXPECT_EQ(with_mxfp4.Lookup(Problem(1, 4096, 4096, WeightFormat::kU4b8)),
            std::nullopt);
}

TEST(TuningTableTest, LookupPicksTheNearestShape) {
  const TuningTable table({
      U4b8Rule(4096, 4096, 0, kFused),
      U4b8Rule(4096, 14336, 0, kDoubleBuffered),
      U4b8Rule(14336, 4096, 0, kStriped),
  });
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096)), Optional(kFused));
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 16384)), Optional(kDoubleBuffered));
  EXPECT_THAT(table.Lookup(Problem(1, 12288, 4096)), Optional(kStriped));
  EXPECT_THAT(table.Lookup(Problem(1, 2048, 3000)), Optional(kFused));
  // 4096 x 9000 is nearer 4096 x 14336 than 4096 x 4096 on a log scale.
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 9000)), Optional(kDoubleBuffered));
}

TEST(TuningTableTest, LookupPrefersTheNearestGroupOverTheNearestShape) {
  const TuningTable table({
      Rule(WeightFormat::kFp4, 32, 4096, 4096, 2, 0, kFused),
      Rule(WeightFormat::kFp4, 128, 65536, 65536, 2, 0, kStriped),
  });
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kFp4, 128)),
              Optional(kStriped));
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kFp4, 32)),
              Optional(kFused));
  // 64 is as near 32 as 128; then the nearer shape decides.
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kFp4, 64)),
              Optional(kFused));
  // Per-channel scales (group = K) are nearest the largest group measured.
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kFp4, 4096)),
              Optional(kStriped));
}

TEST(TuningTableTest, LookupTiesGoToTheRuleListedFirst) {
  const TuningTable table({
      Rule(WeightFormat::kFp4, 128, 4096, 4096, 2, 0, kStriped),
      Rule(WeightFormat::kFp4, 32, 4096, 4096, 2, 0, kFused),
  });
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kFp4, 64)),
              Optional(kStriped));
}

TEST(TuningTableTest, LookupPicksTheNearestThreadCountAfterTheShape) {
  const TuningTable table({
      Rule(WeightFormat::kU4b8, 128, 4096, 4096, 2, 0, kFused),
      Rule(WeightFormat::kU4b8, 128, 4096, 4096, 16, 0, kStriped),
      Rule(WeightFormat::kU4b8, 128, 8192, 8192, 64, 0, kDoubleBuffered),
  });
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kU4b8, 128, 1)),
              Optional(kFused));
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096, WeightFormat::kU4b8, 128, 8)),
              Optional(kStriped));
  // The shape decides before the thread count.
  EXPECT_THAT(
      table.Lookup(Problem(1, 4096, 4096, WeightFormat::kU4b8, 128, 64)),
      Optional(kStriped));
  EXPECT_THAT(table.Lookup(Problem(1, 8192, 8192, WeightFormat::kU4b8, 128, 2)),
              Optional(kDoubleBuffered));
}

TEST(TuningTableTest, LookupOrdersRulesByMaxMWithZeroLast) {
  // Listed out of order on purpose.
  const TuningTable table({
      U4b8Rule(4096, 4096, 0, kDoubleBuffered),
      U4b8Rule(4096, 4096, 16, kStriped),
      U4b8Rule(4096, 4096, 4, kFused),
  });
  EXPECT_THAT(table.Lookup(Problem(1, 4096, 4096)), Optional(kFused));
  EXPECT_THAT(table.Lookup(Problem(4, 4096, 4096)), Optional(kFused));
  EXPECT_THAT(table.Lookup(Problem(5, 4096, 4096)), Optional(kStriped));
  EXPECT_THAT(table.Lookup(Problem(16, 4096, 4096)), Optional(kStriped));
  EXPECT_THAT(table.Lookup(Problem(17, 4096, 4096)), Optional(kDoubleBuffered));
  EXPECT_THAT(table.Lookup(Problem(100000, 4096, 4096)),
              Optional(kDoubleBuffered));
}

TEST(TuningTableTest, LookupPastEveryBoundTakesTheLargestMaxM) {
  const TuningTable table({
      U4b8Rule(4096, 4096, 64, kStriped),
      U4b8Rule(4096, 4096, 8, kFused),
  });
  EXPECT_THAT(table.Lookup(Problem(8, 4096, 4096)), Optional(kFused));
  EXPECT_THAT(table.Lookup(Problem(64, 4096, 4096)), Optional(kStriped));
  EXPECT_THAT(table.Lookup(Problem(65, 4096, 4096)), Optional(kStriped));
}

TEST(TuningTableTest, DefaultParsesAndCoversEveryFormat) {
  const TuningTable& table = TuningTable::Default();
  EXPECT_FALSE(table.rules().empty());
  const absl::StatusOr<TuningTable> reparsed =
      TuningTable::Parse(table.Serialize());
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_EQ(reparsed->rules(), table.rules());
  for (WeightFormat format : kAllWeightFormats) {
    SCOPED_TRACE(WeightFormatName(format));
    const int64_t fixed_group = FixedGroupSize(format);
    EXPECT_NE(table.Lookup(Problem(1, 4096, 4096, format,
                                   fixed_group > 0 ? fixed_group : 128)),
              std::nullopt);
    EXPECT_NE(table.Lookup(Problem(256, 8192, 28672, format,
                                   fixed_group > 0 ? fixed_group : 32)),
              std::nullopt);
  }
  EXPECT_EQ(&TuningTable::Default(), &table);
}

}  // namespace
}  // namespace nibble
