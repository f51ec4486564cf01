// grpc.health.v1.Health for nibbled, in place of gRPC's default service, so
// that a drain can end Watch streams: gRPC's keeps them open, holding the
// shutdown for its whole grace period, and finishes one its client cancels
// with UNKNOWN. Reports on the server as a whole ("") and on the named
// services; every one is NOT_SERVING until SetServing(true).
//
// Check answers the status, or NOT_FOUND for a name it does not report on.
// Watch sends the status at once and again on every change (SERVICE_UNKNOWN
// for such a name) until the client cancels or Shutdown ends it.
//
// Example:
//   HealthService health({"nibble.v1.NibbleService"});
//   builder.RegisterService(&health);
//   ... build and start the server ...
//   health.SetServing(true);  // Check and every Watch now say SERVING
//   health.Shutdown();        // NOT_SERVING, then every Watch ends with OK
#ifndef NIBBLE_SERVER_EDGE_HEALTH_SERVICE_H_
#define NIBBLE_SERVER_EDGE_HEALTH_SERVICE_H_

#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace nibble::server {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  // `services` are the names reported on besides "".
  explicit HealthService(const std::vector<std::string>& services);

  // Every name's status, told to every open Watch; ignored after Shutdown.
  void SetServing(bool serving) ABSL_LOCKS_EXCLUDED(mu_);
  // Turns every name NOT_SERVING for good and ends every open Watch once it
  // has sent that; a later Watch ends after its first message. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  grpc::ServerUnaryReactor* Check(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request,
      grpc::health::v1::HealthCheckResponse* response) override
      ABSL_LOCKS_EXCLUDED(mu_);
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  class Watcher;

  grpc::health::v1::HealthCheckResponse::ServingStatus StatusOf(
      absl::string_view service) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called by a watcher as its call ends.
  void Forget(Watcher* watcher) ABSL_LOCKS_EXCLUDED(mu_);

  const absl::flat_hash_set<std::string> services_;
  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  bool shut_down_ ABSL_GUARDED_BY(mu_) = false;
  absl::flat_hash_set<Watcher*> watchers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_HEALTH_SERVICE_H_
