#include "tests/integration/upload_messages.h"

#include <cstdint>
#include <utility>

#include "client/proto_conversions.h"

namespace nibble::testing {
namespace {

// Under gRPC's default 4 MiB message limit, so weights far above one message
// upload too.
constexpr size_t kChunkBytes = 1 << 20;

v1::UploadWeightRequest Chunk(v1::WeightTensor tensor, uint64_t offset,
                              std::string data) {
  v1::UploadWeightRequest request;
  request.mutable_chunk()->set_tensor(tensor);
  request.mutable_chunk()->set_offset(offset);
  request.mutable_chunk()->set_data(std::move(data));
  return request;
}

}  // namespace

v1::UploadWeightRequest UploadHeader(
    const std::string& name, const WeightSpec& spec,
    absl::Span<const int32_t> activation_order) {
  v1::UploadWeightRequest request;
  client::FillWeightHeader(name, spec, activation_order,
                           request.mutable_header());
  return request;
}

std::vector<v1::UploadWeightRequest> UploadMessages(
    const std::string& name, const QuantizedWeight& weight) {
  std::vector<v1::UploadWeightRequest> messages = {
      UploadHeader(name, weight.spec, weight.activation_order)};
  const std::pair<v1::WeightTensor, std::string> tensors[] = {
      {v1::WEIGHT_TENSOR_QWEIGHT, Bytes(weight.qweight)},
      {v1::WEIGHT_TENSOR_SCALES, Bytes(weight.scales)},
      {v1::WEIGHT_TENSOR_ZEROS, Bytes(weight.zeros)}};
  for (const auto& [tensor, bytes] : tensors) {
    for (size_t offset = 0; offset < bytes.size(); offset += kChunkBytes) {
      messages.push_back(
          Chunk(tensor, offset, bytes.substr(offset, kChunkBytes)));
    }
  }
  return messages;
}

grpc::Status UploadWeight(v1::NibbleService::Stub& stub,
                          const std::vector<v1::UploadWeightRequest>& messages,
                          v1::WeightInfo* info) {
  grpc::ClientContext context;
  v1::WeightInfo ignored;
  auto writer = stub.UploadWeight(&context, info != nullptr ? info : &ignored);
  for (const v1::UploadWeightRequest& message : messages) {
    if (!writer->Write(message)) break;  // the server has already answered
  }
  writer->WritesDone();
  return writer->Finish();
}

grpc::Status UploadWeight(v1::NibbleService::Stub& stub,
                          const std::string& name,
                          const QuantizedWeight& weight) {
  return UploadWeight(stub, UploadMessages(name, weight));
}

}  // namespace nibble::testing
