#include "server/proto_conversions.h"

#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::EndsWith;
using ::testing::HasSubstr;
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

TEST(ListPageFromProtoTest, DefaultsClampsAndContinuesAfterTheToken) {
  v1::ListWeightsRequest request;
  absl::StatusOr<ListPageRequest> page = ListPageFromProto(request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->size, kDefaultListPageSize);
  EXPECT_EQ(page->after, "");

  request.set_page_size(7);
  request.set_page_token("layer.3.q_proj");
  page = ListPageFromProto(request);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->size, 7);
  EXPECT_EQ(page->after, "layer.3.q_proj");

  request.set_page_size(1 << 30);
  EXPECT_EQ(ListPageFromProto(request)->size, kMaxListPageSize);
}

TEST(ListPageFromProtoTest, NegativeSizeOrForeignTokenIsInvalid) {
  v1::ListWeightsRequest request;
  request.set_page_size(-1);
  EXPECT_EQ(ListPageFromProto(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ListPageFromProto(request).status().message(),
              HasSubstr("page_size is -1"));
  request.set_page_size(0);
  for (const char* token : {"../x", "a b", ".hidden"}) {
    request.set_page_token(token);
    EXPECT_THAT(ListPageFromProto(request).status().message(),
                HasSubstr("page_token is not one that ListWeights returned"))
        << token;
  }
}

}  // namespace
}  // namespace nibble::server
