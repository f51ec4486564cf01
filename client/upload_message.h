// The messages of an UploadWeight stream as gRPC byte buffers, for clients
// that send them through a generic stub: a chunk's data goes out from the
// caller's memory as it is, where a v1::WeightChunk would copy it into its
// `data` string and gRPC would copy that again into its own buffers. For a
// gigabyte of weights the two copies are a large share of an upload's time.
//
// Example:
//   grpc::ByteBuffer chunk =
//       UploadChunkMessage(v1::WEIGHT_TENSOR_QWEIGHT, /*offset=*/0, bytes);
//   // `bytes` must stay unchanged until the call that sends `chunk` ends.
#ifndef NIBBLE_CLIENT_UPLOAD_MESSAGE_H_
#define NIBBLE_CLIENT_UPLOAD_MESSAGE_H_

#include <cstdint>

#include "absl/strings/string_view.h"
#include "google/protobuf/message_lite.h"
#include "grpcpp/support/byte_buffer.h"
#include "nibble/v1/nibble.pb.h"

namespace nibble {

// `message` serialized into a buffer of its own.
grpc::ByteBuffer SerializedMessage(
    const google::protobuf::MessageLite& message);

// The v1::UploadWeightRequest whose chunk carries `data` of `tensor` at
// `offset`. The buffer refers to `data` without copying it.
grpc::ByteBuffer UploadChunkMessage(v1::WeightTensor tensor, uint64_t offset,
                                    absl::string_view data);

}  // namespace nibble

#endif  // NIBBLE_CLIENT_UPLOAD_MESSAGE_H_
