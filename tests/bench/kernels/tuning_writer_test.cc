// Tests how measurements become tuning rules: the fastest variant per M,
// merged over consecutive Ms, one key per weight, shape and thread count.
#include "bench/kernels/tuning_writer.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/tuning_table.h"

namespace nibble::bench {
namespace {

constexpr KernelVariant kFused = KernelVariant::kFused;
constexpr KernelVariant kDoubleBuffered = KernelVariant::kDoubleBuffered;
constexpr KernelVariant kStriped = KernelVariant::kStriped;

PointResult Point(WeightKind weight, Shape shape, int64_t m, double fused_us,
                  double double_buffered_us, double striped_us) {
  PointResult result;
  result.weight = weight;
  result.shape = shape;
  result.m = m;
  result.threads = 2;
  const std::pair<KernelVariant, double> timings[] = {
      {kFused, fused_us},
      {kDoubleBuffered, double_buffered_us},
      {kStriped, striped_us}};
  for (const auto& [variant, us] : timings) {
    KernelTiming timing;
    timing.kernel = std::string(KernelVariantName(variant));
    timing.variant = variant;
    timing.timing = {us, 3};
    result.kernels.push_back(timing);
  }
  return result;
}

TuningRule Rule(WeightKind weight, Shape shape, int64_t max_m,
                KernelVariant variant) {
  return TuningRule{.isa = "avx2",
                    .format = weight.format,
                    .group_size = weight.group_size,
                    .k = shape.k,
                    .n = shape.n,
                    .threads = 2,
                    .max_m = max_m,
                    .variant = variant};
}

const WeightKind kU4b8{WeightFormat::kU4b8, 128};
const WeightKind kFp4{WeightFormat::kFp4, 32};
const Shape kSquare{4096, 4096};
const Shape kWide{4096, 14336};

TEST(MeasuredTuningTableTest, MergesConsecutiveWinnersAndBoundsByTheNextM) {
  const std::vector<PointResult> results = {
      Point(kU4b8, kSquare, 1, 10, 30, 20),
      Point(kU4b8, kSquare, 4, 10, 30, 20),
      Point(kU4b8, kSquare, 16, 40, 30, 35),
      Point(kU4b8, kSquare, 64, 90, 50, 40),
      Point(kU4b8, kSquare, 256, 400, 100, 200)};
  EXPECT_EQ(
      MeasuredTuningTable(results, "avx2", kCpuNearTie).rules(),
      (std::vector<TuningRule>{Rule(kU4b8, kSquare, 15, kFused),
                               Rule(kU4b8, kSquare, 63, kDoubleBuffered),
                               Rule(kU4b8, kSquare, 255, kStriped),
                               Rule(kU4b8, kSquare, 0, kDoubleBuffered)}));
}

TEST(MeasuredTuningTableTest, OneWinnerIsOneUnboundedRule) {
  const std::vector<PointResult> results = {
      Point(kU4b8, kSquare, 1, 10, 30, 20),
      Point(kU4b8, kSquare, 64, 10, 30, 20)};
  EXPECT_EQ(MeasuredTuningTable(results, "avx2", kCpuNearTie).rules(),
            std::vector<TuningRule>{Rule(kU4b8, kSquare, 0, kFused)});
}

TEST(MeasuredTuningTableTest, KeysStayApartInFirstSeenOrderWhateverTheMOrder) {
  const std::vector<PointResult> results = {
      Point(kFp4, kWide, 16, 40, 30, 50), Point(kU4b8, kSquare, 1, 10, 30, 20),
      Point(kFp4, kWide, 1, 10, 30, 20), Point(kU4b8, kSquare, 16, 40, 30, 50)};
  const TuningTable table = MeasuredTuningTable(results, "avx2", kCpuNearTie);
  EXPECT_EQ(table.rules(), (std::vector<TuningRule>{
                               Rule(kFp4, kWide, 15, kFused),
                               Rule(kFp4, kWide, 0, kDoubleBuffered),
                               Rule(kU4b8, kSquare, 15, kFused),
                               Rule(kU4b8, kSquare, 0, kDoubleBuffered)}));
  const absl::StatusOr<TuningTable> parsed =
      TuningTable::Parse(table.Serialize());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->rules(), table.rules());
}

TEST(MeasuredTuningTableTest, ANearTieGoesToTheFirstVariantMeasured) {
  // Striped is 3 % faster than fused (a tie), double-buffered 10 % (a win).
  const std::vector<PointResult> results = {
      Point(kU4b8, kSquare, 1, 100, 300, 97),
      Point(kU4b8, kSquare, 16, 100, 90, 200)};
  EXPECT_EQ(
      MeasuredTuningTable(results, "avx2", kCpuNearTie).rules(),
      (std::vector<TuningRule>{Rule(kU4b8, kSquare, 15, kFused),
                               Rule(kU4b8, kSquare, 0, kDoubleBuffered)}));
}

// As nibble-gpu-bench measures: threads is the SM count, the level the GPU's;
// a variant more than 2 % faster wins, one within 2 % ties.
TEST(MeasuredTuningTableTest, GpuPointsMakeRulesOfTheGpusLevelAndSmCount) {
  std::vector<PointResult> results = {
      Point(kU4b8, kWide, 1, 17.7, 16.9, 18.9),
      Point(kU4b8, kWide, 256, 180.2, 51.1, 67.7),
      Point(kU4b8, kWide, 1024, 605.5, 197.8, 193.2),
      Point(kFp4, kWide, 64, 59.0, 34.1, 33.7),
      Point(kFp4, kWide, 1024, 626.8, 204.2, 198.2)};
  for (PointResult& result : results) result.threads = 132;
  const TuningTable table = MeasuredTuningTable(results, "sm90", kGpuNearTie);
  const auto sm90 = [](WeightKind weight, int64_t max_m,
                       KernelVariant variant) {
    TuningRule rule = Rule(weight, kWide, max_m, variant);
    rule.isa = "sm90";
    rule.threads = 132;
    return rule;
  };
  EXPECT_EQ(table.rules(),
            (std::vector<TuningRule>{
                sm90(kU4b8, 1023, kDoubleBuffered), sm90(kU4b8, 0, kStriped),
                sm90(kFp4, 1023, kDoubleBuffered), sm90(kFp4, 0, kStriped)}));
  const absl::StatusOr<TuningTable> reparsed =
      TuningTable::Parse(table.Serialize());
  ASSERT_TRUE(reparsed.ok()) << reparsed.status();
  EXPECT_THAT(reparsed->ForGpu("sm90", 132)
                  .Lookup({.m = 2048,
                           .n = kWide.n,
                           .k = kWide.k,
                           .format = kU4b8.format,
                           .group_size = kU4b8.group_size}),
              ::testing::Optional(kStriped));
}

TEST(MeasuredTuningTableTest, PointsWithoutTimingsAreLeftOut) {
  PointResult untimed = Point(kU4b8, kSquare, 16, 1, 1, 1);
  untimed.kernels.clear();
  EXPECT_EQ(MeasuredTuningTable({Point(kU4b8, kSquare, 1, 10, 30, 20), untimed},
                                "avx2", kCpuNearTie)
                .rules(),
            std::vector<TuningRule>{Rule(kU4b8, kSquare, 0, kFused)});
  EXPECT_TRUE(
      MeasuredTuningTable({untimed}, "avx2", kCpuNearTie).rules().empty());
}

}  // namespace
}  // namespace nibble::bench
