// Requests built to exhaust nibbled rather than to be served, against a real
// nibbled: a gzip bomb, a message that inflates to far more than
// --max_message_bytes, sent to the health service, which needs no token.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"

namespace nibble {
namespace {

using ::nibble::testing::FreshDirectory;
using ::nibble::testing::PeakResidentBytes;
using ::nibble::testing::StartNibbledLoggingTo;

constexpr int kMaxMessageBytes = 1 << 20;
// gzip shrinks zeros about 1000-fold, so this bomb is about 128 KiB on the
// wire: well within kMaxMessageBytes, which gRPC compares with the
// compressed message.
constexpr int64_t kInflatedBytes = int64_t{128} << 20;
// What the server may grow by while it refuses the bomb: gRPC's buffers for
// the compressed message, far below what inflating it would take.
constexpr int64_t kMaxGrowthBytes = int64_t{32} << 20;

// Sends `inflated_bytes` zeros, gzip-compressed by the client, as a
// grpc.health.v1.Health/Check request; the status.
grpc::Status SendGzipBomb(const std::string& target, int64_t inflated_bytes) {
  grpc::GenericStub stub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_compression_algorithm(GRPC_COMPRESS_GZIP);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  grpc::ByteBuffer request;
  {
    const std::string zeros(inflated_bytes, '\0');
    grpc::Slice slice(zeros);
    request = grpc::ByteBuffer(&slice, 1);
  }
  grpc::ByteBuffer response;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(),
                 &request, &response, [&](grpc::Status result) {
                   status = std::move(result);
                   done.Notify();
                 });
  done.WaitForNotification();
  return status;
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::string& target) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  grpc::health::v1::HealthCheckResponse response;
  if (!health->Check(&context, {}, &response).ok()) {
    return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  }
  return response.status();
}

// A compressed request is refused before it is inflated: nibbled's peak
// memory stays far below the bomb's inflated size, the caller learns that
// compression is not accepted, and the server goes on serving.
TEST(HostileRequestsTest, GzipBombIsRefusedWithoutInflating) {
  const std::string log = FreshDirectory("gzip_bomb") + ".stderr";
  auto server = StartNibbledLoggingTo(
      NIBBLED_PATH, log,
      {absl::StrCat("--max_message_bytes=", kMaxMessageBytes)});
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string& target = (*server)->target();
  ASSERT_EQ(Health(target), grpc::health::v1::HealthCheckResponse::SERVING);
  const int64_t peak_before = PeakResidentBytes((*server)->pid());
  ASSERT_GT(peak_before, 0);

  const grpc::Status status = SendGzipBomb(target, kInflatedBytes);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED)
      << status.error_message();
  EXPECT_THAT(status.error_message(), ::testing::HasSubstr("gzip"));
  const int64_t growth = PeakResidentBytes((*server)->pid()) - peak_before;
  EXPECT_LT(growth, kMaxGrowthBytes)
      << "nibbled's peak memory grew by " << growth << " bytes for a bomb of "
      << kInflatedBytes << " bytes inflated";
  EXPECT_EQ(Health(target), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ((*server)->Stop(), 0);
}

}  // namespace
}  // namespace nibble
