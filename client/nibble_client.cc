#include "client/nibble_client.h"

#include <algorithm>
#include <bit>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/proto_conversions.h"
#include "client/upload_message.h"
#include "grpc/grpc.h"
#include "grpcpp/completion_queue.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/support/client_interceptor.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/status.h"

namespace nibble {
namespace {

// The canonical layout is little-endian; tensors are sent as their host bytes.
static_assert(std::endian::native == std::endian::little);

absl::Status ToAbslStatus(const grpc::Status& status) {
  // gRPC and absl share the canonical status code numbering.
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

// Adds the bearer token to the metadata of every call. Call credentials would
// do it too, but gRPC sends those over TLS only, and a token on a loopback or
// in-cluster plain connection is still worth checking.
class BearerTokenInterceptor final : public grpc::experimental::Interceptor {
 public:
  explicit BearerTokenInterceptor(const std::string* header)
      : header_(header) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::
                PRE_SEND_INITIAL_METADATA)) {
      methods->GetSendInitialMetadata()->emplace("authorization", *header_);
    }
    methods->Proceed();
  }

 private:
  const std::string* header_;
};

class BearerTokenInterceptorFactory final
    : public grpc::experimental::ClientInterceptorFactoryInterface {
 public:
  explicit BearerTokenInterceptorFactory(absl::string_view token)
      : header_(absl::StrCat("Bearer ", token)) {}

  grpc::experimental::Interceptor* CreateClientInterceptor(
      grpc::experimental::ClientRpcInfo*) override {
    return new BearerTokenInterceptor(&header_);
  }

 private:
  // Lives as long as the channel, which owns the factory.
  const std::string header_;
};

}  // namespace

grpc::ChannelArguments DefaultChannelArguments() {
  grpc::ChannelArguments arguments;
  arguments.SetMaxReceiveMessageSize(-1);
  return arguments;
}

std::shared_ptr<grpc::Channel> CreateChannel(
    absl::string_view target, const ConnectionOptions& connection,
    const grpc::ChannelArguments& arguments) {
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::InsecureChannelCredentials();
  if (connection.tls) {
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs = connection.tls_ca;
    tls.pem_cert_chain = connection.tls_cert;
    tls.pem_private_key = connection.tls_key;
    credentials = grpc::SslCredentials(tls);
  }
  std::vector<
      std::unique_ptr<grpc::experimental::ClientInterceptorFactoryInterface>>
      interceptors;
  if (!connection.auth_token.empty()) {
    interceptors.push_back(
        std::make_unique<BearerTokenInterceptorFactory>(connection.auth_token));
  }
  return grpc::experimental::CreateCustomChannelWithInterceptors(
      std::string(target), credentials, arguments, std::move(interceptors));
}

std::vector<std::shared_ptr<grpc::Channel>> CreateChannels(
    absl::string_view target, const ConnectionOptions& connection, int count) {
  grpc::ChannelArguments arguments = DefaultChannelArguments();
  arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < count; ++i) {
    channels.push_back(CreateChannel(target, connection, arguments));
  }
  return channels;
}

NibbleClient::NibbleClient(std::shared_ptr<grpc::Channel> channel,
                           absl::Duration timeout)
    : NibbleClient(std::vector<std::shared_ptr<grpc::Channel>>{channel},
                   timeout) {}

NibbleClient::NibbleClient(std::vector<std::shared_ptr<grpc::Channel>> channels,
                           absl::Duration timeout)
    : nibble_stub_(v1::NibbleService::NewStub(channels.front())),
      health_stub_(grpc::health::v1::Health::NewStub(channels.front())),
      uploads_in_flight_(channels.size(), 0),
      timeout_(timeout) {
  for (const std::shared_ptr<grpc::Channel>& channel : channels) {
    upload_stubs_.push_back(std::make_unique<grpc::GenericStub>(channel));
  }
}

size_t NibbleClient::StartUpload(const std::vector<bool>& tried) {
  absl::MutexLock lock(&upload_mutex_);
  size_t stub = tried.size();
  for (size_t i = 0; i < tried.size(); ++i) {
    if (!tried[i] && (stub == tried.size() ||
                      uploads_in_flight_[i] < uploads_in_flight_[stub])) {
      stub = i;
    }
  }
  ++uploads_in_flight_[stub];
  return stub;
}

void NibbleClient::EndUpload(size_t stub) {
  absl::MutexLock lock(&upload_mutex_);
  --uploads_in_flight_[stub];
}

void NibbleClient::PrepareContext(grpc::ClientContext& context) const {
  if (timeout_ != absl::InfiniteDuration()) {
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout_));
  }
}

absl::StatusOr<v1::WeightInfo> NibbleClient::Upload(
    const QuantizedWeight& weight, absl::string_view name,
    std::optional<int> gpu) {
  if (absl::Status status = weight.Validate(); !status.ok()) return status;
  return UploadBytes(BytesOf(weight), name, gpu);
}

absl::StatusOr<v1::WeightInfo> NibbleClient::UploadBytes(
    const WeightBytes& weight, absl::string_view name, std::optional<int> gpu) {
  if (absl::Status status = weight.CheckSizes(); !status.ok()) return status;
  v1::UploadWeightRequest header;
  client::FillWeightHeader(name, weight.spec, weight.activation_order,
                           header.mutable_header());
  header.mutable_header()->set_code_layout(client::ToProto(weight.layout));
  if (gpu.has_value()) header.mutable_header()->set_gpu(*gpu);
  return SendUpload(header, {{v1::WEIGHT_TENSOR_QWEIGHT, weight.qweight},
                             {v1::WEIGHT_TENSOR_SCALES, weight.scales},
                             {v1::WEIGHT_TENSOR_ZEROS, weight.zeros}});
}

absl::StatusOr<v1::WeightInfo> NibbleClient::SendUpload(
    const v1::UploadWeightRequest& header,
    absl::Span<const std::pair<v1::WeightTensor, absl::string_view>> tensors) {
  std::vector<bool> tried(upload_stubs_.size(), false);
  while (true) {
    const size_t stub = StartUpload(tried);
    tried[stub] = true;
    bool header_sent = false;
    absl::StatusOr<v1::WeightInfo> info =
        SendUploadOver(*upload_stubs_[stub], header, tensors, header_sent);
    EndUpload(stub);
    // Without its header the server never saw the upload, so it may go over
    // a connection not yet tried: one that failed to open must not fail an
    // import that its other connections could carry.
    if (info.ok() || header_sent ||
        info.status().code() != absl::StatusCode::kUnavailable ||
        std::find(tried.begin(), tried.end(), false) == tried.end()) {
      return info;
    }
  }
}

absl::StatusOr<v1::WeightInfo> NibbleClient::SendUploadOver(
    grpc::GenericStub& stub, const v1::UploadWeightRequest& header,
    absl::Span<const std::pair<v1::WeightTensor, absl::string_view>> tensors,
    bool& header_sent) {
  grpc::ClientContext context;
  PrepareContext(context);
  grpc::CompletionQueue queue;
  // Waits for the one operation in flight; false once the stream is broken,
  // after which Finish() reports why.
  const auto completes = [&queue] {
    void* tag;
    bool ok = false;
    return queue.Next(&tag, &ok) && ok;
  };
  std::unique_ptr<grpc::GenericClientAsyncReaderWriter> call =
      stub.PrepareCall(&context,
                       absl::StrCat("/", v1::NibbleService::service_full_name(),
                                    "/UploadWeight"),
                       &queue);
  call->StartCall(nullptr);
  bool stream_open = completes();

  if (stream_open) {
    call->Write(SerializedMessage(header), nullptr);
    stream_open = completes();
    header_sent = stream_open;
  }
  for (const auto& [tensor, bytes] : tensors) {
    for (size_t offset = 0; stream_open && offset < bytes.size();
         offset += kMaxUploadChunkBytes) {
      // The tensors outlive the call, so the chunk may refer to their bytes.
      call->Write(
          UploadChunkMessage(tensor, offset,
                             bytes.substr(offset, kMaxUploadChunkBytes)),
          nullptr);
      stream_open = completes();
    }
  }
  if (stream_open) {
    call->WritesDone(nullptr);
    completes();
  }
  grpc::ByteBuffer reply;
  call->Read(&reply, nullptr);
  const bool replied = completes();
  grpc::Status status;
  call->Finish(&status, nullptr);
  completes();
  queue.Shutdown();
  if (!status.ok()) return ToAbslStatus(status);
  v1::WeightInfo info;
  grpc::ProtoBufferReader reader(&reply);
  if (!replied || !info.ParseFromZeroCopyStream(&reader)) {
    return absl::InternalError(
        "the server accepted the upload but its reply is no WeightInfo");
  }
  return info;
}

absl::StatusOr<v1::MatmulResponse> NibbleClient::Matmul(
    absl::string_view name, int64_t m, DType dtype, absl::string_view a,
    std::optional<ActivationPrecision> precision) {
  v1::MatmulRequest request;
  request.set_weight_name(std::string(name));
  request.set_m(m);
  request.set_dtype(client::ToProto(dtype));
  request.set_a(std::string(a));
  if (precision.has_value()) {
    request.set_activation_precision(client::ToProto(*precision));
  }
  grpc::ClientContext context;
  PrepareContext(context);
  v1::MatmulResponse response;
  if (grpc::Status status = nibble_stub_->Matmul(&context, request, &response);
      !status.ok()) {
    return ToAbslStatus(status);
  }
  return response;
}

absl::StatusOr<v1::WeightInfo> NibbleClient::GetWeight(absl::string_view name) {
  v1::GetWeightRequest request;
  request.set_name(std::string(name));
  grpc::ClientContext context;
  PrepareContext(context);
  v1::WeightInfo info;
  if (grpc::Status status = nibble_stub_->GetWeight(&context, request, &info);
      !status.ok()) {
    return ToAbslStatus(status);
  }
  return info;
}

absl::StatusOr<std::vector<v1::WeightInfo>> NibbleClient::ListWeights() {
  std::vector<v1::WeightInfo> weights;
  v1::ListWeightsRequest request;
  do {
    grpc::ClientContext context;
    PrepareContext(context);
    v1::ListWeightsResponse response;
    if (grpc::Status status =
            nibble_stub_->ListWeights(&context, request, &response);
        !status.ok()) {
      return ToAbslStatus(status);
    }
    // Names only grow from page to page; a token that does not would loop.
    if (!response.next_page_token().empty() &&
        response.next_page_token() <= request.page_token()) {
      return absl::InternalError(absl::StrCat(
          "the server's ListWeights reply went back to page token \"",
          response.next_page_token(), "\" after \"", request.page_token(),
          "\""));
    }
    weights.insert(weights.end(), response.weights().begin(),
                   response.weights().end());
    request.set_page_token(response.next_page_token());
  } while (!request.page_token().empty());
  return weights;
}

absl::Status NibbleClient::DeleteWeight(absl::string_view name) {
  v1::DeleteWeightRequest request;
  request.set_name(std::string(name));
  grpc::ClientContext context;
  PrepareContext(context);
  v1::DeleteWeightResponse response;
  return ToAbslStatus(nibble_stub_->DeleteWeight(&context, request, &response));
}

absl::StatusOr<grpc::health::v1::HealthCheckResponse::ServingStatus>
NibbleClient::CheckHealth(absl::string_view service) {
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(std::string(service));
  grpc::ClientContext context;
  PrepareContext(context);
  grpc::health::v1::HealthCheckResponse response;
  if (grpc::Status status = health_stub_->Check(&context, request, &response);
      !status.ok()) {
    return ToAbslStatus(status);
  }
  return response.status();
}

}  // namespace nibble
