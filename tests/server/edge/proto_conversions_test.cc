#include "server/edge/proto_conversions.h"

#include <cstdint>
#include <iterator>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/packed_weight.h"

namespace nibble::server {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ToGrpcStatusTest, KeepsTheCodeAndAShortMessage) {
  const grpc::Status status =
      ToGrpcStatus(absl::NotFoundError("no weight named \"w\""));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "no weight named \"w\"");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(ToGrpcStatusTest, CutsALongMessageSayingHowMuch) {
  const std::string name(100'000, 'x');
  const std::string message = absl::StrCat("no weight named \"", name, "\"");
  const grpc::Status status = ToGrpcStatus(absl::NotFoundError(message));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(),
              StartsWith(message.substr(0, kMaxStatusMessageBytes)));
  EXPECT_THAT(
      status.error_message(),
      EndsWith(absl::StrCat("... (", message.size() - kMaxStatusMessageBytes,
                            " more bytes cut)")));
  EXPECT_LT(status.error_message().size(), kMaxStatusMessageBytes + 40);
}

// The proto's enum is the one place outside the format table that names
// the formats: each wire value must carry the name WEIGHT_FORMAT_<NAME>, and
// the proto must have no format the table lacks.
TEST(WeightFormatProtoTest, ProtoEnumMatchesTheFormatTable) {
  for (const WeightFormatTraits& row : kWeightFormatTable) {
    SCOPED_TRACE(row.name);
    ASSERT_TRUE(v1::WeightFormat_IsValid(row.wire_value));
    EXPECT_EQ(
        v1::WeightFormat_Name(static_cast<v1::WeightFormat>(row.wire_value)),
        absl::StrCat("WEIGHT_FORMAT_", absl::AsciiStrToUpper(row.name)));
  }
  EXPECT_EQ(v1::WeightFormat_descriptor()->value_count(),
            static_cast<int>(kWeightFormatCount) + 1)  // and UNSPECIFIED
      << "nibble.proto has a format that kWeightFormatTable lacks";
}

TEST(WeightFormatProtoTest, EveryFormatRoundTrips) {
  for (WeightFormat format : kAllWeightFormats) {
    const absl::StatusOr<WeightFormat> back =
        client::FromProto(client::ToProto(format));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, format);
  }
  EXPECT_THAT(
      client::FromProto(v1::WEIGHT_FORMAT_UNSPECIFIED).status().message(),
      HasSubstr("WEIGHT_FORMAT_MXFP4 or WEIGHT_FORMAT_NVFP4"));
}

// Both sides translate by the dtype table, each with its own functions.
TEST(DTypeProtoTest, EveryDTypeRoundTripsBothWays) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const absl::StatusOr<DType> at_server = FromProto(client::ToProto(dtype));
    ASSERT_TRUE(at_server.ok()) << at_server.status();
    EXPECT_EQ(*at_server, dtype);
    const absl::StatusOr<DType> at_client = client::FromProto(ToProto(dtype));
    ASSERT_TRUE(at_client.ok()) << at_client.status();
    EXPECT_EQ(*at_client, dtype);
  }
  EXPECT_EQ(FromProto(v1::DTYPE_UNSPECIFIED).status().message(),
            "dtype DTYPE_UNSPECIFIED is not supported: use DTYPE_F32, "
            "DTYPE_F16 or DTYPE_BF16");
  EXPECT_THAT(client::FromProto(static_cast<v1::DType>(9)).status().message(),
              HasSubstr("dtype 9 is not supported"));
}

TEST(CodeLayoutProtoTest, EveryLayoutRoundTripsAndUnsetIsCanonical) {
  for (CodeLayout layout : {CodeLayout::kCanonical, CodeLayout::kColumns}) {
    const absl::StatusOr<CodeLayout> back = FromProto(client::ToProto(layout));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, layout);
  }
  EXPECT_EQ(*FromProto(v1::WeightHeader().code_layout()),
            CodeLayout::kCanonical);
  EXPECT_THAT(
      FromProto(static_cast<v1::CodeLayout>(9)).status().message(),
      HasSubstr("code layout 9 is not supported: use "
                "CODE_LAYOUT_CANONICAL (unset) or CODE_LAYOUT_COLUMNS"));
}

// Each precision's wire value carries the name ACTIVATION_PRECISION_<NAME>,
// and the proto has no precision the enum lacks.
TEST(ActivationPrecisionProtoTest, ProtoEnumMatchesThePrecisions) {
  for (ActivationPrecision precision : kAllActivationPrecisions) {
    EXPECT_EQ(v1::ActivationPrecision_Name(ToProto(precision)),
              absl::StrCat(
                  "ACTIVATION_PRECISION_",
                  absl::AsciiStrToUpper(ActivationPrecisionName(precision))));
  }
  EXPECT_EQ(v1::ActivationPrecision_descriptor()->value_count(),
            static_cast<int>(std::size(kAllActivationPrecisions)) + 1);
}

TEST(ActivationPrecisionProtoTest, EveryPrecisionRoundTripsAndUnsetIsNone) {
  for (ActivationPrecision precision : kAllActivationPrecisions) {
    const absl::StatusOr<std::optional<ActivationPrecision>> back =
        FromProto(client::ToProto(precision));
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(*back, precision);
  }
  const absl::StatusOr<std::optional<ActivationPrecision>> unset =
      FromProto(v1::MatmulRequest().activation_precision());
  ASSERT_TRUE(unset.ok()) << unset.status();
  EXPECT_EQ(*unset, std::nullopt);
  const absl::StatusOr<std::optional<ActivationPrecision>> bad =
      FromProto(static_cast<v1::ActivationPrecision>(9));
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(),
              HasSubstr("activation_precision 9 is not supported: use "
                        "ACTIVATION_PRECISION_EXACT, ACTIVATION_PRECISION_BF16 "
                        "or ACTIVATION_PRECISION_INT8"));
}

// What a reply says of A reads back in the client, which takes the bound of
// its C from it (as sent where the reply does not say).
TEST(ActivationPrecisionProtoTest, RepliesReadBackInTheClient) {
  for (ActivationPrecision precision : kAllActivationPrecisions) {
    EXPECT_EQ(client::FromProto(ToProto(precision)), precision);
  }
  EXPECT_EQ(client::FromProto(v1::ACTIVATION_PRECISION_UNSPECIFIED),
            std::nullopt);
  v1::MatmulResponse response;
  response.set_dtype(ToProto(DType::kF32));
  EXPECT_EQ(client::ErrorBoundOf(response), 1e-4);
  response.set_activation_precision(ToProto(ActivationPrecision::kExact));
  EXPECT_EQ(client::ErrorBoundOf(response), 1e-4);
  response.set_activation_precision(ToProto(ActivationPrecision::kBf16));
  EXPECT_EQ(client::ErrorBoundOf(response), 1e-2);
  response.set_activation_precision(ToProto(ActivationPrecision::kInt8));
  EXPECT_EQ(client::ErrorBoundOf(response), 5e-2);
  response.set_activation_precision(ToProto(ActivationPrecision::kExact));
  response.set_dtype(ToProto(DType::kF16));
  EXPECT_EQ(client::ErrorBoundOf(response), 1e-2);
}

TEST(WeightFormatProtoTest, AnUnsetGlobalScaleIsOne) {
  v1::WeightHeader header;
  header.set_format(v1::WEIGHT_FORMAT_NVFP4);
  header.set_k(64);
  header.set_n(8);
  header.set_group_size(16);
  EXPECT_EQ(FromProto(header)->global_scale, 1.0f);
  header.set_global_scale(0.25f);
  EXPECT_EQ(FromProto(header)->global_scale, 0.25f);
  header.set_format(v1::WEIGHT_FORMAT_FP4);
  header.set_group_size(32);
  EXPECT_THAT(FromProto(header)->Validate().message(),
              HasSubstr("only for nvfp4"));
}

TEST(WeightFormatProtoTest, InfoCarriesTheGlobalScaleBack) {
  const WeightSpec spec{WeightFormat::kNvfp4, 64, 8, 16, 0.375f};
  absl::StatusOr<PackedWeight> packed =
      PackedWeight::Pack(RandomQuantizedWeight(spec, /*seed=*/4));
  ASSERT_TRUE(packed.ok()) << packed.status();
  v1::WeightInfo info;
  FillWeightInfo(ResidentWeight{"w", *std::move(packed), nullptr}, &info);
  EXPECT_EQ(info.format(), v1::WEIGHT_FORMAT_NVFP4);
  EXPECT_EQ(info.global_scale(), 0.375f);
  const absl::StatusOr<WeightSpec> back = client::WeightSpecFromInfo(info);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, spec);
}

TEST(WeightHeaderProtoTest, ActivationOrderRoundTripsAndInfoReportsIt) {
  constexpr uint64_t kSeed = 17;
  SCOPED_TRACE(absl::StrCat("seed=", kSeed));
  const WeightSpec spec{WeightFormat::kU4b8, 128, 8, 32};
  QuantizedWeight weight = RandomQuantizedWeight(spec, kSeed);
  weight.activation_order = RandomActivationOrder(spec.k, kSeed);

  // Through the wire bytes, as an upload sends it.
  v1::UploadWeightRequest sent;
  client::FillWeightHeader("w", spec, weight.activation_order,
                           sent.mutable_header());
  v1::UploadWeightRequest received;
  ASSERT_TRUE(received.ParseFromString(sent.SerializeAsString()));
  EXPECT_EQ(FromProto(received.header()).value(), spec);
  const absl::StatusOr<std::vector<int32_t>> order =
      ActivationOrderFromProto(received.header());
  ASSERT_TRUE(order.ok()) << order.status();
  EXPECT_EQ(*order, weight.activation_order);

  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight);
  ASSERT_TRUE(packed.ok()) << packed.status();
  v1::WeightInfo info;
  FillWeightInfo(ResidentWeight{"w", *std::move(packed), nullptr}, &info);
  EXPECT_TRUE(info.activation_order());

  // Unset means none.
  v1::WeightHeader plain;
  client::FillWeightHeader("w", spec, {}, &plain);
  EXPECT_EQ(plain.activation_order_size(), 0);
  EXPECT_TRUE(ActivationOrderFromProto(plain)->empty());
  weight.activation_order.clear();
  FillWeightInfo(ResidentWeight{"w", *PackedWeight::Pack(weight), nullptr},
                 &info);
  EXPECT_FALSE(info.activation_order());
}

TEST(WeightHeaderProtoTest, AnOrderEntryPastInt32IsInvalid) {
  v1::WeightHeader header;
  header.set_k(8);
  for (uint32_t column : {0u, 1u, 0x80000000u}) {
    header.add_activation_order(column);
  }
  const absl::Status status = ActivationOrderFromProto(header).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("activation_order[2] = 2147483648 is outside 0..K-1"));
}

TEST(ListPageFromProtoTest, DefaultsClampsAndContinuesAfterTheToken) {
  v1::ListWeightsRequest request;
  absl::StatusOr<ListPageRequest> page = ListPageFromProto(request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->size, kDefaultListPageSize);
  EXPECT_EQ(page->after, "");

  request.set_page_size(7);
  request.set_page_token("layer.3.q_proj");
  page = ListPageFromProto(request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->size, 7);
  EXPECT_EQ(page->after, "layer.3.q_proj");

  request.set_page_size(1 << 30);
  EXPECT_EQ(ListPageFromProto(request)->size, kMaxListPageSize);
}

TEST(ListPageFromProtoTest, NegativeSizeOrForeignTokenIsInvalid) {
  v1::ListWeightsRequest request;
  request.set_page_size(-1);
  EXPECT_EQ(ListPageFromProto(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ListPageFromProto(request).status().message(),
              HasSubstr("page_size is -1"));
  request.set_page_size(0);
  for (const char* token : {"../x", "a b", ".hidden"}) {
    request.set_page_token(token);
    EXPECT_THAT(ListPageFromProto(request).status().message(),
                HasSubstr("page_token is not one that ListWeights returned"))
        << token;
  }
}

}  // namespace
}  // namespace nibble::server
