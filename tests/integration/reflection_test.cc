// Asks a real nibbled what it serves through server reflection, as grpcurl
// does, with clients built only from the reflection protocol's messages:
// grpc.reflection.v1alpha (served by gRPC) and grpc.reflection.v1 (served by
// nibble). Each lists the services, and describes every one it lists from
// the descriptors it sends.
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "gmock/gmock.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/descriptor_database.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "reflection_subset.grpc.pb.h"
#include "tests/integration/nibbled_process.h"

namespace nibble {
namespace {

using ::testing::IsSupersetOf;

// A version of the protocol: the same messages in its own package.
template <typename ServiceT, typename RequestT, typename ResponseT>
struct Protocol {
  using Service = ServiceT;
  using Request = RequestT;
  using Response = ResponseT;
};
using V1Alpha = Protocol<grpc::reflection::v1alpha::ServerReflection,
                         grpc::reflection::v1alpha::ServerReflectionRequest,
                         grpc::reflection::v1alpha::ServerReflectionResponse>;
using V1 = Protocol<grpc::reflection::v1::ServerReflection,
                    grpc::reflection::v1::ServerReflectionRequest,
                    grpc::reflection::v1::ServerReflectionResponse>;

class ProtocolNames {
 public:
  template <typename T>
  static std::string GetName(int) {
    return std::is_same_v<T, V1> ? "v1" : "v1alpha";
  }
};

template <typename P>
class ReflectionTest : public ::testing::Test {
 protected:
  using Request = typename P::Request;
  using Response = typename P::Response;

  static void SetUpTestSuite() {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, {"--threads=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = server->release();
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(server_->Stop(), 0) << "nibbled did not exit cleanly";
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr); }

  // Sends `requests` on one stream, as a tool does, and returns the answers.
  std::vector<Response> Ask(const std::vector<Request>& requests) {
    auto stub = P::Service::NewStub(grpc::CreateChannel(
        server_->target(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext context;
    auto stream = stub->ServerReflectionInfo(&context);
    std::vector<Response> answers;
    for (const Request& request : requests) {
      Response response;
      if (!stream->Write(request) || !stream->Read(&response)) break;
      answers.push_back(response);
    }
    stream->WritesDone();
    const grpc::Status status = stream->Finish();
    EXPECT_TRUE(status.ok()) << status.error_message();
    return answers;
  }

  std::vector<std::string> ListServices() {
    Request request;
    request.set_list_services("");
    const std::vector<Response> answers = Ask({request});
    std::vector<std::string> services;
    if (answers.empty()) return services;
    for (const auto& service : answers[0].list_services_response().service()) {
      services.push_back(service.name());
    }
    return services;
  }

  static testing::NibbledProcess* server_;
};

template <typename P>
testing::NibbledProcess* ReflectionTest<P>::server_ = nullptr;

using BothVersions = ::testing::Types<V1Alpha, V1>;
TYPED_TEST_SUITE(ReflectionTest, BothVersions, ProtocolNames);

TYPED_TEST(ReflectionTest, DescribesEveryServiceItLists) {
  using Request = typename TypeParam::Request;
  const std::vector<std::string> services = this->ListServices();
  EXPECT_THAT(
      services,
      IsSupersetOf({"nibble.v1.NibbleService", "inference.GRPCInferenceService",
                    "grpc.health.v1.Health",
                    "grpc.reflection.v1alpha.ServerReflection",
                    "grpc.reflection.v1.ServerReflection"}));

  // By symbol, on one stream: a file already sent on it may be left out of
  // later answers, so the files of all answers make one database.
  std::vector<Request> by_symbol;
  for (const std::string& service : services) {
    by_symbol.emplace_back().set_file_containing_symbol(service);
  }
  const auto answers = this->Ask(by_symbol);
  ASSERT_EQ(answers.size(), services.size());
  google::protobuf::SimpleDescriptorDatabase files;
  absl::flat_hash_set<std::string> file_names;
  for (size_t i = 0; i < services.size(); ++i) {
    ASSERT_TRUE(answers[i].has_file_descriptor_response())
        << services[i] << ": " << answers[i].error_response().error_message();
    for (const std::string& bytes :
         answers[i].file_descriptor_response().file_descriptor_proto()) {
      google::protobuf::FileDescriptorProto file;
      ASSERT_TRUE(file.ParseFromString(bytes)) << services[i];
      if (file_names.insert(file.name()).second) {
        ASSERT_TRUE(files.Add(file)) << file.name();
      }
    }
  }
  google::protobuf::DescriptorPool pool(&files);
  std::vector<Request> by_file_name;
  for (const std::string& service : services) {
    const google::protobuf::ServiceDescriptor* descriptor =
        pool.FindServiceByName(service);
    ASSERT_NE(descriptor, nullptr) << service << " cannot be described";
    EXPECT_GT(descriptor->method_count(), 0) << service;
    by_file_name.emplace_back().set_file_by_filename(
        descriptor->file()->name());
  }

  // By file name, as `grpcurl describe` also asks.
  const auto files_answers = this->Ask(by_file_name);
  ASSERT_EQ(files_answers.size(), by_file_name.size());
  for (size_t i = 0; i < by_file_name.size(); ++i) {
    EXPECT_TRUE(files_answers[i].has_file_descriptor_response())
        << by_file_name[i].file_by_filename() << ": "
        << files_answers[i].error_response().error_message();
  }
}

TYPED_TEST(ReflectionTest, AnUnknownSymbolIsNotFoundAndTheStreamGoesOn) {
  using Request = typename TypeParam::Request;
  std::vector<Request> requests(2);
  requests[0].set_file_containing_symbol("nibble.v1.NoSuchService");
  requests[1].set_file_containing_symbol("nibble.v1.NibbleService");
  const auto answers = this->Ask(requests);
  ASSERT_EQ(answers.size(), 2u);
  EXPECT_EQ(answers[0].error_response().error_code(),
            static_cast<int>(grpc::StatusCode::NOT_FOUND));
  EXPECT_TRUE(answers[1].has_file_descriptor_response());
}

}  // namespace
}  // namespace nibble
