// TLS, mutual TLS and bearer tokens against a real nibbled, through the
// `nibble` CLI and `nibble-load` with their matching flags. The certificates
// come from tests/testdata/tls/make_certs.sh.
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/metrics_scrape.h"
#include "tests/integration/nibbled_process.h"

namespace nibble {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string TestFile(const std::string& name) {
  return absl::StrCat(NIBBLE_TESTDATA_DIR, "/", name);
}

std::string TlsFile(const std::string& name) {
  return TestFile(absl::StrCat("tls/", name));
}

class SecurityTest : public ::testing::Test {
 protected:
  void StartServer(const std::vector<std::string>& args) {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, args);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Runs `nibble <args>` against the server; its exit code, output in
  // `output_`.
  int Cli(const std::string& args) {
    return testing::RunCommand(
        absl::StrCat(NIBBLE_CLI_PATH, " ", args,
                     " --target=", server_->target(), " --timeout=5s"),
        &output_);
  }

  std::string TokenFile(const std::string& token) {
    // A parameterized test's name holds a '/'.
    const std::string path = absl::StrCat(
        ::testing::TempDir(), "/token_",
        absl::StrReplaceAll(
            ::testing::UnitTest::GetInstance()->current_test_info()->name(),
            {{"/", "_"}}),
        "_", token.size());
    testing::RunCommand(absl::StrCat("printf '%s\\n' '", token, "' > ", path),
                        &output_);
    return path;
  }

  std::unique_ptr<testing::NibbledProcess> server_;
  std::string output_;
};

constexpr char kUpload[] =
    "upload --name=w --format=u4b8 --k=256 --n=64 --group=128 --random=1";

TEST_F(SecurityTest, TlsServerTalksTlsOnly) {
  StartServer({absl::StrCat("--tls_cert=", TlsFile("server.pem")),
               absl::StrCat("--tls_key=", TlsFile("server.key"))});
  const std::string tls = absl::StrCat(" --tls_ca=", TlsFile("ca.pem"));
  EXPECT_EQ(Cli(absl::StrCat(kUpload, tls)), 0) << output_;
  EXPECT_EQ(Cli(absl::StrCat("list", tls)), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("w"));
  EXPECT_EQ(Cli("list"), 1) << output_;
  EXPECT_THAT(output_, HasSubstr("UNAVAILABLE"));
  // A CA that did not sign the server's certificate.
  EXPECT_EQ(Cli(absl::StrCat("list --tls_ca=", TlsFile("other_ca.pem"))), 1)
      << output_;
}

TEST_F(SecurityTest, MutualTlsRefusesClientsWithoutATrustedCertificate) {
  StartServer({absl::StrCat("--tls_cert=", TlsFile("server.pem")),
               absl::StrCat("--tls_key=", TlsFile("server.key")),
               absl::StrCat("--tls_client_ca=", TlsFile("ca.pem"))});
  const std::string ca = absl::StrCat(" --tls_ca=", TlsFile("ca.pem"));
  EXPECT_EQ(Cli(absl::StrCat("list", ca, " --tls_cert=", TlsFile("client.pem"),
                             " --tls_key=", TlsFile("client.key"))),
            0)
      << output_;
  EXPECT_EQ(Cli(absl::StrCat("list", ca)), 1) << output_;
  EXPECT_EQ(
      Cli(absl::StrCat("list", ca, " --tls_cert=", TlsFile("rogue_client.pem"),
                       " --tls_key=", TlsFile("rogue_client.key"))),
      1)
      << output_;
}

TEST_F(SecurityTest, AuthWritesOnlyGuardsWeightChangesOnly) {
  const std::string tokens = TokenFile("s3cret-token");
  ASSERT_NO_FATAL_FAILURE(StartServer(
      {absl::StrCat("--auth_token_file=", tokens), "--auth_writes_only"}));
  EXPECT_EQ(Cli(kUpload), 1) << output_;
  EXPECT_THAT(output_, HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(Cli(absl::StrCat(kUpload,
                             " --auth_token_file=", TokenFile("wrong-token"))),
            1)
      << output_;
  EXPECT_THAT(output_, HasSubstr("not one this server accepts"));
  EXPECT_EQ(Cli(absl::StrCat(kUpload, " --auth_token_file=", tokens)), 0)
      << output_;
  // Reads and health stay open.
  EXPECT_EQ(Cli("list"), 0) << output_;
  EXPECT_EQ(Cli("matmul --name=w --m=1 --dtype=f32 --random_input=2"), 0)
      << output_;
  EXPECT_EQ(Cli("delete --name=w"), 1) << output_;
  EXPECT_EQ(Cli(absl::StrCat("delete --name=w --auth_token_file=", tokens)), 0)
      << output_;
}

// RFC 7235: the scheme is case-insensitive, so "bearer" and "BEARER" work;
// the token itself is not. Through the generated stub, with the header as a
// client library of any language would send it.
TEST_F(SecurityTest, TheBearerSchemeIsCaseInsensitive) {
  ASSERT_NO_FATAL_FAILURE(StartServer(
      {absl::StrCat("--auth_token_file=", TokenFile("case-token"))}));
  auto stub = v1::NibbleService::NewStub(grpc::CreateChannel(
      server_->target(), grpc::InsecureChannelCredentials()));
  const auto list = [&](const std::string& authorization) {
    grpc::ClientContext context;
    context.AddMetadata("authorization", authorization);
    v1::ListWeightsResponse response;
    return stub->ListWeights(&context, v1::ListWeightsRequest(), &response);
  };
  for (const char* scheme : {"Bearer", "bearer", "BEARER"}) {
    const grpc::Status status = list(absl::StrCat(scheme, " case-token"));
    EXPECT_TRUE(status.ok()) << scheme << ": " << status.error_message();
  }
  EXPECT_EQ(list("bearer CASE-TOKEN").error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
}

// With a token file every call needs the token, matmuls included, since a
// matmul with A = I reads the weight back; health stays open for probes.
// --auth_all, the old way to ask for this, is still accepted.
class TokenFileTest : public SecurityTest,
                      public ::testing::WithParamInterface<bool> {};

TEST_P(TokenFileTest, GuardsEveryCallButHealth) {
  const bool auth_all = GetParam();
  const std::string tokens = TokenFile("all-token");
  std::vector<std::string> args = {absl::StrCat("--auth_token_file=", tokens)};
  if (auth_all) args.push_back("--auth_all");
  ASSERT_NO_FATAL_FAILURE(StartServer(args));
  const std::string token = absl::StrCat(" --auth_token_file=", tokens);
  ASSERT_EQ(Cli(absl::StrCat(kUpload, token)), 0) << output_;
  for (const char* call :
       {"list", "get --name=w",
        "matmul --name=w --m=1 --dtype=f32 --random_input=2"}) {
    SCOPED_TRACE(call);
    EXPECT_EQ(Cli(call), 1) << output_;
    EXPECT_THAT(output_, HasSubstr("UNAUTHENTICATED"));
    EXPECT_EQ(Cli(absl::StrCat(call, token)), 0) << output_;
  }
  EXPECT_EQ(Cli("health"), 0) << output_;
  for (const char* api : {"Matmul", "MatmulStream", "ModelInfer"}) {
    SCOPED_TRACE(api);
    EXPECT_NE(testing::RunCommand(
                  absl::StrCat(NIBBLE_LOAD_PATH, " --target=",
                               server_->target(), " --name=w --api=", api,
                               " --concurrency=1 --duration=0.3 --warmup=0"),
                  &output_),
              0);
    EXPECT_EQ(testing::RunCommand(
                  absl::StrCat(NIBBLE_LOAD_PATH, " --target=",
                               server_->target(), " --name=w --api=", api,
                               " --concurrency=2 --duration=0.3 --warmup=0 "
                               "--verify=1 --random=1",
                               token),
                  &output_),
              0)
        << output_;
    EXPECT_THAT(output_, HasSubstr("errors:      none"));
  }
}

INSTANTIATE_TEST_SUITE_P(AuthAll, TokenFileTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "WithAuthAll" : "ByDefault";
                         });

// --metrics_auth_token_file guards GET /metrics with its own tokens, apart
// from those of the gRPC calls.
TEST_F(SecurityTest, MetricsTokenGuardsScrapes) {
  ASSERT_NO_FATAL_FAILURE(StartServer(
      {"--metrics_listen=127.0.0.1:0",
       absl::StrCat("--metrics_auth_token_file=", TokenFile("scrape"))}));
  httplib::Client http("127.0.0.1",
                       testing::MetricsPort(server_->startup_line()));
  httplib::Result refused = http.Get("/metrics");
  ASSERT_TRUE(refused) << httplib::to_string(refused.error());
  EXPECT_EQ(refused->status, 401);
  EXPECT_THAT(refused->body, HasSubstr("GET /metrics needs a bearer token"));
  httplib::Result scraped =
      http.Get("/metrics", {{"Authorization", "Bearer scrape"}});
  ASSERT_TRUE(scraped) << httplib::to_string(scraped.error());
  EXPECT_EQ(scraped->status, 200);
  EXPECT_THAT(scraped->body, HasSubstr("nibble_serving 1"));
  // The gRPC side needs no token without --auth_token_file.
  EXPECT_EQ(Cli("list"), 0) << output_;
}

// --metrics_weight_labels=false keeps weight names out of /metrics, and
// counts the matmuls of all weights in one series.
TEST_F(SecurityTest, MetricsWithoutWeightLabelsNameNoWeight) {
  ASSERT_NO_FATAL_FAILURE(StartServer(
      {"--metrics_listen=127.0.0.1:0", "--metrics_weight_labels=false"}));
  ASSERT_EQ(Cli(kUpload), 0) << output_;
  ASSERT_EQ(Cli("matmul --name=w --m=3 --dtype=f32 --random_input=2"), 0)
      << output_;
  const int port = testing::MetricsPort(server_->startup_line());
  EXPECT_EQ(testing::ScrapeSample(port, "nibble_matmul_rows_total"), 3);
  httplib::Client http("127.0.0.1", port);
  httplib::Result scraped = http.Get("/metrics");
  ASSERT_TRUE(scraped) << httplib::to_string(scraped.error());
  EXPECT_THAT(scraped->body, Not(HasSubstr("weight=")));
  EXPECT_THAT(scraped->body, Not(HasSubstr("\"w\"")));
}

TEST_F(SecurityTest, BadSecurityFlagsStopTheServerAtOnce) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{
            absl::StrCat("--tls_cert=", TlsFile("server.pem"))},
        std::vector<std::string>{"--tls_cert=/nonexistent.pem",
                                 "--tls_key=/nonexistent.key"},
        std::vector<std::string>{
            absl::StrCat("--tls_client_ca=", TlsFile("ca.pem"))},
        std::vector<std::string>{"--auth_all"},
        std::vector<std::string>{"--auth_writes_only"},
        std::vector<std::string>{
            absl::StrCat("--auth_token_file=", TokenFile("token")),
            "--auth_all", "--auth_writes_only"},
        std::vector<std::string>{"--auth_token_file=/nonexistent"},
        std::vector<std::string>{
            absl::StrCat("--metrics_auth_token_file=", TokenFile("token"))},
        std::vector<std::string>{"--metrics_listen=127.0.0.1:0",
                                 "--metrics_auth_token_file=/nonexistent"}}) {
    SCOPED_TRACE(args[0]);
    EXPECT_FALSE(testing::NibbledProcess::Start(NIBBLED_PATH, args).ok());
  }
}

}  // namespace
}  // namespace nibble
