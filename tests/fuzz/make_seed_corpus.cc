// Writes the fuzz targets' seed corpus: a few small, valid inputs per target
// (corpus/<target>/), made with the product's own serializers so that they
// stay valid as the formats evolve. Rerun after a format change:
//   nibble_fuzz_seeds tests/fuzz/corpus
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "client/proto_conversions.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "inference/grpc_predict_v2.pb.h"
#include "kernels/tuning_table.h"
#include "nibble/v1/nibble.pb.h"
#include "server/storage/weight_file.h"
#include "tests/format/column_layout.h"
#include "tests/fuzz/fuzz_messages.h"

namespace {

namespace fs = std::filesystem;
namespace v1 = nibble::v1;
namespace ckpt = nibble::checkpoint;
using nibble::WeightFormat;
using nibble::WeightSpec;

// Small enough that the fuzzers mutate them quickly.
const WeightSpec kSpecs[] = {{WeightFormat::kFp4, 64, 8, 32},
                             {WeightFormat::kU4b8, 64, 4, 64},
                             {WeightFormat::kU4, 32, 4, 32},
                             {WeightFormat::kU4, 16, 2, 16},
                             {WeightFormat::kMxfp4, 64, 4, 32},
                             {WeightFormat::kNvfp4, 32, 4, 16, 0.25f}};

// The name of rpc_messages_fuzzer's resident weight.
constexpr char kResidentWeightName[] = "w";

std::string SeedName(const WeightSpec& spec) {
  return std::string(nibble::WeightFormatName(spec.format)) + "_k" +
         std::to_string(spec.k) + "_n" + std::to_string(spec.n) + "_g" +
         std::to_string(spec.group_size);
}

bool WriteSeed(const fs::path& directory, const std::string& name,
               const std::string& bytes) {
  fs::create_directories(directory);
  std::ofstream out(directory / name, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), bytes.size());
  return static_cast<bool>(out);
}

template <typename T>
std::string Bytes(const std::vector<T>& array) {
  return std::string(reinterpret_cast<const char*>(array.data()),
                     array.size() * sizeof(T));
}

// An upload as a client sends it, each tensor in two chunks; MXFP4 and NVFP4
// weights in `layout`.
std::vector<std::string> UploadMessages(
    const nibble::QuantizedWeight& weight,
    nibble::CodeLayout layout = nibble::CodeLayout::kCanonical) {
  v1::UploadWeightRequest header;
  nibble::client::FillWeightHeader("seed", weight.spec, weight.activation_order,
                                   header.mutable_header());
  header.mutable_header()->set_code_layout(nibble::client::ToProto(layout));
  std::vector<std::string> messages = {header.SerializeAsString()};
  std::pair<v1::WeightTensor, std::string> tensors[] = {
      {v1::WEIGHT_TENSOR_QWEIGHT, Bytes(weight.qweight)},
      {v1::WEIGHT_TENSOR_SCALES, Bytes(weight.scales)},
      {v1::WEIGHT_TENSOR_ZEROS, Bytes(weight.zeros)}};
  if (layout == nibble::CodeLayout::kColumns) {
    const nibble::testing::ColumnLayout columns =
        nibble::testing::ToColumns(weight);
    tensors[0].second = Bytes(columns.codes);
    tensors[1].second = Bytes(columns.scale_codes);
  }
  for (const auto& [tensor, bytes] : tensors) {
    const size_t half = bytes.size() / 2;
    for (size_t offset : {size_t{0}, half}) {
      if (offset == bytes.size()) continue;
      v1::UploadWeightRequest chunk;
      chunk.mutable_chunk()->set_tensor(tensor);
      chunk.mutable_chunk()->set_offset(offset);
      chunk.mutable_chunk()->set_data(
          bytes.substr(offset, offset == 0 ? half : std::string::npos));
      messages.push_back(chunk.SerializeAsString());
    }
  }
  return messages;
}

// rpc_messages_fuzzer's input: the message's index, then the message.
std::string RpcInput(char index, const google::protobuf::Message& message) {
  return std::string(1, index) + message.SerializeAsString();
}

v1::MatmulRequest MatmulOnResidentWeight(v1::DType dtype, int bytes_per_value) {
  v1::MatmulRequest request;
  request.set_weight_name(kResidentWeightName);
  request.set_m(2);
  request.set_k(64);
  request.set_dtype(dtype);
  request.set_a(std::string(2 * 64 * bytes_per_value, '\x3c'));
  return request;
}

inference::ModelInferRequest InferOnResidentWeight(bool raw) {
  inference::ModelInferRequest request;
  request.set_model_name(kResidentWeightName);
  request.set_model_version("1");
  request.set_id("seed");
  inference::ModelInferRequest::InferInputTensor* input = request.add_inputs();
  input->set_name("a");
  input->add_shape(1);
  input->add_shape(64);
  if (raw) {
    input->set_datatype("FP16");
    request.add_raw_input_contents(std::string(64 * 2, '\x3c'));
  } else {
    input->set_datatype("FP32");
    for (int i = 0; i < 64; ++i) {
      input->mutable_contents()->add_fp32_contents(0.25f * i);
    }
  }
  request.add_outputs()->set_name("c");
  return request;
}

// safetensors_fuzzer's input: a safetensors file of one tensor per entry of
// `shapes`, named t0, t1, ..., their bytes a pattern without '}' (the
// fuzzer's second pass ends the header at the input's last '}').
std::string SafetensorsSeed(
    const std::vector<std::pair<ckpt::SafetensorsDtype, std::vector<int64_t>>>&
        shapes,
    const std::map<std::string, std::string>& metadata) {
  std::vector<std::string> data;
  std::vector<ckpt::NamedTensorBytes> tensors;
  data.reserve(shapes.size());
  for (const auto& [dtype, shape] : shapes) {
    int64_t bytes = ckpt::SafetensorsDtypeBytes(dtype);
    for (int64_t dim : shape) bytes *= dim;
    std::string& pattern = data.emplace_back(bytes, '\0');
    for (int64_t i = 0; i < bytes; ++i) {
      pattern[i] = static_cast<char>(i * 37 % 125);
    }
    tensors.push_back(
        {absl::StrCat("t", tensors.size()), dtype, shape, pattern});
  }
  absl::StatusOr<std::string> file =
      ckpt::SerializeSafetensors(tensors, metadata);
  if (!file.ok()) {
    std::fprintf(stderr, "nibble_fuzz_seeds: %s\n",
                 file.status().ToString().c_str());
    std::exit(1);
  }
  return *file;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const fs::path corpus = argv[1];
  bool written = true;

  const fs::path weight_files = corpus / "weight_file_fuzzer";
  const fs::path uploads = corpus / "upload_fuzzer";
  for (const WeightSpec& spec : kSpecs) {
    const nibble::QuantizedWeight weight =
        nibble::RandomQuantizedWeight(spec, 7);
    written &= WriteSeed(weight_files, SeedName(spec),
                         nibble::server::SerializeWeightFile("seed", weight));
    written &= WriteSeed(uploads, SeedName(spec),
                         nibble::fuzz::JoinMessages(UploadMessages(weight)));
    if (nibble::HasColumnLayout(spec.format)) {
      written &= WriteSeed(uploads, SeedName(spec) + "_columns",
                           nibble::fuzz::JoinMessages(UploadMessages(
                               weight, nibble::CodeLayout::kColumns)));
    }
  }
  // A GPTQ act-order weight: version 2 files, headers with an order.
  nibble::QuantizedWeight act_order =
      nibble::RandomQuantizedWeight(kSpecs[0], 7);
  act_order.activation_order = nibble::RandomActivationOrder(kSpecs[0].k, 7);
  written &= WriteSeed(weight_files, SeedName(kSpecs[0]) + "_act_order",
                       nibble::server::SerializeWeightFile("seed", act_order));
  written &= WriteSeed(uploads, SeedName(kSpecs[0]) + "_act_order",
                       nibble::fuzz::JoinMessages(UploadMessages(act_order)));

  const fs::path tables = corpus / "tuning_table_fuzzer";
  written &=
      WriteSeed(tables, "default", nibble::TuningTable::Default().Serialize());
  written &= WriteSeed(tables, "commented",
                       "# format group k n threads max_m variant\n"
                       "u4b8 128 4096 14336 2 4 fused  # small m\n"
                       "u4b8 128 4096 14336 2 0 double_buffered\n"
                       "\n"
                       "fp4 32 64 8 1 0 fused\r\n");
  written &= WriteSeed(tables, "gpu",
                       "# isa format group k n threads max_m variant\n"
                       "sm90 u4b8 128 4096 14336 132 1023 double_buffered\n"
                       "sm90 u4b8 128 4096 14336 132 0 striped\n"
                       "sm90 fp4 32 4096 14336 78 63 fused\n"
                       "sm80 u4b8 128 4096 14336 108 0 fused\n"
                       "avx2 u4b8 128 4096 14336 2 15 striped\n"
                       "u4b8 128 4096 14336 2 15 fused\n");

  // The indices are rpc_messages_fuzzer's Message enum.
  const fs::path rpcs = corpus / "rpc_messages_fuzzer";
  written &= WriteSeed(rpcs, "matmul_f32",
                       RpcInput(0, MatmulOnResidentWeight(v1::DTYPE_F32, 4)));
  written &= WriteSeed(rpcs, "matmul_bf16",
                       RpcInput(0, MatmulOnResidentWeight(v1::DTYPE_BF16, 2)));
  v1::MatmulStreamRequest stream;
  stream.set_id(9);
  *stream.mutable_request() = MatmulOnResidentWeight(v1::DTYPE_F16, 2);
  written &= WriteSeed(rpcs, "matmul_stream_f16", RpcInput(1, stream));
  v1::UploadWeightRequest header;
  header.ParseFromString(
      UploadMessages(nibble::RandomQuantizedWeight(kSpecs[2], 7)).front());
  written &= WriteSeed(rpcs, "upload_header", RpcInput(2, header));
  v1::GetWeightRequest get;
  get.set_name(kResidentWeightName);
  written &= WriteSeed(rpcs, "get_weight", RpcInput(3, get));
  v1::DeleteWeightRequest remove;
  remove.set_name(kResidentWeightName);
  written &= WriteSeed(rpcs, "delete_weight", RpcInput(4, remove));
  written &= WriteSeed(rpcs, "model_infer_raw_fp16",
                       RpcInput(5, InferOnResidentWeight(/*raw=*/true)));
  written &= WriteSeed(rpcs, "model_infer_fp32_contents",
                       RpcInput(5, InferOnResidentWeight(/*raw=*/false)));
  inference::ModelReadyRequest ready;
  ready.set_name(kResidentWeightName);
  written &= WriteSeed(rpcs, "model_ready", RpcInput(6, ready));
  inference::ModelMetadataRequest metadata;
  metadata.set_name(kResidentWeightName);
  metadata.set_version("1");
  written &= WriteSeed(rpcs, "model_metadata", RpcInput(7, metadata));
  v1::ListWeightsRequest list;
  list.set_page_size(2);
  list.set_page_token("a");
  written &= WriteSeed(rpcs, "list_weights_page", RpcInput(8, list));

  const fs::path safetensors = corpus / "safetensors_fuzzer";
  written &= WriteSeed(safetensors, "no_tensors", SafetensorsSeed({}, {}));
  written &= WriteSeed(safetensors, "f32_bf16_metadata",
                       SafetensorsSeed({{ckpt::SafetensorsDtype::kF32, {2, 3}},
                                        {ckpt::SafetensorsDtype::kBF16, {4}}},
                                       {{"format", "pt"}}));
  written &= WriteSeed(safetensors, "scalar_and_empty",
                       SafetensorsSeed({{ckpt::SafetensorsDtype::kI64, {}},
                                        {ckpt::SafetensorsDtype::kF16, {3, 0}}},
                                       {}));
  std::vector<std::pair<ckpt::SafetensorsDtype, std::vector<int64_t>>> every;
  for (ckpt::SafetensorsDtype dtype : ckpt::kAllSafetensorsDtypes) {
    every.push_back({dtype, {2}});
  }
  written &= WriteSeed(safetensors, "every_dtype", SafetensorsSeed(every, {}));

  // Indexes as save_pretrained writes them, one layer over two shards.
  const fs::path indexes = corpus / "shard_index_fuzzer";
  written &= WriteSeed(
      indexes, "two_shards",
      R"({"metadata": {"total_size": 2097152},)"
      R"( "weight_map": {)"
      R"("model.layers.0.mlp.up_proj.qweight": "model-00001-of-00002.safetensors",)"
      R"( "model.layers.0.mlp.up_proj.qzeros": "model-00002-of-00002.safetensors",)"
      R"( "model.layers.0.mlp.up_proj.scales": "model-00002-of-00002.safetensors"}})");
  written &=
      WriteSeed(indexes, "no_metadata",
                R"({"weight_map": {"lm_head.weight": "model.safetensors"}})");

  if (!written) {
    std::fprintf(stderr, "nibble_fuzz_seeds: could not write under %s\n",
                 corpus.c_str());
    return 1;
  }
  return 0;
}
