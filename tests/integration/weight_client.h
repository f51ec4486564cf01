// A nibble.v1 client for tests that compare what a nibbled serves before and
// after something happens to it (a restart, a kill, a full disk): the weight
// list as strings and Matmul results as bytes, for fixed activations.
//
// Example:
//   WeightClient client((*server)->target());
//   ASSERT_TRUE(client.Upload("w", RandomQuantizedWeight(spec, 1)).ok());
//   const std::string before = client.Matmul("w", spec.k);
//   ... restart ...
//   EXPECT_EQ(WeightClient(target).Matmul("w", spec.k), before);
#ifndef NIBBLE_TESTS_INTEGRATION_WEIGHT_CLIENT_H_
#define NIBBLE_TESTS_INTEGRATION_WEIGHT_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "format/weight_format.h"
#include "grpcpp/grpcpp.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble::testing {

class WeightClient {
 public:
  explicit WeightClient(const std::string& target);

  grpc::Status Upload(const std::string& name, const QuantizedWeight& weight);

  // The names and specs of the served weights, one string each, from every
  // page; a failed call fails the test.
  std::vector<std::string> List();

  grpc::Status Delete(const std::string& name);

  // C for fixed random activations (M = 3, f32), or "error: " and the status
  // text when the call fails.
  std::string Matmul(const std::string& name, int64_t k);

 private:
  std::unique_ptr<v1::NibbleService::Stub> stub_;
};

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_INTEGRATION_WEIGHT_CLIENT_H_
