#include "client/upload_message.h"

#include <cstdint>
#include <string>

#include "grpcpp/support/slice.h"

namespace nibble {
namespace {

// Protobuf's wire type of strings, bytes and embedded messages.
constexpr uint32_t kLengthDelimited = 2;

void AppendVarint(uint64_t value, std::string& out) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

// The key and length that precede a length-delimited field of `size` bytes.
void AppendFieldStart(int field_number, uint64_t size, std::string& out) {
  AppendVarint(static_cast<uint64_t>(field_number) << 3 | kLengthDelimited,
               out);
  AppendVarint(size, out);
}

}  // namespace

grpc::ByteBuffer SerializedMessage(
    const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer UploadChunkMessage(v1::WeightTensor tensor, uint64_t offset,
                                    absl::string_view data) {
  // The chunk's other fields, then the start of its data field; a parser
  // takes fields in any order.
  v1::WeightChunk fields;
  fields.set_tensor(tensor);
  fields.set_offset(offset);
  std::string chunk_start = fields.SerializeAsString();
  AppendFieldStart(v1::WeightChunk::kDataFieldNumber, data.size(), chunk_start);
  std::string message_start;
  AppendFieldStart(v1::UploadWeightRequest::kChunkFieldNumber,
                   chunk_start.size() + data.size(), message_start);
  message_start += chunk_start;

  grpc::Slice slices[] = {
      grpc::Slice(message_start),
      grpc::Slice(data.data(), data.size(), grpc::Slice::STATIC_SLICE)};
  return grpc::ByteBuffer(slices, data.empty() ? 1 : 2);
}

}  // namespace nibble
