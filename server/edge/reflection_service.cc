#include "server/edge/reflection_service.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "grpc/reflection/v1/reflection.grpc.pb.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"
#include "grpcpp/impl/server_initializer.h"

namespace nibble::server {
namespace {

namespace v1 = ::grpc::reflection::v1;
using ::google::protobuf::Descriptor;
using ::google::protobuf::DescriptorPool;
using ::google::protobuf::FieldDescriptor;
using ::google::protobuf::FileDescriptor;

// An answer that the stream carries in place of the one asked for.
void SetError(grpc::StatusCode code, std::string message,
              v1::ServerReflectionResponse* response) {
  v1::ErrorResponse* error = response->mutable_error_response();
  error->set_error_code(static_cast<int32_t>(code));
  error->set_error_message(std::move(message));
}

// `file` and every file it imports, directly or not, each once, as
// serialized FileDescriptorProtos: what a client needs to build the file's
// descriptors.
void AddFileWithImports(const FileDescriptor* file,
                        absl::flat_hash_set<const FileDescriptor*>& added,
                        v1::FileDescriptorResponse* response) {
  if (!added.insert(file).second) return;
  google::protobuf::FileDescriptorProto proto;
  file->CopyTo(&proto);
  proto.SerializeToString(response->add_file_descriptor_proto());
  for (int i = 0; i < file->dependency_count(); ++i) {
    AddFileWithImports(file->dependency(i), added, response);
  }
}

void SetFile(const FileDescriptor* file, absl::string_view not_found,
             v1::ServerReflectionResponse* response) {
  if (file == nullptr) {
    SetError(grpc::StatusCode::NOT_FOUND,
             absl::StrCat(not_found,
                          "; list_services names the services served here"),
             response);
    return;
  }
  absl::flat_hash_set<const FileDescriptor*> added;
  AddFileWithImports(file, added, response->mutable_file_descriptor_response());
}

class ReflectionService final : public v1::ServerReflection::CallbackService {
 public:
  // Given once the server is built, before or after its first calls.
  void SetServices(std::vector<std::string> services) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    services_ = std::move(services);
  }

  grpc::ServerBidiReactor<v1::ServerReflectionRequest,
                          v1::ServerReflectionResponse>*
  ServerReflectionInfo(grpc::CallbackServerContext* /*context*/) override {
    return new Reactor(this);
  }

 private:
  // Answers one request after the other until the client half-closes.
  class Reactor final
      : public grpc::ServerBidiReactor<v1::ServerReflectionRequest,
                                       v1::ServerReflectionResponse> {
   public:
    explicit Reactor(const ReflectionService* service) : service_(service) {
      StartRead(&request_);
    }

    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status::OK);
        return;
      }
      response_ = service_->Answer(request_);
      StartWrite(&response_);
    }

    void OnWriteDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                            "the client stopped reading"));
        return;
      }
      StartRead(&request_);
    }

    void OnDone() override { delete this; }

   private:
    const ReflectionService* const service_;
    v1::ServerReflectionRequest request_;
    v1::ServerReflectionResponse response_;
  };

  v1::ServerReflectionResponse Answer(
      const v1::ServerReflectionRequest& request) const
      ABSL_LOCKS_EXCLUDED(mu_) {
    const DescriptorPool* pool = DescriptorPool::generated_pool();
    v1::ServerReflectionResponse response;
    response.set_valid_host(request.host());
    *response.mutable_original_request() = request;
    switch (request.message_request_case()) {
      case v1::ServerReflectionRequest::kListServices: {
        absl::MutexLock lock(&mu_);
        for (const std::string& service : services_) {
          response.mutable_list_services_response()->add_service()->set_name(
              service);
        }
        break;
      }
      case v1::ServerReflectionRequest::kFileByFilename:
        SetFile(
            pool->FindFileByName(request.file_by_filename()),
            absl::StrCat("no file named \"", request.file_by_filename(), "\""),
            &response);
        break;
      case v1::ServerReflectionRequest::kFileContainingSymbol:
        SetFile(
            pool->FindFileContainingSymbol(request.file_containing_symbol()),
            absl::StrCat("no symbol named \"", request.file_containing_symbol(),
                         "\" (give its full name, package included)"),
            &response);
        break;
      case v1::ServerReflectionRequest::kFileContainingExtension: {
        const v1::ExtensionRequest& wanted =
            request.file_containing_extension();
        const Descriptor* type =
            pool->FindMessageTypeByName(wanted.containing_type());
        const FieldDescriptor* extension =
            type == nullptr
                ? nullptr
                : pool->FindExtensionByNumber(type, wanted.extension_number());
        SetFile(extension == nullptr ? nullptr : extension->file(),
                absl::StrCat("no extension ", wanted.extension_number(),
                             " of message \"", wanted.containing_type(), "\""),
                &response);
        break;
      }
      case v1::ServerReflectionRequest::kAllExtensionNumbersOfType: {
        const Descriptor* type = pool->FindMessageTypeByName(
            request.all_extension_numbers_of_type());
        if (type == nullptr) {
          SetError(grpc::StatusCode::NOT_FOUND,
                   absl::StrCat("no message named \"",
                                request.all_extension_numbers_of_type(),
                                "\" (give its full name, package included)"),
                   &response);
          break;
        }
        v1::ExtensionNumberResponse* numbers =
            response.mutable_all_extension_numbers_response();
        numbers->set_base_type_name(type->full_name());
        std::vector<const FieldDescriptor*> extensions;
        pool->FindAllExtensions(type, &extensions);
        for (const FieldDescriptor* extension : extensions) {
          numbers->add_extension_number(extension->number());
        }
        break;
      }
      case v1::ServerReflectionRequest::MESSAGE_REQUEST_NOT_SET:
        SetError(grpc::StatusCode::INVALID_ARGUMENT,
                 "the request asks nothing: set one of list_services, "
                 "file_by_filename, file_containing_symbol, "
                 "file_containing_extension or all_extension_numbers_of_type",
                 &response);
        break;
    }
    return response;
  }

  mutable absl::Mutex mu_;
  std::vector<std::string> services_ ABSL_GUARDED_BY(mu_);
};

// Registers the service when the server is created, and gives it the
// server's services once every one is registered.
class ReflectionPlugin final : public grpc::ServerBuilderPlugin {
 public:
  std::string name() override { return "nibble_reflection_v1"; }
  void InitServer(grpc::ServerInitializer* server) override {
    server->RegisterService(service_);
  }
  void Finish(grpc::ServerInitializer* server) override {
    service_->SetServices(*server->GetServiceList());
  }
  void ChangeArguments(const std::string& /*name*/, void* /*value*/) override {}

 private:
  const std::shared_ptr<ReflectionService> service_ =
      std::make_shared<ReflectionService>();
};

// How a builder takes a plugin of its own, rather than one for every builder
// in the process.
class ReflectionOption final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments* /*arguments*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>*
                         plugins) override {
    plugins->push_back(std::make_unique<ReflectionPlugin>());
  }
};

}  // namespace

void AddReflectionV1(grpc::ServerBuilder& builder) {
  builder.SetOption(std::make_unique<ReflectionOption>());
}

}  // namespace nibble::server
