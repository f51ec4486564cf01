#include "server/edge/rpc_metrics.h"

#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/support/interceptor.h"

namespace nibble::server {

void RpcStats::Record(absl::string_view method, grpc::StatusCode code,
                      absl::Duration duration) {
  int code_index = static_cast<int>(code);
  if (code_index < 0 || code_index >= kGrpcStatusCodes) {
    code_index = static_cast<int>(grpc::StatusCode::UNKNOWN);
  }
  absl::MutexLock lock(&mu_);
  auto found = methods_.find(method);
  if (found == methods_.end()) {
    found = methods_.emplace(std::string(method), RpcMethodStats{}).first;
    found->second.method = found->first;
  }
  ++found->second.calls_by_code[code_index];
  found->second.duration_seconds.Record(absl::ToDoubleSeconds(duration));
}

std::vector<RpcMethodStats> RpcStats::Snapshot() const {
  absl::MutexLock lock(&mu_);
  std::vector<RpcMethodStats> snapshot;
  snapshot.reserve(methods_.size());
  for (const auto& [method, stats] : methods_) snapshot.push_back(stats);
  return snapshot;
}

namespace {

class RpcMetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  RpcMetricsInterceptor(RpcStats* stats, const char* method)
      : stats_(stats), method_(method), start_(absl::Now()) {}

  void Intercept(
      grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      stats_->Record(method_, methods->GetSendStatus().error_code(),
                     absl::Now() - start_);
    }
    methods->Proceed();
  }

 private:
  RpcStats* const stats_;
  // Owned by gRPC, valid for the whole call.
  const char* const method_;
  const absl::Time start_;
};

// Whether the call reached no registered method but the generic handler,
// which gRPC uses to answer unknown methods UNIMPLEMENTED.
bool IsUnregistered(grpc::experimental::ServerRpcInfo* info) {
  grpc::ServerContextBase* context = info->server_context();
  return dynamic_cast<grpc::GenericServerContext*>(context) != nullptr ||
         dynamic_cast<grpc::GenericCallbackServerContext*>(context) != nullptr;
}

}  // namespace

grpc::experimental::Interceptor*
RpcMetricsInterceptorFactory::CreateServerInterceptor(
    grpc::experimental::ServerRpcInfo* info) {
  const char* method = info->method();
  if (method == nullptr || IsUnregistered(info)) method = kUnregisteredMethod;
  return new RpcMetricsInterceptor(stats_, method);
}

}  // namespace nibble::server
