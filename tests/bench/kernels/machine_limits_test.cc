// Tests the parts of the machine measurements that do not depend on the
// machine, and that the measurements on this one are plausible.
#include "bench/kernels/machine_limits.h"

#include "base/thread_pool.h"
#include "gtest/gtest.h"

namespace nibble::bench {
namespace {

TEST(ParseCacheSizeTest, SysfsForms) {
  EXPECT_EQ(ParseCacheSize("48K"), 48 << 10);
  EXPECT_EQ(ParseCacheSize("107520K\n"), int64_t{107520} << 10);
  EXPECT_EQ(ParseCacheSize("32M"), 32 << 20);
  EXPECT_EQ(ParseCacheSize("1G"), int64_t{1} << 30);
  EXPECT_EQ(ParseCacheSize("4096"), 4096);
  EXPECT_EQ(ParseCacheSize(""), 0);
  EXPECT_EQ(ParseCacheSize("K"), 0);
  EXPECT_EQ(ParseCacheSize("12Q"), 0);
}

TEST(StreamingBufferBytesTest, FourTimesTheCacheAndAtLeast512MiB) {
  EXPECT_EQ(StreamingBufferBytes(0), int64_t{512} << 20);
  EXPECT_EQ(StreamingBufferBytes(int64_t{32} << 20), int64_t{512} << 20);
  EXPECT_EQ(StreamingBufferBytes(int64_t{105} << 20), int64_t{512} << 20);
  EXPECT_EQ(StreamingBufferBytes(int64_t{256} << 20), int64_t{1} << 30);
}

TEST(MachineLimitsTest, MeasurementsArePositive) {
  ThreadPool pool(2);
  EXPECT_GT(MeasureReadBandwidth(pool, int64_t{16} << 20, 1), 0);
  const FmaPeak peak = MeasureFmaPeak(pool);
  if (peak.isa != "none") {
    EXPECT_GT(peak.gflops, 0);
  }
  EXPECT_GT(MeasureWakeUpMicros(pool, 3), 0);
  ThreadPool caller_only(1);
  EXPECT_EQ(MeasureWakeUpMicros(caller_only, 3), 0);
  EXPECT_FALSE(CpuModelName().empty());
  EXPECT_GE(LastLevelCacheBytes(), 0);
}

}  // namespace
}  // namespace nibble::bench
