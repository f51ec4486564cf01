// Drives a real nibbled through the `nibble` CLI the way a user would, with
// weights and activations in files, and checks the output file against the
// float64 reference.
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/dtype.h"
#include "kernels/reference.h"
#include "kernels/weight_format.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"

namespace nibble {
namespace {

using ::nibble::testing::ReadFile;
using ::testing::HasSubstr;

template <typename T>
void WriteFile(const std::string& path, const std::vector<T>& array) {
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(array.data()),
             array.size() * sizeof(T));
}

class CliTest : public ::testing::TestWithParam<std::tuple<WeightFormat, int>> {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, {"--threads=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    dir_ = ::testing::TempDir();
  }

  // Runs `nibble <args> --target=...`; its exit code, output in `output_`.
  int Nibble(const std::string& args) {
    return testing::RunCommand(absl::StrCat(NIBBLE_CLI_PATH, " ", args,
                                            " --target=", server_->target()),
                               &output_);
  }

  std::unique_ptr<testing::NibbledProcess> server_;
  std::string dir_;
  std::string output_;
};

TEST_P(CliTest, MatmulOnFilesMatchesTheFloat64Reference) {
  const auto [format, group] = GetParam();
  const int64_t k = 256;
  const WeightSpec spec{format, k, 40, group == 0 ? k : group};
  const uint64_t seed = 500 + static_cast<int>(format) * 7 + group;
  SCOPED_TRACE(::testing::Message() << spec.DebugString() << " seed " << seed);
  const QuantizedWeight weight = RandomQuantizedWeight(spec, seed);
  const std::string prefix = absl::StrCat(dir_, "/w", seed);
  WriteFile(prefix + ".qweight", weight.qweight);
  WriteFile(prefix + ".scales", weight.scales);
  std::string zeros_flag;
  if (HasZeros(format)) {
    WriteFile(prefix + ".zeros", weight.zeros);
    zeros_flag = absl::StrCat(" --zeros=", prefix, ".zeros");
  }
  ASSERT_EQ(
      Nibble(absl::StrCat("upload --name=w --format=", WeightFormatName(format),
                          " --k=", spec.k, " --n=", spec.n,
                          " --group=", spec.group_size, " --qweight=", prefix,
                          ".qweight --scales=", prefix, ".scales", zeros_flag)),
      0)
      << output_;

  const int64_t m = 3;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dtype));
    std::vector<float> a(m * k);
    for (float& value : a) value = uniform(rng);
    std::string a_bytes(a.size() * DTypeSize(dtype), '\0');
    ConvertFromFloat(dtype, a.data(), a.size(), a_bytes.data());
    ConvertToFloat(dtype, a_bytes.data(), a.size(), a.data());
    const std::string input = absl::StrCat(prefix, ".a.", DTypeName(dtype));
    const std::string output = absl::StrCat(prefix, ".c.", DTypeName(dtype));
    std::ofstream(input, std::ios::binary) << a_bytes;

    ASSERT_EQ(Nibble(absl::StrCat("matmul --name=w --m=", m,
                                  " --dtype=", DTypeName(dtype),
                                  " --input=", input, " --output=", output)),
              0)
        << output_;
    const std::string c_bytes = ReadFile(output);
    ASSERT_EQ(c_bytes.size(), m * spec.n * DTypeSize(dtype));
    std::vector<float> c(m * spec.n);
    ConvertToFloat(dtype, c_bytes.data(), c.size(), c.data());
    const double error = MaxRelativeError(
        std::vector<double>(c.begin(), c.end()),
        ReferenceMatmul(std::vector<double>(a.begin(), a.end()), m, weight));
    EXPECT_LE(error, dtype == DType::kF32 ? 1e-4 : 1e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(
    EveryFormatAndGroup, CliTest,
    ::testing::Combine(::testing::Values(WeightFormat::kFp4,
                                         WeightFormat::kU4b8,
                                         WeightFormat::kU4),
                       ::testing::Values(32, 64, 128, 0)),
    [](const auto& info) {
      const int group = std::get<1>(info.param);
      return absl::StrCat(WeightFormatName(std::get<0>(info.param)), "_g",
                          group == 0 ? "K" : absl::StrCat(group));
    });

class CliWorkflowTest : public CliTest {};

TEST_F(CliWorkflowTest, RandomUploadCheckListDelete) {
  ASSERT_EQ(Nibble("upload --name=r --format=u4 --k=128 --n=24 --group=64 "
                   "--random=9"),
            0)
      << output_;
  ASSERT_EQ(Nibble("matmul --name=r --m=2 --dtype=f16 --random_input=3 "
                   "--check --random=9"),
            0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("max relative error"));
  ASSERT_EQ(Nibble("list"), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("r"));
  ASSERT_EQ(Nibble("delete --name=r"), 0) << output_;
  EXPECT_NE(Nibble("get --name=r"), 0);
  EXPECT_THAT(output_, HasSubstr("no weight named \"r\""));
}

TEST_F(CliWorkflowTest, CheckFailsAgainstTheWrongWeight) {
  ASSERT_EQ(Nibble("upload --name=r --format=fp4 --k=64 --n=16 --group=32 "
                   "--random=1"),
            0)
      << output_;
  EXPECT_EQ(Nibble("matmul --name=r --m=1 --dtype=f32 --random_input=3 "
                   "--check --random=2"),
            1)
      << output_;
}

TEST_F(CliWorkflowTest, MissingFileIsAClearError) {
  EXPECT_NE(Nibble(absl::StrCat("upload --name=x --format=u4b8 --k=64 --n=16 "
                                "--group=32 --qweight=",
                                dir_, "/absent.qweight --scales=", dir_,
                                "/absent.scales")),
            0);
  EXPECT_THAT(output_, HasSubstr("absent.qweight"));
}

TEST_F(CliWorkflowTest, HealthIsServing) {
  EXPECT_EQ(Nibble("health"), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("SERVING"));
}

}  // namespace
}  // namespace nibble
