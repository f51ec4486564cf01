#include "server/nibble_server.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/security/server_credentials.h"

namespace nibble::server {

NibbleServer::NibbleServer(const ServerOptions& options,
                           std::vector<const GemmKernel*> kernels)
    : pool_(options.threads),
      scheduler_(std::move(kernels), options.tuning_table),
      data_dir_(options.data_dir.empty()
                    ? std::nullopt
                    : std::make_optional<WeightDirectory>(options.data_dir)),
      runner_(&scheduler_, &pool_),
      batcher_(options.batching, BackendOf(&runner_)),
      auth_(options.auth),
      service_(&store_, &batcher_, data_dir_ ? &*data_dir_ : nullptr,
               auth_ ? &*auth_ : nullptr),
      kserve_service_(&store_, &batcher_, auth_ ? &*auth_ : nullptr) {}

NibbleServer::~NibbleServer() { Shutdown(absl::ZeroDuration()); }

absl::Status NibbleServer::LoadWeights() {
  if (!data_dir_.has_value()) return absl::OkStatus();
  if (absl::Status status = data_dir_->Prepare(); !status.ok()) return status;
  absl::StatusOr<LoadReport> report =
      data_dir_->LoadAll([this](WeightFile file) -> absl::Status {
        absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(file.weight);
        if (!packed.ok()) return packed.status();
        return store_.Insert(std::move(file.name), *std::move(packed));
      });
  if (!report.ok()) return report.status();
  data_dir_report_ = *std::move(report);
  return absl::OkStatus();
}

namespace {

std::shared_ptr<grpc::ServerCredentials> Credentials(
    const ServerOptions& options) {
  if (options.tls_cert.empty()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions tls(
      options.tls_client_ca.empty()
          ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
          : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  tls.pem_root_certs = options.tls_client_ca;
  tls.pem_key_cert_pairs.push_back({options.tls_key, options.tls_cert});
  return grpc::SslServerCredentials(tls);
}

}  // namespace

absl::StatusOr<std::unique_ptr<NibbleServer>> NibbleServer::Start(
    const ServerOptions& options, std::vector<const GemmKernel*> kernels) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  std::unique_ptr<NibbleServer> server(
      new NibbleServer(options, std::move(kernels)));
  if (absl::Status status = server->LoadWeights(); !status.ok()) {
    return status;
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, Credentials(options),
                           &server->port_);
  // Without this a second nibbled on the same port would start too and
  // silently take half of the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.RegisterService(&server->service_);
  builder.RegisterService(&server->kserve_service_);
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen,
                     ": the address is malformed or the port is in use"));
  }
  return server;
}

void NibbleServer::Shutdown(absl::Duration grace) {
  if (server_ != nullptr) {
    server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  }
}

void NibbleServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace nibble::server
