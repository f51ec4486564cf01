// Tests nibble-bench's JSON lines and table: fields, derived rates, and the
// pick and baseline columns.
#include "bench/kernels/report.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::bench {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ReportContext Context() {
  return ReportContext{.limits = {.cpu_model = "Test \"CPU\"",
                                  .threads = 2,
                                  .llc_bytes = 100 << 20,
                                  .read_gbps = 10,
                                  .read_buffer_bytes = 512 << 20,
                                  .fma_peak_gflops = 200,
                                  .fma_isa = "avx512",
                                  .wake_us = 20},
                       .kernel_isa = "avx512",
                       .openblas = true,
                       .openblas_description = "OpenBLAS 0.3.21",
                       .tuning_table = "built-in",
                       .repeats = 10};
}

// u4b8 group 128, 4096 x 4096, m = 4: fused picked and fastest.
PointResult Result() {
  PointResult result{.weight = {WeightFormat::kU4b8, 128},
                     .shape = {4096, 4096},
                     .m = 4,
                     .threads = 2,
                     .weight_bytes = 8'000'000,
                     .kernels = {{.kernel = "fused_u4b8_avx512",
                                  .variant = KernelVariant::kFused,
                                  .pick = true,
                                  .timing = {1000, 10}},
                                 {.kernel = "striped_u4b8_avx512",
                                  .variant = KernelVariant::kStriped,
                                  .pick = false,
                                  .timing = {2000, 10}}},
                     .pick = "fused_u4b8_avx512"};
  return result;
}

std::vector<SgemmResult> Sgemm() {
  return {{.shape = {4096, 4096}, .m = 4, .threads = 2, .timing = {5000, 10}}};
}

TEST(ReportTest, Rates) {
  EXPECT_DOUBLE_EQ(GigabytesPerSecond(8'000'000, 1000), 8);
  EXPECT_DOUBLE_EQ(Gflops(4, 4096, 4096, 1000), 2.0 * 4 * 4096 * 4096 / 1e6);
  EXPECT_EQ(GigabytesPerSecond(1, 0), 0);
}

TEST(ReportTest, JsonStringEscapes) {
  EXPECT_EQ(JsonString("plain"), "\"plain\"");
  EXPECT_EQ(JsonString("a \"b\" \\ c\n\t\x01"),
            "\"a \\\"b\\\" \\\\ c\\n\\t\\u0001\"");
}

TEST(ReportTest, JsonLinesHaveTheMachineThenOneObjectPerTiming) {
  const std::vector<std::string> lines =
      JsonLines(Context(), {Result()}, Sgemm());
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(lines[0],
            "{\"machine\":{\"cpu\":\"Test \\\"CPU\\\"\",\"threads\":2,"
            "\"llc_bytes\":104857600,\"read_gbps\":10.000,"
            "\"read_buffer_bytes\":536870912,\"fma_peak_gflops\":200.000,"
            "\"fma_isa\":\"avx512\",\"wake_us\":20.000,"
            "\"kernel_isa\":\"avx512\","
            "\"openblas\":\"OpenBLAS 0.3.21\",\"tuning_table\":\"built-in\","
            "\"repeats\":10,\"dtype\":\"f32\"}}");
  EXPECT_EQ(lines[1],
            "{\"backend\":\"cpu\",\"kernel\":\"fused_u4b8_avx512\","
            "\"variant\":\"fused\",\"pick\":true,\"format\":\"u4b8\","
            "\"group\":128,\"m\":4,\"k\":4096,\"n\":4096,\"threads\":2,"
            "\"median_us\":1000.000,\"calls\":10,\"bytes\":8000000,"
            "\"gbps\":8.000,\"gflops\":134.218,\"floor_us\":800.000}");
  EXPECT_THAT(lines[2], HasSubstr("\"variant\":\"striped\",\"pick\":false"));
  EXPECT_THAT(lines[3],
              HasSubstr("{\"backend\":\"openblas\",\"kernel\":\"sgemm\","
                        "\"variant\":\"sgemm\",\"pick\":false,\"format\":"
                        "\"f32\",\"group\":0,\"m\":4,\"k\":4096,\"n\":4096"));
  EXPECT_THAT(lines[3], HasSubstr("\"bytes\":67108864"));
}

TEST(ReportTest, WithoutOpenBlasTheMachineSaysNull) {
  ReportContext context = Context();
  context.openblas = false;
  EXPECT_THAT(JsonLines(context, {}, {})[0], HasSubstr("\"openblas\":null"));
}

TEST(ReportTest, TableHasTheLimitsAndOneLinePerPoint) {
  const std::string table = FormatTable(Context(), {Result()}, Sgemm());
  EXPECT_THAT(table, HasSubstr("read bandwidth  10.0 GB/s"));
  EXPECT_THAT(table, HasSubstr("fp32 FMA peak   200.0 GFLOP/s (avx512)"));
  EXPECT_THAT(table, HasSubstr("wake-up         20.0 us until every thread"));
  EXPECT_THAT(table, HasSubstr("OpenBLAS 0.3.21"));
  // fused 1000 us, no double_buffered, striped 2000 us; fused picked at 1.00
  // of the best; floor 800 us; 8 GB/s, 134.2 GFLOP/s, 67.1% of the peak;
  // sgemm 5000 us, 5x slower.
  EXPECT_THAT(table,
              HasSubstr("u4b8     128     4   4096   4096    1000.0         -"
                        "    2000.0  fused              1.00     800.0    8.0"
                        "    134.2  67.1%    5000.0   5.00x"));
  EXPECT_THAT(table, Not(HasSubstr("not timed")));
}

TEST(ReportTest, TableMarksAnUntimedPick) {
  PointResult result = Result();
  result.kernels[0].pick = false;
  result.pick = "reference_u4b8_scalar";
  const std::string table = FormatTable(Context(), {result}, {});
  EXPECT_THAT(table, HasSubstr("reference_u4b8_scalar*"));
  EXPECT_THAT(table, HasSubstr("is not timed"));
}

}  // namespace
}  // namespace nibble::bench
