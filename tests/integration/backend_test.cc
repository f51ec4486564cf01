// Starts real nibbled processes with each --backend: cuda without a GPU (or
// in a build without nvcc) and unknown backends are usage errors, auto
// serves on the CPU when there is no GPU; a --gpus list that does not parse
// is a usage error, and an upload asking for a GPU on the CPU backend is
// refused.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/upload_messages.h"

namespace nibble {
namespace {

using ::nibble::client::ToProto;
using ::testing::HasSubstr;

// nibbled on loopback with `flags`, stopped after 10 s at the latest: its
// exit status, its output in `output`.
int RunNibbled(absl::string_view flags, std::string* output) {
  return testing::RunCommand(absl::StrCat("timeout 10 ", NIBBLED_PATH,
                                          " --listen=127.0.0.1:0 ", flags),
                             output);
}

TEST(NibbledBackendTest, CudaWithoutAGpuIsAUsageErrorSayingWhatIsMissing) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  std::string output;
  EXPECT_EQ(RunNibbled("--backend=cuda", &output), 2) << output;
  EXPECT_THAT(output, HasSubstr("nibbled: --backend=cuda: "));
  EXPECT_THAT(output,
              HasSubstr(cuda::CompiledIn() ? "no GPU is visible to nibbled"
                                           : "this build has no CUDA backend"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("listening on")));
}

TEST(NibbledBackendTest, UnknownBackendIsAUsageError) {
  std::string output;
  EXPECT_EQ(RunNibbled("--backend=bogus", &output), 2) << output;
  EXPECT_THAT(output, HasSubstr("--backend: backend \"bogus\" is not one of "
                                "auto, cpu or cuda"));
}

TEST(NibbledBackendTest, AGpuListThatDoesNotParseIsAUsageError) {
  std::string output;
  EXPECT_EQ(RunNibbled("--gpus=0,x", &output), 2) << output;
  EXPECT_THAT(output, HasSubstr("--gpus=0,x: \"x\" is not a device ordinal"));
  EXPECT_THAT(output, ::testing::Not(HasSubstr("listening on")));
}

TEST(NibbledBackendTest, AnUploadAskingForAGpuOnTheCpuBackendIsRefused) {
  absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
      testing::NibbledProcess::Start(NIBBLED_PATH,
                                     {"--threads=2", "--backend=cpu"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::NibbleService::NewStub(grpc::CreateChannel(
      (*server)->target(), grpc::InsecureChannelCredentials()));
  const WeightSpec spec{WeightFormat::kU4b8, 128, 32, 64};
  std::vector<v1::UploadWeightRequest> messages =
      testing::UploadMessages("w", RandomQuantizedWeight(spec, 7));
  messages[0].mutable_header()->set_gpu(0);
  const grpc::Status status = testing::UploadWeight(*stub, messages);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("asks for GPU 0, but nibbled runs --backend=cpu"));
  // Without the field the same weight goes in.
  messages[0].mutable_header()->clear_gpu();
  EXPECT_TRUE(testing::UploadWeight(*stub, messages).ok());
  stub.reset();
  EXPECT_EQ((*server)->Stop(), 0);
}

TEST(NibbledBackendTest, AutoWithoutAGpuServesOnTheCpu) {
  if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
  absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
      testing::NibbledProcess::Start(NIBBLED_PATH,
                                     {"--threads=2", "--backend=auto"});
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_THAT((*server)->startup_line(), HasSubstr("(cpu backend, 2 threads"));
  auto stub = v1::NibbleService::NewStub(grpc::CreateChannel(
      (*server)->target(), grpc::InsecureChannelCredentials()));
  const WeightSpec spec{WeightFormat::kU4b8, 128, 32, 64};
  ASSERT_TRUE(
      testing::UploadWeight(*stub, "w", RandomQuantizedWeight(spec, 7)).ok());
  v1::MatmulRequest request;
  request.set_weight_name("w");
  request.set_m(1);
  request.set_dtype(ToProto(DType::kF32));
  request.set_a(std::string(spec.k * sizeof(float), '\0'));
  grpc::ClientContext context;
  v1::MatmulResponse response;
  const grpc::Status status = stub->Matmul(&context, request, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.c(), std::string(spec.n * sizeof(float), '\0'));
  // An open channel would hold nibbled for its shutdown grace period.
  stub.reset();
  EXPECT_EQ((*server)->Stop(), 0);
}

}  // namespace
}  // namespace nibble
