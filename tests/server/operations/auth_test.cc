#include "server/operations/auth.h"

#include <fstream>
#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace nibble::server {
namespace {

using ::testing::HasSubstr;

using Metadata = std::multimap<grpc::string_ref, grpc::string_ref>;

// Points into `value`, which must outlive the metadata.
Metadata WithAuthorization(const std::string& value) {
  Metadata metadata;
  metadata.emplace("authorization", value);
  return metadata;
}

TEST(TokenAuthenticatorTest, ParsesOneTokenPerLine) {
  absl::StatusOr<TokenAuthenticator> auth = TokenAuthenticator::FromText(
      "# operators\n  first-token  \n\nsecond.token\n", /*all_rpcs=*/false);
  ASSERT_TRUE(auth.ok()) << auth.status();
  for (const char* token : {"first-token", "second.token"}) {
    const std::string header = std::string("Bearer ") + token;
    EXPECT_TRUE(
        auth->Check(WithAuthorization(header), RpcAccess::kChangesWeights).ok())
        << token;
  }
}

TEST(TokenAuthenticatorTest, RefusesEmptyAndSpacedFiles) {
  EXPECT_THAT(
      TokenAuthenticator::FromText("# nothing\n\n", false).status().message(),
      HasSubstr("no token found"));
  EXPECT_THAT(
      TokenAuthenticator::FromText("two tokens\n", false).status().message(),
      HasSubstr("one token per line"));
  EXPECT_THAT(TokenAuthenticator::FromFile("/nonexistent/tokens", false)
                  .status()
                  .message(),
              HasSubstr("cannot read the token file: cannot open "
                        "/nonexistent/tokens: No such file or directory"));
}

TEST(TokenAuthenticatorTest, ReadsFromAFile) {
  const std::string path = ::testing::TempDir() + "/auth_test_tokens";
  std::ofstream(path) << "file-token\n";
  absl::StatusOr<TokenAuthenticator> auth =
      TokenAuthenticator::FromFile(path, false);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE(auth->Check(WithAuthorization("Bearer file-token"),
                          RpcAccess::kChangesWeights)
                  .ok());
}

TEST(TokenAuthenticatorTest, WeightChangesNeedTheRightToken) {
  absl::StatusOr<TokenAuthenticator> auth =
      TokenAuthenticator::FromText("s3cret\n", /*all_rpcs=*/false);
  ASSERT_TRUE(auth.ok());
  // string_ref keys and values point into these strings.
  const std::string kNoHeader;
  const struct {
    std::string header;
    const char* why;
  } kRefused[] = {
      {kNoHeader, "needs a bearer token"},
      {"s3cret", "must read \"Bearer TOKEN\""},
      {"Bearer s3cre", "not one this server accepts"},
      {"Bearer s3cret2", "not one this server accepts"},
      {"Bearer ", "not one this server accepts"},
  };
  for (const auto& [header, why] : kRefused) {
    const absl::Status status =
        auth->Check(header.empty() ? Metadata() : WithAuthorization(header),
                    RpcAccess::kChangesWeights);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << why;
    EXPECT_THAT(status.message(), HasSubstr(why));
  }
  // Reads stay open without --auth_all.
  EXPECT_TRUE(auth->Check(Metadata(), RpcAccess::kReadsOnly).ok());
}

// RFC 7235 makes the scheme case-insensitive; the token stays exact.
TEST(TokenAuthenticatorTest, TheSchemeIsCaseInsensitive) {
  absl::StatusOr<TokenAuthenticator> auth =
      TokenAuthenticator::FromText("s3cret\n", /*all_rpcs=*/false);
  ASSERT_TRUE(auth.ok());
  for (const char* header :
       {"Bearer s3cret", "bearer s3cret", "BEARER s3cret", "bEaReR s3cret"}) {
    EXPECT_TRUE(auth->CheckBearer(header).ok()) << header;
  }
  EXPECT_EQ(auth->CheckBearer("bearer S3CRET").code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(TokenAuthenticatorTest, AllRpcsNeedATokenWithAuthAll) {
  absl::StatusOr<TokenAuthenticator> auth =
      TokenAuthenticator::FromText("s3cret\n", /*all_rpcs=*/true);
  ASSERT_TRUE(auth.ok());
  EXPECT_EQ(auth->Check(Metadata(), RpcAccess::kReadsOnly).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(
      auth->Check(WithAuthorization("Bearer s3cret"), RpcAccess::kReadsOnly)
          .ok());
}

}  // namespace
}  // namespace nibble::server
