#include "client/arrival_schedule.h"

#include <cstdint>

#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::client {
namespace {

using ::testing::HasSubstr;

TEST(ArrivalProcessTest, ParsesBothNamesAndRejectsOthers) {
  EXPECT_EQ(*ParseArrivalProcess("constant"), ArrivalProcess::kConstant);
  EXPECT_EQ(*ParseArrivalProcess("poisson"), ArrivalProcess::kPoisson);
  const absl::StatusOr<ArrivalProcess> bad = ParseArrivalProcess("bursty");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("constant or poisson"));
  EXPECT_EQ(ArrivalProcessName(ArrivalProcess::kPoisson), "poisson");
}

TEST(ArrivalScheduleTest, ConstantHitsExactTimes) {
  ArrivalSchedule schedule(ArrivalProcess::kConstant, /*rate=*/200,
                           /*seed=*/1);
  for (int i = 0; i < 100000; ++i) {
    ASSERT_EQ(schedule.Next(), absl::Seconds(i / 200.0)) << "request " << i;
  }
  ArrivalSchedule slow(ArrivalProcess::kConstant, /*rate=*/4, /*seed=*/1);
  EXPECT_EQ(slow.Next(), absl::ZeroDuration());
  EXPECT_EQ(slow.Next(), absl::Milliseconds(250));
  EXPECT_EQ(slow.Next(), absl::Milliseconds(500));
}

TEST(ArrivalScheduleTest, ConstantIsTheSameForAnySeed) {
  ArrivalSchedule a(ArrivalProcess::kConstant, 3, /*seed=*/1);
  ArrivalSchedule b(ArrivalProcess::kConstant, 3, /*seed=*/2);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(a.Next(), b.Next());
}

TEST(ArrivalScheduleTest, PoissonMeanGapIsOneOverRate) {
  const double rate = 250;
  const uint64_t seed = 42;
  const int samples = 200000;
  ArrivalSchedule schedule(ArrivalProcess::kPoisson, rate, seed);
  absl::Duration previous = absl::ZeroDuration();
  for (int i = 0; i < samples; ++i) {
    const absl::Duration next = schedule.Next();
    ASSERT_GE(next, previous) << "seed " << seed << ", request " << i;
    previous = next;
  }
  const double mean_gap = absl::ToDoubleSeconds(previous) / samples;
  EXPECT_NEAR(mean_gap, 1 / rate, 0.02 / rate) << "seed " << seed;
}

TEST(ArrivalScheduleTest, PoissonRepeatsForTheSameSeed) {
  ArrivalSchedule a(ArrivalProcess::kPoisson, 100, /*seed=*/7);
  ArrivalSchedule b(ArrivalProcess::kPoisson, 100, /*seed=*/7);
  ArrivalSchedule c(ArrivalProcess::kPoisson, 100, /*seed=*/8);
  bool differs = false;
  for (int i = 0; i < 10; ++i) {
    const absl::Duration next = a.Next();
    EXPECT_EQ(next, b.Next());
    differs |= next != c.Next();
  }
  EXPECT_TRUE(differs);
}

}  // namespace
}  // namespace nibble::client
