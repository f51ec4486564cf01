// Tests the weight file format: round trips for every format, and rejection
// of every truncation, every flipped byte and headers that lie about sizes.
#include "server/storage/weight_file.h"

#include <cstring>
#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/test_files.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

void ExpectSameWeight(const QuantizedWeight& got, const QuantizedWeight& want) {
  EXPECT_EQ(got.spec, want.spec);
  EXPECT_EQ(got.qweight, want.qweight);
  EXPECT_EQ(got.scales, want.scales);
  EXPECT_EQ(got.zeros, want.zeros);
  EXPECT_EQ(got.activation_order, want.activation_order);
}

// Rewrites the trailing checksum so that only the edited field is wrong.
void FixChecksum(std::string* bytes) {
  WeightFileChecksum checksum;
  checksum.Update(absl::string_view(*bytes).substr(
      0, bytes->size() - kWeightFileChecksumBytes));
  const uint64_t hash = checksum.Finish();
  std::memcpy(bytes->data() + bytes->size() - kWeightFileChecksumBytes, &hash,
              sizeof(hash));
}

void PutU64At(std::string* bytes, int offset, uint64_t value) {
  std::memcpy(bytes->data() + offset, &value, sizeof(value));
}

TEST(WeightFileTest, RoundTripsEveryFormatAndGroupSize) {
  uint64_t seed = 1;
  for (WeightFormat format :
       {WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4}) {
    for (int64_t group_size : {32, 64, 128, 256}) {
      const WeightSpec spec{format, 256, 24, group_size};
      SCOPED_TRACE(absl::StrCat(spec.DebugString(), " seed=", seed));
      const QuantizedWeight weight = RandomQuantizedWeight(spec, seed++);
      const std::string bytes = SerializeWeightFile("layer.0-q_proj", weight);
      EXPECT_EQ(bytes.size(), kWeightFileHeaderBytes + 14 +
                                  spec.canonical_bytes() +
                                  kWeightFileChecksumBytes);
      absl::StatusOr<WeightFile> file = ParseWeightFile(bytes);
      ASSERT_TRUE(file.ok()) << file.status();
      EXPECT_EQ(file->name, "layer.0-q_proj");
      ExpectSameWeight(file->weight, weight);
    }
  }
}

TEST(WeightFileTest, RoundTripsTheFp4BlockFormatsWithTheGlobalScale) {
  uint64_t seed = 11;
  for (const WeightSpec& spec :
       {WeightSpec{WeightFormat::kMxfp4, 256, 24, 32},
        WeightSpec{WeightFormat::kNvfp4, 256, 24, 16, 0.0123f}}) {
    SCOPED_TRACE(absl::StrCat(spec.DebugString(), " seed=", seed));
    const QuantizedWeight weight = RandomQuantizedWeight(spec, seed++);
    absl::StatusOr<WeightFile> file =
        ParseWeightFile(SerializeWeightFile("w", weight));
    ASSERT_TRUE(file.ok()) << file.status();
    ExpectSameWeight(file->weight, weight);
    EXPECT_EQ(file->weight.spec.global_scale, spec.global_scale);
  }
}

TEST(WeightFileTest, RoundTripsAnActivationOrderAsVersion2) {
  constexpr uint64_t kSeed = 31;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const WeightSpec spec{WeightFormat::kU4, 256, 24, 32};
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  const std::string without_order = SerializeWeightFile("w", weight);
  EXPECT_EQ(without_order[8], kWeightFileVersion);
  weight.activation_order = RandomActivationOrder(spec.k, kSeed);
  const std::string bytes = SerializeWeightFile("w", weight);
  EXPECT_EQ(bytes[8], kWeightFileVersionWithActivationOrder);
  EXPECT_EQ(bytes.size(), without_order.size() + spec.k * sizeof(int32_t));
  absl::StatusOr<WeightFile> file = ParseWeightFile(bytes);
  ASSERT_TRUE(file.ok()) << file.status();
  ExpectSameWeight(file->weight, weight);

  // Version 1 files (every file written before orders) load without one.
  absl::StatusOr<WeightFile> old = ParseWeightFile(without_order);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_TRUE(old->weight.activation_order.empty());
}

TEST(WeightFileTest, RejectsACorruptActivationOrderAsDataLoss) {
  constexpr uint64_t kSeed = 32;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const WeightSpec spec{WeightFormat::kU4b8, 64, 8, 32};
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  weight.activation_order = RandomActivationOrder(spec.k, kSeed);
  const std::string bytes = SerializeWeightFile("w", weight);
  const size_t order_offset =
      bytes.size() - kWeightFileChecksumBytes - spec.k * sizeof(int32_t);

  // A flipped bit anywhere in the order fails the checksum.
  std::string flipped = bytes;
  flipped[order_offset + 4 * 9] ^= 0x02;
  absl::Status status = ParseWeightFile(flipped).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("checksum mismatch"));

  // An order with a valid checksum that is not a permutation is refused too.
  std::string repeated = bytes;
  std::memcpy(repeated.data() + order_offset + 4 * 9,
              repeated.data() + order_offset + 4 * 3, sizeof(int32_t));
  FixChecksum(&repeated);
  status = ParseWeightFile(repeated).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(),
              HasSubstr(absl::StrCat(
                  "invalid weight data: activation_order[9] = ",
                  weight.activation_order[3], " appears twice (also at 3)")));

  // Version 2 without the order's bytes is truncated.
  std::string short_file = bytes.substr(0, order_offset);
  short_file.append(kWeightFileChecksumBytes, '\0');
  status = ParseWeightFile(short_file).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("truncated"));
}

TEST(WeightFileTest, RejectsAGlobalScaleOnAnotherFormatOrAnInvalidOne) {
  std::string bytes = SerializeWeightFile(
      "w", RandomQuantizedWeight({WeightFormat::kFp4, 32, 8, 32}, 5));
  constexpr int kGlobalScaleOffset = 68;
  const float two = 2.0f;
  std::memcpy(bytes.data() + kGlobalScaleOffset, &two, sizeof(two));
  FixChecksum(&bytes);
  EXPECT_THAT(ParseWeightFile(bytes).status().message(),
              HasSubstr("fp4 has no global scale"));

  bytes = SerializeWeightFile(
      "w", RandomQuantizedWeight({WeightFormat::kNvfp4, 32, 8, 16, 0.5f}, 5));
  const float negative = -0.5f;
  std::memcpy(bytes.data() + kGlobalScaleOffset, &negative, sizeof(negative));
  FixChecksum(&bytes);
  const absl::Status status = ParseWeightFile(bytes).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("finite and positive"));
}

TEST(WeightFileTest, ChecksumIsTheSameInAnyPieces) {
  std::mt19937_64 rng(7);
  SCOPED_TRACE("seed=7");
  std::string data(1000, '\0');
  for (char& c : data) c = static_cast<char>(rng());
  WeightFileChecksum whole;
  whole.Update(data);
  const uint64_t expected = whole.Finish();
  for (size_t split : {0, 1, 7, 8, 9, 500, 999, 1000}) {
    WeightFileChecksum pieces;
    pieces.Update(absl::string_view(data).substr(0, split));
    pieces.Update(absl::string_view(data).substr(split, 3));
    pieces.Update(
        absl::string_view(data).substr(split + 3 > 1000 ? 1000 : split + 3));
    EXPECT_EQ(pieces.Finish(), expected) << "split at " << split;
  }
  // Trailing zero bytes are not lost in the padding of the last word.
  WeightFileChecksum longer;
  longer.Update(data);
  longer.Update(absl::string_view("\0", 1));
  EXPECT_NE(longer.Finish(), expected);
}

// A weight file of `bytes` on disk; its path.
std::string FileOf(const std::string& name, const std::string& bytes) {
  const std::string directory = nibble::testing::FreshDirectory(name);
  std::filesystem::create_directories(directory);
  const std::string path = absl::StrCat(directory, "/w.nibble");
  nibble::testing::WriteFile(path, bytes);
  return path;
}

TEST(WeightFileReaderTest, HandsOverTheTensorsInPiecesThenChecksThem) {
  constexpr uint64_t kSeed = 17;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  // 2.1 MiB of tensors: three pieces.
  const WeightSpec spec{WeightFormat::kU4, 1024, 4096, 128};
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  weight.activation_order = RandomActivationOrder(spec.k, kSeed);
  const std::string bytes = SerializeWeightFile("w", weight);
  absl::StatusOr<WeightFileReader> reader =
      WeightFileReader::Open(FileOf("reader", bytes));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(reader->name(), "w");
  EXPECT_EQ(reader->header().spec, spec);
  EXPECT_EQ(reader->activation_order(), weight.activation_order);
  std::string tensors;
  int pieces = 0;
  ASSERT_TRUE(reader
                  ->ReadTensors([&](absl::string_view piece) {
                    EXPECT_LE(piece.size(), WeightFileReader::kPieceBytes);
                    tensors.append(piece.data(), piece.size());
                    ++pieces;
                    return absl::OkStatus();
                  })
                  .ok());
  EXPECT_EQ(pieces, 3);
  const WeightBytes sent = BytesOf(weight);
  EXPECT_EQ(tensors, absl::StrCat(sent.qweight, sent.scales, sent.zeros));

  absl::StatusOr<WeightFileReader> whole =
      WeightFileReader::Open(FileOf("reader-whole", bytes));
  ASSERT_TRUE(whole.ok()) << whole.status();
  absl::StatusOr<QuantizedWeight> read = whole->ReadWhole();
  ASSERT_TRUE(read.ok()) << read.status();
  ExpectSameWeight(*read, weight);
}

TEST(WeightFileReaderTest, RefusesWhatParseWeightFileRefuses) {
  SCOPED_TRACE("seed 18");
  QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4, 64, 8, 32}, 18);
  const std::string bytes = SerializeWeightFile("w", weight);
  // Sizes and names before any tensor is read.
  for (const std::string& bad :
       {bytes.substr(0, 100), bytes.substr(0, bytes.size() - 1), bytes + "x"}) {
    absl::StatusOr<WeightFileReader> reader =
        WeightFileReader::Open(FileOf("reader-size", bad));
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_EQ(reader.status().message(),
              ParseWeightFile(bad).status().message());
  }
  // A flipped tensor byte: every piece handed over, then the checksum.
  std::string flipped = bytes;
  flipped[kWeightFileHeaderBytes + 1 + 5] ^= 0x01;
  absl::StatusOr<WeightFileReader> reader =
      WeightFileReader::Open(FileOf("reader-flip", flipped));
  ASSERT_TRUE(reader.ok()) << reader.status();
  int64_t handed_over = 0;
  const absl::Status status = reader->ReadTensors([&](absl::string_view piece) {
    handed_over += piece.size();
    return absl::OkStatus();
  });
  EXPECT_EQ(handed_over, weight.spec.canonical_bytes());
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(status.message(), ParseWeightFile(flipped).status().message());
  // A zero point out of range, intact checksum: ReadWhole checks values.
  weight.zeros[3] = 16;
  absl::StatusOr<WeightFileReader> bad_zero = WeightFileReader::Open(
      FileOf("reader-zero", SerializeWeightFile("w", weight)));
  ASSERT_TRUE(bad_zero.ok()) << bad_zero.status();
  EXPECT_THAT(bad_zero->ReadWhole().status().message(),
              HasSubstr("invalid weight data"));
}

TEST(WeightFileTest, RejectsEveryTruncation) {
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4, 32, 8, 32}, 3);
  SCOPED_TRACE("seed=3");
  const std::string bytes = SerializeWeightFile("w", weight);
  for (size_t length = 0; length < bytes.size(); ++length) {
    absl::StatusOr<WeightFile> file =
        ParseWeightFile(absl::string_view(bytes).substr(0, length));
    ASSERT_FALSE(file.ok()) << "accepted the first " << length << " bytes";
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(file.status().message(), HasSubstr("truncated"));
  }
  EXPECT_THAT(ParseWeightFile(bytes + "x").status().message(),
              HasSubstr("1 bytes past the end"));
}

TEST(WeightFileTest, RejectsEveryFlippedByte) {
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 64, 16, 32}, 4);
  SCOPED_TRACE("seed=4");
  const std::string bytes = SerializeWeightFile("flip", weight);
  std::mt19937 rng(4);
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string corrupt = bytes;
    corrupt[i] ^= static_cast<char>(1 + rng() % 255);
    absl::StatusOr<WeightFile> file = ParseWeightFile(corrupt);
    ASSERT_FALSE(file.ok()) << "accepted a flip at byte " << i;
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  }
  // In the tensors only the checksum can notice.
  std::string corrupt = bytes;
  corrupt[kWeightFileHeaderBytes + 4 + 10] ^= 0x10;
  EXPECT_THAT(ParseWeightFile(corrupt).status().message(),
              HasSubstr("checksum mismatch"));
}

TEST(WeightFileTest, RejectsBadMagicVersionAndFormat) {
  const std::string bytes = SerializeWeightFile(
      "w", RandomQuantizedWeight({WeightFormat::kFp4, 32, 8, 32}, 5));
  std::string bad = bytes;
  bad[0] = 'X';
  EXPECT_THAT(ParseWeightFile(bad).status().message(),
              HasSubstr("not a nibble weight file"));
  bad = bytes;
  bad[8] = 3;
  FixChecksum(&bad);
  EXPECT_THAT(ParseWeightFile(bad).status().message(), HasSubstr("version 3"));
  bad = bytes;
  bad[12] = 9;
  FixChecksum(&bad);
  EXPECT_THAT(ParseWeightFile(bad).status().message(),
              HasSubstr("unknown weight format code 9"));
}

TEST(WeightFileTest, RejectsHeadersThatLieAboutSizes) {
  const std::string bytes = SerializeWeightFile(
      "w", RandomQuantizedWeight({WeightFormat::kU4, 32, 8, 32}, 6));
  SCOPED_TRACE("seed=6");
  struct Lie {
    int offset;
    uint64_t value;
    const char* message;
  };
  // Each would ask for terabytes, or for more bytes than the file has, if
  // it were believed.
  const Lie lies[] = {
      {16, uint64_t{1} << 20, "qweight"},       // k at the largest allowed
      {24, uint64_t{1} << 20, "qweight"},       // n
      {24, ~uint64_t{0}, "must be positive"},   // n = -1
      {32, 48, "group size 48"},                // unsupported group
      {40, uint64_t{1} << 62, "qweight"},       // qweight bytes
      {48, 0, "scales"},                        // scales bytes
      {56, 1, "zeros"},                         // zeros bytes
      {64, 0xffffffffu, "name of 4294967295"},  // name length
  };
  for (const Lie& lie : lies) {
    SCOPED_TRACE(absl::StrCat("offset ", lie.offset, " = ", lie.value));
    std::string bad = bytes;
    if (lie.offset == 64) {
      const uint32_t value = static_cast<uint32_t>(lie.value);
      std::memcpy(bad.data() + lie.offset, &value, sizeof(value));
    } else {
      PutU64At(&bad, lie.offset, lie.value);
    }
    FixChecksum(&bad);
    absl::StatusOr<WeightFile> file = ParseWeightFile(bad);
    ASSERT_FALSE(file.ok());
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(file.status().message(), HasSubstr(lie.message));
  }

  // A header that agrees with itself about 0.6 TB of tensors.
  std::string huge = bytes;
  const WeightSpec huge_spec{WeightFormat::kU4, kMaxDimension, kMaxDimension,
                             32};
  PutU64At(&huge, 16, huge_spec.k);
  PutU64At(&huge, 24, huge_spec.n);
  PutU64At(&huge, 40, huge_spec.qweight_bytes());
  PutU64At(&huge, 48, huge_spec.scales_bytes());
  PutU64At(&huge, 56, huge_spec.zeros_bytes());
  FixChecksum(&huge);
  EXPECT_THAT(ParseWeightFile(huge).status().message(),
              HasSubstr(absl::StrCat("its header says ",
                                     kWeightFileHeaderBytes + 1 +
                                         huge_spec.canonical_bytes() +
                                         kWeightFileChecksumBytes)));
}

TEST(WeightFileTest, RejectsInvalidNameAndZeroPoint) {
  QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4, 32, 8, 32}, 8);
  SCOPED_TRACE("seed=8");
  EXPECT_THAT(
      ParseWeightFile(SerializeWeightFile("a/b", weight)).status().message(),
      HasSubstr("invalid name"));
  weight.zeros[3] = 16;
  EXPECT_THAT(
      ParseWeightFile(SerializeWeightFile("w", weight)).status().message(),
      HasSubstr("invalid weight data"));
}

}  // namespace
}  // namespace nibble::server
