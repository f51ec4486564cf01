// Calls per gRPC method and status code, and their durations, recorded by a
// server interceptor so that every service (nibble.v1, KServe v2, health,
// reflection) is counted the same way without touching its handlers.
//
// Example:
//   nibble::server::RpcStats stats;
//   std::vector<std::unique_ptr<
//       grpc::experimental::ServerInterceptorFactoryInterface>> creators;
//   creators.push_back(
//       std::make_unique<nibble::server::RpcMetricsInterceptorFactory>(&stats));
//   builder.experimental().SetInterceptorCreators(std::move(creators));
//   ...
//   for (const nibble::server::RpcMethodStats& method : stats.Snapshot()) ...
#ifndef NIBBLE_SERVER_EDGE_RPC_METRICS_H_
#define NIBBLE_SERVER_EDGE_RPC_METRICS_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/support/server_interceptor.h"
#include "grpcpp/support/status.h"
#include "server/operations/metrics_histogram.h"

namespace nibble::server {

// grpc::StatusCode runs from OK (0) to UNAUTHENTICATED (16).
inline constexpr int kGrpcStatusCodes = 17;

// The method label of calls to methods no service registered, so that
// clients cannot make up a label per call.
inline constexpr char kUnregisteredMethod[] = "unregistered";

// One gRPC method's calls since the server started.
struct RpcMethodStats {
  // As gRPC names it: "/nibble.v1.NibbleService/Matmul".
  std::string method;
  // Finished calls by the grpc::StatusCode they were answered with; a code
  // outside gRPC's range counts as UNKNOWN. A stream is one call.
  std::array<int64_t, kGrpcStatusCodes> calls_by_code{};
  // From the call's arrival to its status being sent.
  Histogram duration_seconds{kLatencyBucketsSeconds};
};

// Thread-safe: written by every gRPC thread, read by the metrics endpoint.
class RpcStats {
 public:
  void Record(absl::string_view method, grpc::StatusCode code,
              absl::Duration duration) ABSL_LOCKS_EXCLUDED(mu_);
  // Every method called so far, sorted by method.
  std::vector<RpcMethodStats> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  mutable absl::Mutex mu_;
  // Transparent, so that recording a known method allocates nothing.
  std::map<std::string, RpcMethodStats, std::less<>> methods_
      ABSL_GUARDED_BY(mu_);
};

// Creates, per call, an interceptor that records the call into `stats` when
// its status is sent. `stats` must outlive the gRPC server.
class RpcMetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcMetricsInterceptorFactory(RpcStats* stats) : stats_(stats) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override;

 private:
  RpcStats* const stats_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_RPC_METRICS_H_
