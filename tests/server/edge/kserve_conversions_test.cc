// Tests the KServe v2 ↔ nibble.v1 translation on its own: the datatype and
// version rules, the model metadata, every way a ModelInferRequest can be
// wrong, and where A and C end up.
#include "server/edge/kserve_conversions.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/edge/proto_conversions.h"

namespace nibble::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr uint64_t kSeed = 20240611;

const WeightSpec kSpec{WeightFormat::kU4b8, 64, 24, 32};

std::vector<float> RandomFloats(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = uniform(rng);
  return values;
}

std::string RandomBytes(size_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::string bytes(count, '\0');
  for (char& byte : bytes) byte = static_cast<char>(rng());
  return bytes;
}

// A well-formed request for model "proj" with input "a" [m, k] of `datatype`
// and no data yet.
inference::ModelInferRequest Request(const std::string& datatype, int64_t m,
                                     int64_t k) {
  inference::ModelInferRequest request;
  request.set_model_name("proj");
  request.set_id("req-7");
  auto* input = request.add_inputs();
  input->set_name("a");
  input->set_datatype(datatype);
  input->add_shape(m);
  input->add_shape(k);
  return request;
}

void ExpectInvalid(const inference::ModelInferRequest& request,
                   const std::string& message) {
  absl::StatusOr<v1::MatmulRequest> matmul =
      MatmulRequestFromKServe(request, kSpec);
  EXPECT_EQ(matmul.status().code(), absl::StatusCode::kInvalidArgument)
      << matmul.status();
  EXPECT_THAT(matmul.status().message(), HasSubstr(message));
}

TEST(KServeDatatypeTest, RoundTripsEveryDType) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    absl::StatusOr<DType> parsed =
        DTypeFromKServeDatatype(KServeDatatype(dtype));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, dtype);
  }
  EXPECT_EQ(KServeDatatype(DType::kBF16), "BF16");
}

TEST(KServeDatatypeTest, OtherDatatypesListTheAcceptedOnes) {
  for (const char* datatype : {"FP64", "fp32", "INT8", ""}) {
    absl::StatusOr<DType> parsed = DTypeFromKServeDatatype(datatype);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument)
        << datatype;
    EXPECT_THAT(parsed.status().message(), HasSubstr("use FP32, FP16 or BF16"));
  }
}

TEST(KServeModelVersionTest, EmptyAndOneAreTheOnlyVersions) {
  EXPECT_TRUE(CheckKServeModelVersion("proj", "").ok());
  EXPECT_TRUE(CheckKServeModelVersion("proj", "1").ok());
  const absl::Status status = CheckKServeModelVersion("proj", "2");
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(),
              HasSubstr("model \"proj\" has no version \"2\""));
}

TEST(KServeModelMetadataTest, ReportsTheWeightsShapes) {
  inference::ModelMetadataResponse response;
  FillKServeModelMetadata("proj", kSpec, &response);
  EXPECT_EQ(response.name(), "proj");
  EXPECT_THAT(response.versions(), ElementsAre("1"));
  EXPECT_EQ(response.platform(), "nibble");
  ASSERT_EQ(response.inputs_size(), 1);
  EXPECT_EQ(response.inputs(0).name(), "a");
  EXPECT_EQ(response.inputs(0).datatype(), "FP32");
  EXPECT_THAT(response.inputs(0).shape(), ElementsAre(-1, kSpec.k));
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "c");
  EXPECT_EQ(response.outputs(0).datatype(), "FP32");
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(-1, kSpec.n));
}

TEST(MatmulRequestFromKServeTest, RawInputIsPassedThrough) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    const uint64_t seed = kSeed + static_cast<int>(dtype);
    SCOPED_TRACE(::testing::Message()
                 << KServeDatatype(dtype) << " seed " << seed);
    const int64_t m = 3;
    inference::ModelInferRequest request =
        Request(std::string(KServeDatatype(dtype)), m, kSpec.k);
    const std::string a = RandomBytes(m * kSpec.k * DTypeSize(dtype), seed);
    request.add_raw_input_contents(a);
    absl::StatusOr<v1::MatmulRequest> matmul =
        MatmulRequestFromKServe(request, kSpec);
    ASSERT_TRUE(matmul.ok()) << matmul.status();
    EXPECT_EQ(matmul->weight_name(), "proj");
    EXPECT_EQ(matmul->m(), m);
    EXPECT_EQ(matmul->k(), kSpec.k);
    EXPECT_EQ(matmul->dtype(), ToProto(dtype));
    EXPECT_EQ(matmul->a(), a);
  }
}

TEST(MatmulRequestFromKServeTest, Fp32ContentsBecomeLittleEndianBytes) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  const int64_t m = 2;
  inference::ModelInferRequest request = Request("FP32", m, kSpec.k);
  const std::vector<float> values = RandomFloats(m * kSpec.k, kSeed);
  for (float value : values) {
    request.mutable_inputs(0)->mutable_contents()->add_fp32_contents(value);
  }
  absl::StatusOr<v1::MatmulRequest> matmul =
      MatmulRequestFromKServe(request, kSpec);
  ASSERT_TRUE(matmul.ok()) << matmul.status();
  ASSERT_EQ(matmul->a().size(), values.size() * sizeof(float));
  std::vector<float> decoded(values.size());
  std::memcpy(decoded.data(), matmul->a().data(), matmul->a().size());
  EXPECT_EQ(decoded, values);
}

TEST(MatmulRequestFromKServeTest, RequestedOutputCIsAccepted) {
  inference::ModelInferRequest request = Request("BF16", 1, kSpec.k);
  request.add_raw_input_contents(RandomBytes(kSpec.k * 2, kSeed));
  request.add_outputs()->set_name("c");
  EXPECT_TRUE(MatmulRequestFromKServe(request, kSpec).ok());
}

TEST(MatmulRequestFromKServeTest, WrongInputCountOrName) {
  inference::ModelInferRequest none = Request("FP32", 1, kSpec.k);
  none.clear_inputs();
  ExpectInvalid(none, "the request has 0 inputs");
  inference::ModelInferRequest two = Request("FP32", 1, kSpec.k);
  *two.add_inputs() = two.inputs(0);
  ExpectInvalid(two, "the request has 2 inputs");
  inference::ModelInferRequest renamed = Request("FP32", 1, kSpec.k);
  renamed.mutable_inputs(0)->set_name("x");
  ExpectInvalid(renamed, "input \"x\" is unknown");
}

TEST(MatmulRequestFromKServeTest, UnknownDatatype) {
  ExpectInvalid(Request("INT8", 1, kSpec.k),
                "datatype \"INT8\" is not supported");
}

TEST(MatmulRequestFromKServeTest, BadShapes) {
  inference::ModelInferRequest three_d = Request("FP32", 1, kSpec.k);
  three_d.mutable_inputs(0)->add_shape(1);
  ExpectInvalid(three_d, "has shape [1, 64, 1]; it must be 2-D");
  inference::ModelInferRequest one_d = Request("FP32", 1, kSpec.k);
  one_d.mutable_inputs(0)->mutable_shape()->RemoveLast();
  ExpectInvalid(one_d, "has K = 1 columns but model \"proj\" takes K = 64");
  inference::ModelInferRequest no_d = Request("FP32", 1, kSpec.k);
  no_d.mutable_inputs(0)->clear_shape();
  ExpectInvalid(no_d, "has shape []; it must be 2-D, [M, 64], or 1-D, [64]");
  ExpectInvalid(Request("FP32", -1, kSpec.k), "dimensions cannot be negative");
  ExpectInvalid(Request("FP32", 2, -64), "dimensions cannot be negative");
  ExpectInvalid(Request("FP32", 0, kSpec.k), "at least one row");
  ExpectInvalid(Request("FP32", 2, 32),
                "has K = 32 columns but model \"proj\" takes K = 64");
}

// Many clients send a single vector as [K]: it is one row.
TEST(MatmulRequestFromKServeTest, OneDimensionalInputIsOneRow) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  inference::ModelInferRequest request = Request("BF16", 1, kSpec.k);
  request.mutable_inputs(0)->clear_shape();
  request.mutable_inputs(0)->add_shape(kSpec.k);
  const std::string a = RandomBytes(kSpec.k * 2, kSeed);
  request.add_raw_input_contents(a);
  absl::StatusOr<v1::MatmulRequest> matmul =
      MatmulRequestFromKServe(request, kSpec);
  ASSERT_TRUE(matmul.ok()) << matmul.status();
  EXPECT_EQ(matmul->m(), 1);
  EXPECT_EQ(matmul->k(), kSpec.k);
  EXPECT_EQ(matmul->a(), a);

  v1::MatmulResponse reply;
  reply.set_c(RandomBytes(kSpec.n * 2, kSeed + 1));
  reply.set_m(1);
  reply.set_n(kSpec.n);
  inference::ModelInferResponse response;
  FillKServeInferResponse(request, reply, &response);
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(kSpec.n));
}

// Clients that always fill the message send an empty contents beside the raw
// bytes; only contents that hold values conflict with them.
TEST(MatmulRequestFromKServeTest, RawDataWithEmptyContentsIsAccepted) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  inference::ModelInferRequest request = Request("FP32", 2, kSpec.k);
  const std::string a = RandomBytes(2 * kSpec.k * 4, kSeed);
  request.add_raw_input_contents(a);
  request.mutable_inputs(0)->mutable_contents();
  ASSERT_TRUE(request.inputs(0).has_contents());
  absl::StatusOr<v1::MatmulRequest> matmul =
      MatmulRequestFromKServe(request, kSpec);
  ASSERT_TRUE(matmul.ok()) << matmul.status();
  EXPECT_EQ(matmul->a(), a);

  // An empty contents alone still has no data.
  inference::ModelInferRequest empty = Request("FP32", 1, kSpec.k);
  empty.mutable_inputs(0)->mutable_contents();
  ExpectInvalid(empty, "has no data");
}

TEST(MatmulRequestFromKServeTest, RawByteCountMustMatchTheShape) {
  inference::ModelInferRequest short_raw = Request("FP16", 2, kSpec.k);
  short_raw.add_raw_input_contents(RandomBytes(2 * 64 * 2 - 1, kSeed));
  ExpectInvalid(short_raw, "raw_input_contents[0] has 255 bytes");
  inference::ModelInferRequest huge_m =
      Request("FP32", int64_t{1} << 62, kSpec.k);
  huge_m.add_raw_input_contents(RandomBytes(64 * 4, kSeed));
  ExpectInvalid(huge_m, "raw_input_contents[0] has 256 bytes");
  inference::ModelInferRequest two_raw = Request("FP32", 1, kSpec.k);
  two_raw.add_raw_input_contents(RandomBytes(64 * 4, kSeed));
  two_raw.add_raw_input_contents(RandomBytes(64 * 4, kSeed + 1));
  ExpectInvalid(two_raw, "raw_input_contents has 2 entries");
}

TEST(MatmulRequestFromKServeTest, DataInTheWrongPlace) {
  inference::ModelInferRequest both = Request("FP32", 1, kSpec.k);
  both.add_raw_input_contents(RandomBytes(64 * 4, kSeed));
  for (float value : RandomFloats(64, kSeed)) {
    both.mutable_inputs(0)->mutable_contents()->add_fp32_contents(value);
  }
  ExpectInvalid(both, "both in raw_input_contents and in contents");

  ExpectInvalid(Request("FP32", 1, kSpec.k), "has no data");

  inference::ModelInferRequest half_contents = Request("FP16", 1, kSpec.k);
  for (float value : RandomFloats(64, kSeed)) {
    half_contents.mutable_inputs(0)->mutable_contents()->add_fp32_contents(
        value);
  }
  ExpectInvalid(half_contents, "FP16, which has no typed contents list");

  inference::ModelInferRequest wrong_list = Request("FP32", 1, kSpec.k);
  for (int i = 0; i < 64; ++i) {
    wrong_list.mutable_inputs(0)->mutable_contents()->add_int_contents(i + 1);
  }
  ExpectInvalid(wrong_list, "put its values in contents.fp32_contents");

  inference::ModelInferRequest few_values = Request("FP32", 2, kSpec.k);
  for (float value : RandomFloats(100, kSeed)) {
    few_values.mutable_inputs(0)->mutable_contents()->add_fp32_contents(value);
  }
  ExpectInvalid(few_values, "has 100 values but shape [2, 64] needs 2 x 64");
}

TEST(MatmulRequestFromKServeTest, OnlyOutputCCanBeRequested) {
  inference::ModelInferRequest request = Request("FP32", 1, kSpec.k);
  request.add_raw_input_contents(RandomBytes(64 * 4, kSeed));
  request.add_outputs()->set_name("c");
  request.add_outputs()->set_name("logits");
  ExpectInvalid(request, "requested output \"logits\" is unknown");
}

TEST(FillKServeInferResponseTest, ReturnsCRawWithTheInputsDatatype) {
  inference::ModelInferRequest request = Request("BF16", 3, kSpec.k);
  v1::MatmulResponse matmul;
  const std::string c = RandomBytes(3 * kSpec.n * 2, kSeed);
  matmul.set_c(c);
  matmul.set_m(3);
  matmul.set_n(kSpec.n);
  matmul.set_kernel("fused_u4b8_avx512");
  inference::ModelInferResponse response;
  FillKServeInferResponse(request, matmul, &response);
  EXPECT_EQ(response.model_name(), "proj");
  EXPECT_EQ(response.model_version(), "1");
  EXPECT_EQ(response.id(), "req-7");
  ASSERT_EQ(response.outputs_size(), 1);
  EXPECT_EQ(response.outputs(0).name(), "c");
  EXPECT_EQ(response.outputs(0).datatype(), "BF16");
  EXPECT_THAT(response.outputs(0).shape(), ElementsAre(3, kSpec.n));
  EXPECT_FALSE(response.outputs(0).has_contents());
  EXPECT_THAT(response.raw_output_contents(), ElementsAre(c));
  EXPECT_EQ(response.parameters().at("kernel").string_param(),
            "fused_u4b8_avx512");
}

// The parameter says what the kernel made of A, by the names requests and
// nibbled's flag use; a MatmulResponse that does not say adds none.
TEST(FillKServeInferResponseTest, SaysWhatTheKernelMadeOfA) {
  const inference::ModelInferRequest request = Request("FP32", 1, kSpec.k);
  for (const auto& [precision, name] :
       {std::pair{v1::ACTIVATION_PRECISION_EXACT, "exact"},
        std::pair{v1::ACTIVATION_PRECISION_BF16, "bf16"},
        std::pair{v1::ACTIVATION_PRECISION_INT8, "int8"}}) {
    v1::MatmulResponse matmul;
    matmul.set_activation_precision(precision);
    inference::ModelInferResponse response;
    FillKServeInferResponse(request, matmul, &response);
    EXPECT_EQ(response.parameters()
                  .at(kKServeActivationPrecisionParameter)
                  .string_param(),
              name);
  }
  inference::ModelInferResponse response;
  FillKServeInferResponse(request, v1::MatmulResponse(), &response);
  EXPECT_FALSE(
      response.parameters().contains(kKServeActivationPrecisionParameter));
}

}  // namespace
}  // namespace nibble::server
