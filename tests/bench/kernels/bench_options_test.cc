// Tests nibble-bench's flag parsing: the default and quick grids, narrowing
// flags, --json alone or with a file, and usage mistakes.
#include "bench/kernels/bench_options.h"

#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::bench {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr WeightFormat kFp4 = WeightFormat::kFp4;
constexpr WeightFormat kU4b8 = WeightFormat::kU4b8;
constexpr WeightFormat kU4 = WeightFormat::kU4;
constexpr WeightFormat kMxfp4 = WeightFormat::kMxfp4;
constexpr WeightFormat kNvfp4 = WeightFormat::kNvfp4;

BenchOptions Parse(const std::vector<std::string>& args) {
  absl::StatusOr<BenchOptions> options = ParseBenchOptions(args);
  EXPECT_TRUE(options.ok()) << options.status();
  return options.ok() ? *options : BenchOptions{};
}

// The usage error for `args`.
std::string Error(const std::vector<std::string>& args) {
  absl::StatusOr<BenchOptions> options = ParseBenchOptions(args);
  if (options.ok()) return "ok";
  EXPECT_EQ(options.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(options.status().message());
}

TEST(BenchOptionsTest, DefaultGrid) {
  const BenchOptions options = Parse({});
  EXPECT_THAT(options.ms, ElementsAre(1, 4, 16, 64, 256));
  EXPECT_THAT(options.shapes,
              ElementsAre(Shape{4096, 4096}, Shape{4096, 14336},
                          Shape{14336, 4096}, Shape{8192, 28672}));
  EXPECT_THAT(options.weights,
              ElementsAre(WeightKind{kFp4, 128}, WeightKind{kFp4, 32},
                          WeightKind{kU4b8, 128}, WeightKind{kU4, 128}));
  EXPECT_EQ(options.threads, static_cast<int>(std::max(
                                 1u, std::thread::hardware_concurrency())));
  EXPECT_EQ(options.repeats, 10);
  EXPECT_EQ(options.rounds, 1);
  EXPECT_FALSE(options.json_to_stdout);
  EXPECT_TRUE(options.json_path.empty());
  EXPECT_TRUE(options.tuning_table_path.empty());
  EXPECT_TRUE(options.write_tuning_table_path.empty());
  EXPECT_FALSE(options.help);
}

TEST(BenchOptionsTest, NarrowingFlags) {
  const BenchOptions options =
      Parse({"--m=64,1,16,1", "--shapes=4096x4096,8192x28672",
             "--formats=fp4,u4b8", "--threads=3", "--repeats", "5"});
  EXPECT_THAT(options.ms, ElementsAre(1, 16, 64));
  EXPECT_THAT(options.shapes,
              ElementsAre(Shape{4096, 4096}, Shape{8192, 28672}));
  // fp4 keeps both of its default groups.
  EXPECT_THAT(options.weights,
              ElementsAre(WeightKind{kFp4, 128}, WeightKind{kFp4, 32},
                          WeightKind{kU4b8, 128}));
  EXPECT_EQ(options.threads, 3);
  EXPECT_EQ(options.repeats, 5);
}

TEST(BenchOptionsTest, GroupsApplyToEveryFormat) {
  EXPECT_THAT(Parse({"--groups=128"}).weights,
              ElementsAre(WeightKind{kFp4, 128}, WeightKind{kU4b8, 128},
                          WeightKind{kU4, 128}));
  EXPECT_THAT(Parse({"--groups=32,64", "--formats=u4"}).weights,
              ElementsAre(WeightKind{kU4, 32}, WeightKind{kU4, 64}));
}

TEST(BenchOptionsTest, Mxfp4AndNvfp4TakeTheirOwnGroupSize) {
  EXPECT_THAT(Parse({"--formats=mxfp4,nvfp4"}).weights,
              ElementsAre(WeightKind{kMxfp4, 32}, WeightKind{kNvfp4, 16}));
  EXPECT_THAT(Parse({"--formats=nvfp4", "--quick"}).weights,
              ElementsAre(WeightKind{kNvfp4, 16}));
  // --groups applies to the formats whose group size is free.
  EXPECT_THAT(Parse({"--formats=fp4,mxfp4,nvfp4", "--groups=32,128"}).weights,
              ElementsAre(WeightKind{kFp4, 32}, WeightKind{kFp4, 128},
                          WeightKind{kMxfp4, 32}, WeightKind{kNvfp4, 16}));
}

TEST(BenchOptionsTest, QuickIsSmallAndStillNarrows) {
  const BenchOptions quick = Parse({"--quick"});
  EXPECT_THAT(quick.ms, ElementsAre(1, 16));
  EXPECT_THAT(quick.shapes, ElementsAre(Shape{1024, 1024}));
  EXPECT_EQ(quick.weights.size(), 3u);
  EXPECT_EQ(quick.repeats, 3);
  const BenchOptions narrowed =
      Parse({"--formats=u4b8", "--quick", "--m=4", "--repeats=7"});
  EXPECT_THAT(narrowed.ms, ElementsAre(4));
  EXPECT_THAT(narrowed.weights, ElementsAre(WeightKind{kU4b8, 128}));
  EXPECT_EQ(narrowed.repeats, 7);
}

TEST(BenchOptionsTest, EachParseStartsFromTheDefaults) {
  EXPECT_THAT(Parse({"--m=4", "--quick"}).ms, ElementsAre(4));
  const BenchOptions defaults = Parse({});
  EXPECT_THAT(defaults.ms, ElementsAre(1, 4, 16, 64, 256));
  EXPECT_EQ(defaults.repeats, 10);
}

TEST(BenchOptionsTest, JsonAloneWritesToStdout) {
  const BenchOptions options = Parse({"--json"});
  EXPECT_TRUE(options.json_to_stdout);
  EXPECT_TRUE(options.json_path.empty());
}

TEST(BenchOptionsTest, JsonWithAFileWritesThere) {
  const BenchOptions options = Parse({"--json=out.jsonl"});
  EXPECT_FALSE(options.json_to_stdout);
  EXPECT_EQ(options.json_path, "out.jsonl");
}

TEST(BenchOptionsTest, JsonAloneLeavesTheNextArgumentAlone) {
  const BenchOptions options = Parse({"--json", "--quick", "--m=4"});
  EXPECT_TRUE(options.json_to_stdout);
  EXPECT_THAT(options.shapes, ElementsAre(Shape{1024, 1024}));
  EXPECT_THAT(options.ms, ElementsAre(4));
  EXPECT_EQ(Error({"--json", "out.jsonl"}),
            "unexpected argument \"out.jsonl\": nibble-bench takes only "
            "--flags");
}

TEST(BenchOptionsTest, OutputFlags) {
  const BenchOptions to_file =
      Parse({"--json=/tmp/r.jsonl", "--tuning_table", "in.txt",
             "--write_tuning_table=out.txt"});
  EXPECT_FALSE(to_file.json_to_stdout);
  EXPECT_EQ(to_file.json_path, "/tmp/r.jsonl");
  EXPECT_EQ(to_file.tuning_table_path, "in.txt");
  EXPECT_EQ(to_file.write_tuning_table_path, "out.txt");
  EXPECT_TRUE(Parse({"--help"}).help);
  EXPECT_TRUE(Parse({"-h"}).help);
}

TEST(BenchOptionsTest, ActivationPrecision) {
  EXPECT_EQ(Parse({}).activation_precision, ActivationPrecision::kBf16);
  EXPECT_EQ(Parse({"--activation_precision=int8"}).activation_precision,
            ActivationPrecision::kInt8);
  EXPECT_EQ(Parse({"--activation_precision=exact"}).activation_precision,
            ActivationPrecision::kExact);
  EXPECT_EQ(Error({"--activation_precision=fp8"}),
            "--activation_precision=fp8: unknown activation precision "
            "\"fp8\": use exact, bf16 or int8");
  EXPECT_THAT(
      Error({"--activation_precision=int8", "--write_tuning_table=out.txt"}),
      HasSubstr("drop --activation_precision=int8"));
}

TEST(BenchOptionsTest, Dtype) {
  EXPECT_EQ(Parse({}).dtype, DType::kF32);
  EXPECT_EQ(Parse({"--dtype=bf16"}).dtype, DType::kBF16);
  EXPECT_EQ(Parse({"--dtype=f16"}).dtype, DType::kF16);
  EXPECT_THAT(Error({"--dtype=f64"}), HasSubstr("--dtype=f64: "));
  EXPECT_THAT(Error({"--dtype=bf16", "--write_tuning_table=out.txt"}),
              HasSubstr("drop --dtype"));
}

TEST(BenchOptionsTest, UsageMistakesNameTheFlag) {
  EXPECT_EQ(Error({"--mm=1"}), "unknown flag --mm");
  EXPECT_EQ(Error({"stray"}),
            "unexpected argument \"stray\": nibble-bench takes only --flags");
  // base/command_line's wording since it parses the flags.
  EXPECT_EQ(Error({"--m"}), "flag --m needs a value");
  EXPECT_EQ(Error({"--m=1,0"}), "--m=1,0: \"0\" is not a positive integer");
  EXPECT_EQ(Error({"--m=1,,4"}),
            "--m=1,,4: give a comma-separated list without empty items");
  EXPECT_EQ(Error({"--threads=-2"}),
            "--threads=-2: \"-2\" is not a positive integer");
  EXPECT_EQ(Error({"--threads=5000"}),
            "--threads=5000: 5000 is above the largest allowed, 1024");
  EXPECT_EQ(Error({"--repeats=x"}),
            "--repeats=x: \"x\" is not a positive integer");
  EXPECT_EQ(Error({"--rounds=0"}),
            "--rounds=0: \"0\" is not a positive integer");
  EXPECT_EQ(Error({"--shapes=4096*4096"}),
            "--shapes=4096*4096: \"4096*4096\" is not KxN with positive K and "
            "N (e.g. 4096x14336)");
  EXPECT_EQ(Error({"--formats=u4b8,int4"}),
            "--formats=u4b8,int4: unknown weight format \"int4\": use fp4, "
            "u4b8, u4, mxfp4 or nvfp4");
  EXPECT_EQ(Error({"--quick=yes"}), "--quick=yes: --quick takes no value");
  EXPECT_EQ(Error({"--noquick"}), "unknown flag --noquick");
  EXPECT_EQ(Error({"--json="}), "--json=: give a value, or --json alone");
  EXPECT_EQ(Error({"--tuning_table="}), "--tuning_table=: the value is empty");
  EXPECT_EQ(Error({"--tuning_table", ""}),
            "--tuning_table=: the value is empty");
}

TEST(BenchOptionsTest, GridPointsMustBeValidWeights) {
  EXPECT_THAT(Error({"--groups=96"}),
              HasSubstr("cannot time fp4 group 96 at 4096x4096: group size 96 "
                        "is not supported"));
  EXPECT_THAT(Error({"--shapes=1004x64", "--groups=32"}),
              HasSubstr("k=1004 is not a multiple of 8"));
  EXPECT_THAT(Error({"--shapes=4104x64"}),
              HasSubstr("not a multiple of the group size 128; change "
                        "--shapes or --groups"));
}

}  // namespace
}  // namespace nibble::bench
