// Uploads of a QuantizedWeight over the raw nibble.v1 stub: the messages a
// well-behaved client sends, which a test may send as they are or edit into a
// bad upload, and the call that sends them.
//
// Example:
//   std::vector<v1::UploadWeightRequest> messages =
//       UploadMessages("w", RandomQuantizedWeight(spec, 1));
//   messages.pop_back();  // ends early
//   grpc::Status status = UploadWeight(*stub, messages);
#ifndef NIBBLE_TESTS_INTEGRATION_UPLOAD_MESSAGES_H_
#define NIBBLE_TESTS_INTEGRATION_UPLOAD_MESSAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "format/weight_format.h"
#include "grpcpp/grpcpp.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble::testing {

// The bytes of `array`, as the wire carries tensors and activations.
template <typename T>
std::string Bytes(const std::vector<T>& array) {
  return std::string(reinterpret_cast<const char*>(array.data()),
                     array.size() * sizeof(T));
}

// The first message of an upload of weight `name` with `spec` and
// `activation_order` (empty for none).
v1::UploadWeightRequest UploadHeader(
    const std::string& name, const WeightSpec& spec,
    absl::Span<const int32_t> activation_order = {});

// The whole upload: the header, then each tensor in chunks of 1 MiB.
std::vector<v1::UploadWeightRequest> UploadMessages(
    const std::string& name, const QuantizedWeight& weight);

// Sends `messages` as one UploadWeight call on `stub`, stopping early once
// the server has answered; the server's answer, with the WeightInfo in
// `info` when given.
grpc::Status UploadWeight(v1::NibbleService::Stub& stub,
                          const std::vector<v1::UploadWeightRequest>& messages,
                          v1::WeightInfo* info = nullptr);

// Uploads `weight` as `name`, as a well-behaved client does.
grpc::Status UploadWeight(v1::NibbleService::Stub& stub,
                          const std::string& name,
                          const QuantizedWeight& weight);

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_INTEGRATION_UPLOAD_MESSAGES_H_
