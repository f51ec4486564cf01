#include "tests/integration/weight_client.h"

#include <random>

#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "gtest/gtest.h"
#include "tests/integration/upload_messages.h"

namespace nibble::testing {

WeightClient::WeightClient(const std::string& target)
    : stub_(v1::NibbleService::NewStub(
          grpc::CreateChannel(target, grpc::InsecureChannelCredentials()))) {}

grpc::Status WeightClient::Upload(const std::string& name,
                                  const QuantizedWeight& weight) {
  return UploadWeight(*stub_, name, weight);
}

std::vector<std::string> WeightClient::List() {
  std::vector<std::string> weights;
  v1::ListWeightsRequest request;
  do {
    grpc::ClientContext context;
    v1::ListWeightsResponse response;
    const grpc::Status status =
        stub_->ListWeights(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    for (const v1::WeightInfo& info : response.weights()) {
      weights.push_back(info.ShortDebugString());
    }
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return weights;
}

grpc::Status WeightClient::Delete(const std::string& name) {
  grpc::ClientContext context;
  v1::DeleteWeightRequest request;
  request.set_name(name);
  v1::DeleteWeightResponse response;
  return stub_->DeleteWeight(&context, request, &response);
}

std::string WeightClient::Matmul(const std::string& name, int64_t k) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> a(3 * k);
  for (float& value : a) value = uniform(rng);
  v1::MatmulRequest request;
  request.set_weight_name(name);
  request.set_m(3);
  request.set_dtype(client::ToProto(DType::kF32));
  request.set_a(Bytes(a));
  grpc::ClientContext context;
  v1::MatmulResponse response;
  const grpc::Status status = stub_->Matmul(&context, request, &response);
  if (!status.ok()) return "error: " + status.error_message();
  return response.c();
}

}  // namespace nibble::testing
