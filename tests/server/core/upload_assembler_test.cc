// Tests the upload state machine: complete uploads in any chunking, and every
// way an upload can go wrong.
#include "server/core/upload_assembler.h"

#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/fp4_columns.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/packed_weight.h"
#include "tests/format/column_layout.h"
#include "tests/kernels/same_panels.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

template <typename T>
std::string Bytes(const std::vector<T>& array) {
  return std::string(reinterpret_cast<const char*>(array.data()),
                     array.size() * sizeof(T));
}

// Sends `bytes` as chunks of random sizes in 1..max_chunk.
absl::Status SendInChunks(UploadAssembler& upload, WeightTensorKind tensor,
                          const std::string& bytes, std::mt19937_64& rng,
                          size_t max_chunk) {
  size_t offset = 0;
  while (offset < bytes.size()) {
    const size_t size = std::min(bytes.size() - offset, 1 + rng() % max_chunk);
    if (absl::Status s = upload.OnChunk(
            tensor, offset, absl::string_view(bytes).substr(offset, size));
        !s.ok()) {
      return s;
    }
    offset += size;
  }
  return absl::OkStatus();
}

// Sends every tensor of `weight` in chunks of random sizes: qweight's up to
// `max_qweight_chunk` bytes, the scales' and zero points' a few bytes.
absl::Status SendWeightInChunks(UploadAssembler& upload,
                                const QuantizedWeight& weight,
                                std::mt19937_64& rng,
                                size_t max_qweight_chunk) {
  if (absl::Status s =
          SendInChunks(upload, WeightTensorKind::kQweight,
                       Bytes(weight.qweight), rng, max_qweight_chunk);
      !s.ok()) {
    return s;
  }
  if (absl::Status s = SendInChunks(upload, WeightTensorKind::kScales,
                                    Bytes(weight.scales), rng, 13);
      !s.ok() || !HasZeros(weight.spec.format)) {
    return s;
  }
  return SendInChunks(upload, WeightTensorKind::kZeros, Bytes(weight.zeros),
                      rng, 5);
}

// Checks that `upload`, complete, hands over the panels that Pack makes of
// `sent`, with its activation order.
// The tensors WriteCanonicalTensors writes, and the sizes of its pieces.
struct Written {
  std::string bytes;
  std::vector<size_t> pieces;
};
absl::StatusOr<Written> WriteCanonicalTensors(const UploadAssembler& upload,
                                              const PackedWeight& packed) {
  Written written;
  if (absl::Status status = upload.WriteCanonicalTensors(
          packed,
          [&written](absl::string_view piece) {
            written.bytes.append(piece.data(), piece.size());
            written.pieces.push_back(piece.size());
            return absl::OkStatus();
          });
      !status.ok()) {
    return status;
  }
  return written;
}

std::string FileTensors(const QuantizedWeight& weight) {
  return Bytes(weight.qweight) + Bytes(weight.scales) + Bytes(weight.zeros);
}

// FinishPacked gives what PackedWeight::Pack makes of `sent`, and
// WriteCanonicalTensors its tensors as `sent` holds them.
void ExpectPacksAsPackDoes(UploadAssembler& upload,
                           const QuantizedWeight& sent) {
  absl::StatusOr<PackedWeight> want = PackedWeight::Pack(sent);
  ASSERT_TRUE(want.ok()) << want.status();
  EXPECT_EQ(WriteCanonicalTensors(upload, *want).status().code(),
            absl::StatusCode::kInternal)
      << "before FinishPacked";
  absl::StatusOr<PackedWeight> received = upload.FinishPacked();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_TRUE(nibble::testing::SamePanels(*received, *want));
  EXPECT_EQ(received->activation_order(), want->activation_order());
  absl::StatusOr<Written> written = WriteCanonicalTensors(upload, *received);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_TRUE(written->bytes == FileTensors(sent));
}

class UploadAssemblerRoundTripTest
    : public ::testing::TestWithParam<WeightFormat> {};

TEST_P(UploadAssemblerRoundTripTest, ReassemblesTheWeightFromOddChunks) {
  const uint64_t seed = 7;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const WeightSpec spec{GetParam(), 256, 40, 64};
  const QuantizedWeight sent = RandomQuantizedWeight(spec, seed);
  std::mt19937_64 rng(seed);
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec).ok());
  ASSERT_TRUE(SendWeightInChunks(upload, sent, rng, 97).ok());
  absl::StatusOr<QuantizedWeight> received = upload.Finish();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->spec, spec);
  EXPECT_EQ(received->qweight, sent.qweight);
  EXPECT_EQ(received->scales, sent.scales);
  EXPECT_EQ(received->zeros, sent.zeros);
  // No slack from growing with the chunks: the upload's budget reservation
  // counts exactly these bytes.
  EXPECT_EQ(received->qweight.capacity(), received->qweight.size());
  EXPECT_EQ(received->scales.capacity(), received->scales.size());
  EXPECT_EQ(received->zeros.capacity(), received->zeros.size());
}

TEST_P(UploadAssemblerRoundTripTest, PacksTheCodesAsTheyArrive) {
  const uint64_t seed = 11;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  const WeightSpec spec{GetParam(), 256, 40, 64};
  QuantizedWeight sent = RandomQuantizedWeight(spec, seed);
  sent.activation_order = RandomActivationOrder(spec.k, seed);
  std::mt19937_64 rng(seed);
  UploadAssembler upload(CodePacking::kAll);
  ASSERT_TRUE(upload.OnHeader("w", spec, sent.activation_order).ok());
  EXPECT_TRUE(upload.packs_codes());
  // Chunks up to three rows of qweight, ending inside words and rows.
  ASSERT_TRUE(SendWeightInChunks(upload, sent, rng, 3 * 4 * spec.n).ok());
  EXPECT_EQ(upload.Finish().status().code(), absl::StatusCode::kInternal);
  ExpectPacksAsPackDoes(upload, sent);
}

TEST(UploadAssemblerTest, TakesTensorBytesInFileOrderAcrossTensors) {
  constexpr uint64_t kSeed = 29;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  const WeightSpec spec{WeightFormat::kU4, 128, 24, 32};
  const QuantizedWeight sent = RandomQuantizedWeight(spec, kSeed);
  const std::string bytes =
      Bytes(sent.qweight) + Bytes(sent.scales) + Bytes(sent.zeros);
  UploadAssembler upload(CodePacking::kAll);
  EXPECT_EQ(upload.OnTensorBytes("x").code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(upload.OnHeader("w", spec).ok());
  // Pieces of 1..301 bytes, most of them spanning a tensor's end somewhere.
  std::mt19937_64 rng(kSeed);
  for (size_t offset = 0; offset < bytes.size();) {
    const size_t size =
        std::min<size_t>(bytes.size() - offset, 1 + rng() % 301);
    ASSERT_TRUE(
        upload.OnTensorBytes(absl::string_view(bytes).substr(offset, size))
            .ok());
    offset += size;
  }
  const absl::Status past = upload.OnTensorBytes("x");
  EXPECT_EQ(past.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(past.message(), HasSubstr("past the end"));
  ExpectPacksAsPackDoes(upload, sent);
}

TEST(UploadAssemblerTest, KeepsTheHeadersActivationOrder) {
  constexpr uint64_t kSeed = 23;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  const WeightSpec spec{WeightFormat::kU4, 128, 16, 32};
  QuantizedWeight sent = RandomQuantizedWeight(spec, kSeed);
  sent.activation_order = RandomActivationOrder(spec.k, kSeed);
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec, sent.activation_order).ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kQweight, 0, Bytes(sent.qweight)).ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kScales, 0, Bytes(sent.scales)).ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kZeros, 0, Bytes(sent.zeros)).ok());
  absl::StatusOr<QuantizedWeight> received = upload.Finish();
  ASSERT_TRUE(received.ok()) << received.status();
  EXPECT_EQ(received->activation_order, sent.activation_order);
  EXPECT_EQ(received->qweight, sent.qweight);
}

TEST(UploadAssemblerTest, RefusesABadActivationOrderAtTheHeader) {
  const WeightSpec spec{WeightFormat::kU4b8, 64, 8, 32};
  std::vector<int32_t> order = RandomActivationOrder(spec.k, 29);
  order[10] = order[20];
  UploadAssembler upload;
  const absl::Status status = upload.OnHeader("w", spec, order);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              HasSubstr(absl::StrCat("activation_order[20] = ", order[20],
                                     " appears twice (also at 10)")));
  EXPECT_FALSE(upload.has_header());
  order.pop_back();
  EXPECT_THAT(std::string(upload.OnHeader("w", spec, order).message()),
              HasSubstr("activation_order has 63 entries for K=64"));
}

INSTANTIATE_TEST_SUITE_P(AllFormats, UploadAssemblerRoundTripTest,
                         ::testing::Values(WeightFormat::kFp4,
                                           WeightFormat::kU4b8,
                                           WeightFormat::kU4),
                         [](const auto& info) {
                           return std::string(WeightFormatName(info.param));
                         });

// How an assembler hands a weight in the column layout over.
enum class ColumnsFinish { kCanonical, kPacked, kAsTheyArrived };

const char* ColumnsFinishName(ColumnsFinish finish) {
  switch (finish) {
    case ColumnsFinish::kCanonical:
      return "canonical";
    case ColumnsFinish::kPacked:
      return "packing";
    case ColumnsFinish::kAsTheyArrived:
      return "as_they_arrived";
  }
  return "unknown";
}

// MXFP4 and NVFP4 weights in the column layout of their checkpoints, into an
// assembler that keeps the canonical weight, one that packs the codes, or
// one that hands the columns over as they are.
class UploadAssemblerColumnsTest
    : public ::testing::TestWithParam<std::tuple<WeightFormat, ColumnsFinish>> {
};

TEST_P(UploadAssemblerColumnsTest, TakesTheCheckpointsColumns) {
  const auto [format, finish] = GetParam();
  const bool pack_codes = finish == ColumnsFinish::kPacked;
  const uint64_t seed = 31;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  // N = 37: the last panel is short.
  const WeightSpec spec = format == WeightFormat::kMxfp4
                              ? WeightSpec{format, 256, 37, 32}
                              : WeightSpec{format, 240, 37, 16, 0.5f};
  QuantizedWeight sent = RandomQuantizedWeight(spec, seed);
  sent.activation_order = RandomActivationOrder(spec.k, seed);
  const nibble::testing::ColumnLayout columns =
      nibble::testing::ToColumns(sent);
  std::mt19937_64 rng(seed);
  UploadAssembler upload(pack_codes ? CodePacking::kAll : CodePacking::kNone);
  ASSERT_TRUE(
      upload.OnHeader("w", spec, sent.activation_order, CodeLayout::kColumns)
          .ok());
  EXPECT_EQ(upload.packs_codes(), pack_codes);
  // Chunks up to three panels of columns, ending inside columns and panels.
  ASSERT_TRUE(SendInChunks(upload, WeightTensorKind::kQweight,
                           Bytes(columns.codes), rng,
                           3 * PackedWeight::kPanelWidth * spec.k / 2)
                  .ok());
  ASSERT_TRUE(SendInChunks(upload, WeightTensorKind::kScales,
                           Bytes(columns.scale_codes), rng, 13)
                  .ok());
  if (pack_codes) {
    ExpectPacksAsPackDoes(upload, sent);
  } else if (finish == ColumnsFinish::kAsTheyArrived) {
    absl::StatusOr<Fp4Columns> received = upload.FinishColumns();
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->spec, spec);
    EXPECT_EQ(std::vector<uint8_t>(received->codes,
                                   received->codes + received->code_bytes()),
              columns.codes);
    EXPECT_EQ(std::vector<uint8_t>(
                  received->scale_codes,
                  received->scale_codes + received->scale_code_bytes()),
              columns.scale_codes);
    EXPECT_EQ(upload.activation_order(), sent.activation_order);
  } else {
    absl::StatusOr<QuantizedWeight> received = upload.Finish();
    ASSERT_TRUE(received.ok()) << received.status();
    EXPECT_EQ(received->spec, spec);
    EXPECT_EQ(received->qweight, sent.qweight);
    EXPECT_EQ(received->scales, sent.scales);
    EXPECT_EQ(received->activation_order, sent.activation_order);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fp4Formats, UploadAssemblerColumnsTest,
    ::testing::Combine(
        ::testing::Values(WeightFormat::kMxfp4, WeightFormat::kNvfp4),
        ::testing::Values(ColumnsFinish::kCanonical, ColumnsFinish::kPacked,
                          ColumnsFinish::kAsTheyArrived)),
    [](const auto& info) {
      return absl::StrCat(WeightFormatName(std::get<0>(info.param)), "_",
                          ColumnsFinishName(std::get<1>(info.param)));
    });

TEST(UploadAssemblerTest, WritesALargeColumnUploadsFileInPieces) {
  constexpr uint64_t kSeed = 37;
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  // 1.5 MiB of codes: two pieces, the last one short; N = 1560 ends in a
  // short panel.
  const WeightSpec spec{WeightFormat::kMxfp4, 2048, 1560, 32};
  const QuantizedWeight sent = RandomQuantizedWeight(spec, kSeed);
  const nibble::testing::ColumnLayout columns =
      nibble::testing::ToColumns(sent);
  UploadAssembler upload(CodePacking::kAll);
  ASSERT_TRUE(upload.OnHeader("w", spec, {}, CodeLayout::kColumns).ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kQweight, 0, Bytes(columns.codes)).ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kScales, 0, Bytes(columns.scale_codes))
          .ok());
  absl::StatusOr<PackedWeight> packed = upload.FinishPacked();
  ASSERT_TRUE(packed.ok()) << packed.status();
  absl::StatusOr<Written> written = WriteCanonicalTensors(upload, *packed);
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_TRUE(written->bytes == FileTensors(sent));
  // Two pieces of codes, then the scales and the (empty) zero points.
  ASSERT_EQ(written->pieces.size(), 4u);
  for (size_t piece : written->pieces) EXPECT_LE(piece, size_t{1} << 20);
  // The sink's first error ends the writing.
  int calls = 0;
  const absl::Status failed =
      upload.WriteCanonicalTensors(*packed, [&calls](absl::string_view) {
        ++calls;
        return absl::ResourceExhaustedError("disk full");
      });
  EXPECT_EQ(failed.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(calls, 1);
}

class UploadAssemblerErrorTest : public ::testing::Test {
 protected:
  const WeightSpec spec_{WeightFormat::kU4, 64, 8, 32};
  const QuantizedWeight weight_ = RandomQuantizedWeight(spec_, 3);
};

TEST_F(UploadAssemblerErrorTest, ChunkBeforeHeader) {
  UploadAssembler upload;
  absl::Status status =
      upload.OnChunk(WeightTensorKind::kQweight, 0, Bytes(weight_.qweight));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("before the header"));
}

TEST_F(UploadAssemblerErrorTest, SecondHeader) {
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec_).ok());
  absl::Status status = upload.OnHeader("w", spec_);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("second header"));
}

TEST_F(UploadAssemblerErrorTest, BadNameAndBadSpec) {
  UploadAssembler upload;
  EXPECT_THAT(upload.OnHeader("a/../etc/passwd", spec_).message(),
              HasSubstr("may only contain"));
  EXPECT_THAT(
      upload.OnHeader("w", WeightSpec{WeightFormat::kU4, 100, 8, 32}).message(),
      HasSubstr("multiple of 8"));
  EXPECT_THAT(
      upload.OnHeader("w", WeightSpec{WeightFormat::kU4, 96, 8, 64}).message(),
      HasSubstr("multiple of the group size"));
  EXPECT_FALSE(upload.has_header());
}

TEST_F(UploadAssemblerErrorTest, WrongTensorOrder) {
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec_).ok());
  absl::Status status =
      upload.OnChunk(WeightTensorKind::kScales, 0, Bytes(weight_.scales));
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("before finishing qweight"));
}

TEST_F(UploadAssemblerErrorTest, GapOrRepeatedOffset) {
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec_).ok());
  const std::string bytes = Bytes(weight_.qweight);
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kQweight, 0, bytes.substr(0, 10)).ok());
  EXPECT_THAT(upload.OnChunk(WeightTensorKind::kQweight, 0, bytes.substr(0, 10))
                  .message(),
              HasSubstr("offset 0 but 10 bytes have arrived"));
  EXPECT_THAT(
      upload.OnChunk(WeightTensorKind::kQweight, 20, bytes.substr(20, 10))
          .message(),
      HasSubstr("offset 20"));
}

TEST_F(UploadAssemblerErrorTest, TooManyBytes) {
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec_).ok());
  absl::Status status = upload.OnChunk(WeightTensorKind::kQweight, 0,
                                       Bytes(weight_.qweight) + "x");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("needs 256"));
}

TEST_F(UploadAssemblerErrorTest, ZerosForFormatWithoutZeros) {
  UploadAssembler upload;
  const WeightSpec spec{WeightFormat::kU4b8, 64, 8, 32};
  ASSERT_TRUE(upload.OnHeader("w", spec).ok());
  EXPECT_THAT(upload.OnChunk(WeightTensorKind::kZeros, 0, "abc").message(),
              HasSubstr("format u4b8 has none"));
}

TEST_F(UploadAssemblerErrorTest, EndsEarly) {
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec_).ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kQweight, 0, Bytes(weight_.qweight))
          .ok());
  absl::StatusOr<QuantizedWeight> weight = upload.Finish();
  EXPECT_EQ(weight.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(weight.status().message(),
              HasSubstr("ended early: 0 of 32 bytes of scales"));
}

TEST_F(UploadAssemblerErrorTest, ColumnsEndingEarlyOrInTheCanonicalLayout) {
  const WeightSpec spec{WeightFormat::kMxfp4, 64, 8, 32};
  UploadAssembler columns;
  ASSERT_TRUE(columns.OnHeader("w", spec, {}, CodeLayout::kColumns).ok());
  ASSERT_TRUE(columns
                  .OnChunk(WeightTensorKind::kQweight, 0,
                           std::string(spec.k / 2 * spec.n, '\x35'))
                  .ok());
  const absl::Status early = columns.FinishColumns().status();
  EXPECT_EQ(early.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(early.message(), HasSubstr("ended early: 0 of 16 bytes of "));

  UploadAssembler canonical;
  ASSERT_TRUE(canonical.OnHeader("w", spec_).ok());
  EXPECT_EQ(canonical.FinishColumns().status().code(),
            absl::StatusCode::kInternal);
}

TEST_F(UploadAssemblerErrorTest, NoHeaderAtAll) {
  UploadAssembler upload;
  EXPECT_THAT(upload.Finish().status().message(),
              HasSubstr("without a header"));
}

TEST_F(UploadAssemblerErrorTest, ZeroPointOutOfRange) {
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec_).ok());
  std::string zeros = Bytes(weight_.zeros);
  zeros[3] = 16;
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kQweight, 0, Bytes(weight_.qweight))
          .ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kScales, 0, Bytes(weight_.scales)).ok());
  ASSERT_TRUE(upload.OnChunk(WeightTensorKind::kZeros, 0, zeros).ok());
  EXPECT_THAT(upload.Finish().status().message(),
              HasSubstr("zero point 16 at index 3"));
}

TEST_F(UploadAssemblerErrorTest, ColumnsOnlyForMxfp4AndNvfp4) {
  UploadAssembler upload;
  const absl::Status status =
      upload.OnHeader("w", spec_, {}, CodeLayout::kColumns);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message(),
            "code_layout COLUMNS is for mxfp4 and nvfp4 weights, not u4: send "
            "its qweight and scales in the canonical layout");
  EXPECT_FALSE(upload.has_header());
}

TEST_F(UploadAssemblerErrorTest, ColumnScalesAreOneByteEach) {
  const WeightSpec spec{WeightFormat::kNvfp4, 64, 8, 16, 0.5f};
  const QuantizedWeight weight = RandomQuantizedWeight(spec, 5);
  UploadAssembler upload;
  ASSERT_TRUE(upload.OnHeader("w", spec, {}, CodeLayout::kColumns).ok());
  ASSERT_TRUE(
      upload.OnChunk(WeightTensorKind::kQweight, 0, Bytes(weight.qweight))
          .ok());
  // The canonical scales: two bytes a scale.
  EXPECT_THAT(
      upload.OnChunk(WeightTensorKind::kScales, 0, Bytes(weight.scales))
          .message(),
      HasSubstr("upload sent 64 bytes of scales but nvfp4 k=64 n=8 group=16 "
                "global_scale=0.5 needs 32"));
}

}  // namespace
}  // namespace nibble::server
