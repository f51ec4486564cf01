#include "server/edge/kserve_conversions.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/core/weight_store.h"
#include "server/edge/proto_conversions.h"

namespace nibble::server {
namespace {

// fp32_contents are copied as they lie in memory into the little-endian bytes
// that nibble.v1 carries.
static_assert(std::endian::native == std::endian::little,
              "fp32_contents are copied bytewise into little-endian A");

std::string ShapeString(const google::protobuf::RepeatedField<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Whether any typed list other than fp32_contents holds values.
bool HasNonFp32Contents(const inference::InferTensorContents& contents) {
  return contents.bool_contents_size() > 0 ||
         contents.int_contents_size() > 0 ||
         contents.int64_contents_size() > 0 ||
         contents.uint_contents_size() > 0 ||
         contents.uint64_contents_size() > 0 ||
         contents.fp64_contents_size() > 0 ||
         contents.bytes_contents_size() > 0;
}

// Whether any typed list holds values: clients that always fill the message
// send an empty `contents` beside raw_input_contents.
bool HasContents(const inference::InferTensorContents& contents) {
  return contents.fp32_contents_size() > 0 || HasNonFp32Contents(contents);
}

absl::Status CheckRequestedOutputs(
    const inference::ModelInferRequest& request) {
  for (const auto& output : request.outputs()) {
    if (output.name() != kKServeOutputName) {
      return absl::InvalidArgumentError(absl::StrCat(
          "requested output \"", output.name(), "\" is unknown: model \"",
          request.model_name(), "\" has one output, \"", kKServeOutputName,
          "\" (or request no outputs to get it)"));
    }
  }
  return absl::OkStatus();
}

// A's bytes from whichever of raw_input_contents or contents carries them,
// checked against the M * K elements of `dtype` that the shape promises.
absl::StatusOr<std::string> InputBytes(
    const inference::ModelInferRequest& request, DType dtype, int64_t m,
    int64_t k) {
  const inference::ModelInferRequest::InferInputTensor& input =
      request.inputs(0);
  const std::string shape = ShapeString(input.shape());
  if (request.raw_input_contents_size() > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "raw_input_contents has ", request.raw_input_contents_size(),
        " entries; send exactly one, for input \"", kKServeInputName, "\""));
  }
  if (request.raw_input_contents_size() == 1) {
    if (HasContents(input.contents())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "input \"", kKServeInputName,
          "\" has data both in raw_input_contents and in contents; send it in "
          "only one of them"));
    }
    const std::string& raw = request.raw_input_contents(0);
    const int64_t row_bytes = k * static_cast<int64_t>(DTypeSize(dtype));
    // Compared by division first, so that a huge M cannot overflow.
    if (m > static_cast<int64_t>(raw.size()) / row_bytes ||
        m * row_bytes != static_cast<int64_t>(raw.size())) {
      return absl::InvalidArgumentError(absl::StrCat(
          "raw_input_contents[0] has ", raw.size(), " bytes but input \"",
          kKServeInputName, "\" ", input.datatype(), " ", shape, " needs ", m,
          " x ", row_bytes, " (M x K x ", DTypeSize(dtype),
          " bytes, row-major, little-endian)"));
    }
    return raw;
  }
  if (!HasContents(input.contents())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input \"", kKServeInputName,
        "\" has no data: send its M x K elements in raw_input_contents[0] "
        "or, for FP32, in contents.fp32_contents"));
  }
  if (dtype != DType::kF32) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input \"", kKServeInputName, "\" is ", input.datatype(),
        ", which has no typed contents list: send it in raw_input_contents"));
  }
  if (HasNonFp32Contents(input.contents())) {
    return absl::InvalidArgumentError(
        absl::StrCat("input \"", kKServeInputName,
                     "\" is FP32: put its values in contents.fp32_contents, "
                     "not in another contents list"));
  }
  const auto& values = input.contents().fp32_contents();
  if (m > values.size() / k || m * k != values.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "contents.fp32_contents of input \"", kKServeInputName, "\" has ",
        values.size(), " values but shape ", shape, " needs ", m, " x ", k));
  }
  std::string bytes(values.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace

absl::string_view KServeDatatype(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "FP32";
    case DType::kF16:
      return "FP16";
    case DType::kBF16:
      return "BF16";
  }
  return "unknown";
}

absl::StatusOr<DType> DTypeFromKServeDatatype(absl::string_view datatype) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    if (datatype == KServeDatatype(dtype)) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "datatype \"", datatype, "\" is not supported: use FP32, FP16 or BF16"));
}

absl::Status CheckKServeModelVersion(absl::string_view model_name,
                                     absl::string_view version) {
  if (version.empty() || version == kKServeModelVersion) {
    return absl::OkStatus();
  }
  return absl::NotFoundError(
      absl::StrCat("model \"", model_name, "\" has no version \"", version,
                   "\": its only version is \"", kKServeModelVersion,
                   "\" (or leave the version empty)"));
}

absl::Status KServeModelNotFound(absl::string_view model_name) {
  return NoSuchName("model", model_name,
                    "each resident nibble weight is a model; upload the "
                    "weight first");
}

absl::StatusOr<std::shared_ptr<const ResidentWeight>> FindKServeModel(
    const WeightStore& store, absl::string_view model_name,
    absl::string_view version) {
  absl::StatusOr<std::shared_ptr<const ResidentWeight>> weight =
      store.Get(model_name);
  if (absl::IsNotFound(weight.status())) return KServeModelNotFound(model_name);
  if (!weight.ok()) return weight.status();
  if (absl::Status status = CheckKServeModelVersion(model_name, version);
      !status.ok()) {
    return status;
  }
  return weight;
}

void FillKServeModelMetadata(absl::string_view model_name,
                             const WeightSpec& spec,
                             inference::ModelMetadataResponse* response) {
  response->set_name(std::string(model_name));
  response->add_versions(std::string(kKServeModelVersion));
  response->set_platform(kKServePlatform);
  inference::ModelMetadataResponse::TensorMetadata* input =
      response->add_inputs();
  input->set_name(kKServeInputName);
  input->set_datatype(std::string(KServeDatatype(DType::kF32)));
  input->add_shape(-1);
  input->add_shape(spec.k);
  inference::ModelMetadataResponse::TensorMetadata* output =
      response->add_outputs();
  output->set_name(kKServeOutputName);
  output->set_datatype(std::string(KServeDatatype(DType::kF32)));
  output->add_shape(-1);
  output->add_shape(spec.n);
}

absl::StatusOr<v1::MatmulRequest> MatmulRequestFromKServe(
    const inference::ModelInferRequest& request, const WeightSpec& spec) {
  if (request.inputs_size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the request has ", request.inputs_size(), " inputs but model \"",
        request.model_name(), "\" takes exactly one, \"", kKServeInputName,
        "\" [M, ", spec.k, "]"));
  }
  const inference::ModelInferRequest::InferInputTensor& input =
      request.inputs(0);
  if (input.name() != kKServeInputName) {
    return absl::InvalidArgumentError(
        absl::StrCat("input \"", input.name(), "\" is unknown: model \"",
                     request.model_name(), "\" takes one input named \"",
                     kKServeInputName, "\""));
  }
  absl::StatusOr<DType> dtype = DTypeFromKServeDatatype(input.datatype());
  if (!dtype.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input \"", kKServeInputName, "\": ", dtype.status().message()));
  }
  const std::string shape = ShapeString(input.shape());
  if (input.shape_size() != 1 && input.shape_size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input \"", kKServeInputName, "\" has shape ", shape,
        "; it must be 2-D, [M, ", spec.k, "], or 1-D, [", spec.k, "]"));
  }
  // [K] is one row, a single vector as many clients send it.
  const int64_t m = input.shape_size() == 1 ? 1 : input.shape(0);
  const int64_t k = input.shape(input.shape_size() - 1);
  if (m < 0 || k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input \"", kKServeInputName, "\" has shape ", shape,
                     "; dimensions cannot be negative"));
  }
  if (m == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("input \"", kKServeInputName, "\" has shape ", shape,
                     "; send at least one row (M >= 1)"));
  }
  if (k != spec.k) {
    return absl::InvalidArgumentError(absl::StrCat(
        "input \"", kKServeInputName, "\" has K = ", k, " columns but model \"",
        request.model_name(), "\" takes K = ", spec.k, ": send shape [M, ",
        spec.k, "]"));
  }
  if (absl::Status status = CheckRequestedOutputs(request); !status.ok()) {
    return status;
  }
  absl::StatusOr<std::string> a = InputBytes(request, *dtype, m, k);
  if (!a.ok()) return a.status();

  v1::MatmulRequest matmul;
  matmul.set_weight_name(request.model_name());
  matmul.set_m(m);
  matmul.set_k(k);
  matmul.set_dtype(ToProto(*dtype));
  matmul.set_a(*std::move(a));
  return matmul;
}

void FillKServeInferResponse(const inference::ModelInferRequest& request,
                             v1::MatmulResponse matmul,
                             inference::ModelInferResponse* response) {
  response->set_model_name(request.model_name());
  response->set_model_version(kKServeModelVersion);
  response->set_id(request.id());
  inference::ModelInferResponse::InferOutputTensor* output =
      response->add_outputs();
  output->set_name(kKServeOutputName);
  output->set_datatype(request.inputs(0).datatype());
  // C has A's rank: [N] for a 1-D A.
  if (request.inputs(0).shape_size() != 1) output->add_shape(matmul.m());
  output->add_shape(matmul.n());
  response->add_raw_output_contents(std::move(*matmul.mutable_c()));
  auto& parameters = *response->mutable_parameters();
  parameters[kKServeKernelParameter].set_string_param(
      std::move(*matmul.mutable_kernel()));
  const absl::StatusOr<std::optional<ActivationPrecision>> precision =
      FromProto(matmul.activation_precision());
  if (precision.ok() && precision->has_value()) {
    parameters[kKServeActivationPrecisionParameter].set_string_param(
        std::string(ActivationPrecisionName(**precision)));
  }
}

int64_t KServeInferReplyEnvelopeBytes(
    const inference::ModelInferRequest& request) {
  // The version, output name and shape, the two parameters (the kernel's
  // name up to about 40 bytes), and every tag and length: far below this.
  constexpr int64_t kFixedBytes = 192;
  const int64_t datatype_bytes =
      request.inputs_size() > 0 ? request.inputs(0).datatype().size() : 0;
  return kFixedBytes + static_cast<int64_t>(request.model_name().size()) +
         static_cast<int64_t>(request.id().size()) + datatype_bytes;
}

}  // namespace nibble::server
