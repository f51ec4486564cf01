#include "client/weight_files.h"

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempPath(absl::string_view name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

void WriteBytes(const std::string& path, const std::string& bytes) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  ASSERT_NE(file, nullptr) << path;
  ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), file), bytes.size());
  ASSERT_EQ(std::fclose(file), 0);
}

WeightFilePaths PathsFor(absl::string_view stem, WeightFormat format) {
  return {TempPath(absl::StrCat(stem, ".qweight")),
          TempPath(absl::StrCat(stem, ".scales")),
          HasZeros(format) ? TempPath(absl::StrCat(stem, ".zeros")) : ""};
}

TEST(WeightFilesTest, RoundTripsEachFormat) {
  for (WeightFormat format :
       {WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4}) {
    SCOPED_TRACE(WeightFormatName(format));
    const WeightSpec spec{format, 256, 48, 64};
    const QuantizedWeight written = RandomQuantizedWeight(spec, 3);
    const WeightFilePaths paths =
        PathsFor(absl::StrCat("round_trip_", WeightFormatName(format)), format);
    ASSERT_TRUE(WriteWeightFiles(written, paths).ok());

    absl::StatusOr<QuantizedWeight> read = ReadWeightFiles(spec, paths);
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_EQ(read->spec, spec);
    EXPECT_EQ(read->qweight, written.qweight);
    EXPECT_EQ(read->scales, written.scales);
    EXPECT_EQ(read->zeros, written.zeros);
  }
}

TEST(WeightFilesTest, RejectsWrongSizeNamingTheFile) {
  const WeightSpec spec{WeightFormat::kU4, 128, 16, 32};
  const WeightFilePaths paths = PathsFor("wrong_size", spec.format);
  ASSERT_TRUE(WriteWeightFiles(RandomQuantizedWeight(spec, 1), paths).ok());
  WriteBytes(paths.scales, std::string(100, '\0'));

  const absl::Status status = ReadWeightFiles(spec, paths).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("scales file"), HasSubstr(paths.scales),
                    HasSubstr("has 100 bytes"),
                    HasSubstr(absl::StrCat("expected ", spec.scales_bytes()))));
}

TEST(WeightFilesTest, RejectsMissingFile) {
  const WeightSpec spec{WeightFormat::kU4b8, 64, 8, 32};
  const WeightFilePaths paths = {TempPath("does_not_exist.qweight"),
                                 TempPath("does_not_exist.scales"), ""};
  const absl::Status status = ReadWeightFiles(spec, paths).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr(paths.qweight));
}

TEST(WeightFilesTest, ZerosFileMustMatchTheFormat) {
  const WeightSpec u4{WeightFormat::kU4, 64, 8, 32};
  WeightFilePaths paths = PathsFor("zeros_match", WeightFormat::kU4b8);
  EXPECT_THAT(ReadWeightFiles(u4, paths).status().message(),
              HasSubstr("need a zeros file"));

  const WeightSpec u4b8{WeightFormat::kU4b8, 64, 8, 32};
  paths.zeros = TempPath("zeros_match.zeros");
  EXPECT_THAT(ReadWeightFiles(u4b8, paths).status().message(),
              HasSubstr("no zero points"));
}

TEST(WeightFilesTest, RejectsZeroPointAboveFifteen) {
  const WeightSpec spec{WeightFormat::kU4, 64, 8, 32};
  const WeightFilePaths paths = PathsFor("bad_zero", spec.format);
  ASSERT_TRUE(WriteWeightFiles(RandomQuantizedWeight(spec, 1), paths).ok());
  std::string zeros(spec.zeros_bytes(), '\x03');
  zeros[5] = 16;
  WriteBytes(paths.zeros, zeros);

  const absl::Status status = ReadWeightFiles(spec, paths).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(paths.zeros), HasSubstr("out of range")));
}

TEST(MatrixFileTest, RoundTrips) {
  const std::string path = TempPath("matrix_round_trip");
  const std::string bytes(3 * 5 * 2, '\x7f');
  ASSERT_TRUE(WriteMatrixFile(path, 3, 5, DType::kBF16, bytes).ok());
  absl::StatusOr<std::string> read = ReadMatrixFile(path, 3, 5, DType::kBF16);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, bytes);
}

TEST(MatrixFileTest, RejectsWrongSizeNamingTheFile) {
  const std::string path = TempPath("matrix_wrong_size");
  WriteBytes(path, std::string(3 * 5 * 2, '\0'));
  // The bytes of a [3, 5] f16 matrix are too few for f32.
  const absl::Status status = ReadMatrixFile(path, 3, 5, DType::kF32).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(path), HasSubstr("has 30 bytes"),
                    HasSubstr("expected 60"), HasSubstr("[3, 5] f32")));

  EXPECT_EQ(
      WriteMatrixFile(path, 3, 5, DType::kF32, std::string(30, '\0')).code(),
      absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace nibble
