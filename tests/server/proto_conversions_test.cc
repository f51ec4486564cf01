#include "server/proto_conversions.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::EndsWith;
using ::testing::StartsWith;

TEST(ToGrpcStatusTest, KeepsTheCodeAndAShortMessage) {
  const grpc::Status status =
      ToGrpcStatus(absl::NotFoundError("no weight named \"w\""));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(status.error_message(), "no weight named \"w\"");
  EXPECT_TRUE(ToGrpcStatus(absl::OkStatus()).ok());
}

TEST(ToGrpcStatusTest, CutsALongMessageSayingHowMuch) {
  const std::string name(100'000, 'x');
  const std::string message = absl::StrCat("no weight named \"", name, "\"");
  const grpc::Status status = ToGrpcStatus(absl::NotFoundError(message));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_THAT(status.error_message(),
              StartsWith(message.substr(0, kMaxStatusMessageBytes)));
  EXPECT_THAT(
      status.error_message(),
      EndsWith(absl::StrCat("... (", message.size() - kMaxStatusMessageBytes,
                            " more bytes cut)")));
  EXPECT_LT(status.error_message().size(), kMaxStatusMessageBytes + 40);
}

}  // namespace
}  // namespace nibble::server
