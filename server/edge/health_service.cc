#include "server/edge/health_service.h"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace nibble::server {

using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

// One Watch call: writes the latest status it was told, one write at a
// time, skipping statuses overtaken before they were written, and finishes
// once told to end and every write is done.
class HealthService::Watcher final
    : public grpc::ServerWriteReactor<HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name)
      : service_(service), name_(std::move(name)) {}

  const std::string& name() const { return name_; }

  void Update(HealthCheckResponse::ServingStatus status)
      ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    if (finished_ || status == last_status_) return;
    last_status_ = status;
    has_pending_ = true;
    WriteOrFinish();
  }

  void End() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    ending_ = true;
    WriteOrFinish();
  }

  void OnWriteDone(bool ok) override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED,
                              "the client stopped reading"));
      return;
    }
    WriteOrFinish();
  }

  void OnCancel() override ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED,
                            "the client cancelled the Watch"));
  }

  void OnDone() override {
    service_->Forget(this);
    delete this;
  }

 private:
  void WriteOrFinish() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (has_pending_) {
      has_pending_ = false;
      writing_ = true;
      response_.set_status(last_status_);
      StartWrite(&response_);
    } else if (ending_) {
      FinishOnce(grpc::Status::OK);
    }
  }

  void FinishOnce(const grpc::Status& status)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  HealthService* const service_;
  const std::string name_;
  absl::Mutex mu_;
  HealthCheckResponse::ServingStatus last_status_ ABSL_GUARDED_BY(mu_) =
      HealthCheckResponse::UNKNOWN;
  // last_status_ is still to be written.
  bool has_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  // Written by StartWrite; untouched until OnWriteDone.
  HealthCheckResponse response_;
};

HealthService::HealthService(const std::vector<std::string>& services)
    : services_(services.begin(), services.end()) {}

HealthCheckResponse::ServingStatus HealthService::StatusOf(
    absl::string_view service) const {
  if (!service.empty() && !services_.contains(service)) {
    return HealthCheckResponse::SERVICE_UNKNOWN;
  }
  return serving_ && !shut_down_ ? HealthCheckResponse::SERVING
                                 : HealthCheckResponse::NOT_SERVING;
}

void HealthService::SetServing(bool serving) {
  absl::MutexLock lock(&mu_);
  if (shut_down_) return;
  serving_ = serving;
  for (Watcher* watcher : watchers_) watcher->Update(StatusOf(watcher->name()));
}

void HealthService::Shutdown() {
  absl::MutexLock lock(&mu_);
  shut_down_ = true;
  for (Watcher* watcher : watchers_) {
    watcher->Update(StatusOf(watcher->name()));
    watcher->End();
  }
}

void HealthService::Forget(Watcher* watcher) {
  absl::MutexLock lock(&mu_);
  watchers_.erase(watcher);
}

grpc::ServerUnaryReactor* HealthService::Check(
    grpc::CallbackServerContext* context, const HealthCheckRequest* request,
    HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::MutexLock lock(&mu_);
  const HealthCheckResponse::ServingStatus status =
      StatusOf(request->service());
  if (status == HealthCheckResponse::SERVICE_UNKNOWN) {
    std::vector<std::string> names(services_.begin(), services_.end());
    std::sort(names.begin(), names.end());
    reactor->Finish(grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        absl::StrCat("service name unknown: ask about \"\" (the server) or ",
                     absl::StrJoin(names, ", ",
                                   [](std::string* out, const std::string& n) {
                                     absl::StrAppend(out, "\"", n, "\"");
                                   }))));
    return reactor;
  }
  response->set_status(status);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* /*context*/,
    const HealthCheckRequest* request) {
  auto* watcher = new Watcher(this, request->service());
  absl::MutexLock lock(&mu_);
  watcher->Update(StatusOf(watcher->name()));
  if (shut_down_) {
    watcher->End();
  } else {
    watchers_.insert(watcher);
  }
  return watcher;
}

}  // namespace nibble::server
