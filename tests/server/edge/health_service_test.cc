// HealthService on an in-process gRPC server, through the stub generated
// from grpc.health.v1: Check and Watch follow SetServing, unknown names are
// NOT_FOUND or SERVICE_UNKNOWN, and Shutdown ends every Watch, open or
// later, once it has sent NOT_SERVING.
#include "server/edge/health_service.h"

#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

class HealthServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(&health_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }
  void TearDown() override { server_->Shutdown(); }

  grpc::Status Check(const std::string& service,
                     HealthCheckResponse* response) {
    grpc::ClientContext context;
    HealthCheckRequest request;
    request.set_service(service);
    return stub_->Check(&context, request, response);
  }

  HealthService health_{{"nibble.v1.NibbleService"}};
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<grpc::health::v1::Health::Stub> stub_;
};

TEST_F(HealthServiceTest, CheckFollowsSetServing) {
  HealthCheckResponse response;
  ASSERT_TRUE(Check("", &response).ok());
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  health_.SetServing(true);
  for (const char* service : {"", "nibble.v1.NibbleService"}) {
    ASSERT_TRUE(Check(service, &response).ok()) << service;
    EXPECT_EQ(response.status(), HealthCheckResponse::SERVING) << service;
  }
  const grpc::Status unknown = Check("nibble.v2.NibbleService", &response);
  EXPECT_EQ(unknown.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(unknown.error_message(),
              HasSubstr("service name unknown: ask about \"\" (the server) or "
                        "\"nibble.v1.NibbleService\""));
}

TEST_F(HealthServiceTest, WatchHearsEveryChangeAndShutdownEndsIt) {
  grpc::ClientContext context;
  HealthCheckRequest request;
  request.set_service("nibble.v1.NibbleService");
  auto watch = stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  health_.SetServing(true);
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVING);
  health_.Shutdown();
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(watch->Read(&response));
  EXPECT_TRUE(watch->Finish().ok());

  // Later changes are ignored, and a later Watch ends after its first answer.
  health_.SetServing(true);
  grpc::ClientContext later_context;
  auto later = stub_->Watch(&later_context, HealthCheckRequest());
  ASSERT_TRUE(later->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::NOT_SERVING);
  EXPECT_FALSE(later->Read(&response));
  EXPECT_TRUE(later->Finish().ok());
}

TEST_F(HealthServiceTest, WatchOfAnUnknownNameHearsServiceUnknown) {
  grpc::ClientContext context;
  HealthCheckRequest request;
  request.set_service("nibble.v2.NibbleService");
  auto watch = stub_->Watch(&context, request);
  HealthCheckResponse response;
  ASSERT_TRUE(watch->Read(&response));
  EXPECT_EQ(response.status(), HealthCheckResponse::SERVICE_UNKNOWN);
  context.TryCancel();
  EXPECT_FALSE(watch->Read(&response));
  EXPECT_EQ(watch->Finish().error_code(), grpc::StatusCode::CANCELLED);
}

}  // namespace
}  // namespace nibble::server
