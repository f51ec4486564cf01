// nibbled assembled: the weight store, the kernel scheduler and thread pool,
// the NibbleService, the Open Inference Protocol (KServe v2) service, the
// standard health service and server reflection (v1alpha and v1), listening
// on one address.
//
// Lifecycle: Start stores ServerOptions::initial_weights (nibbled --import)
// before it listens, so that a failed import is never served; it then
// listens, with health NOT_SERVING and every call that needs weights
// answered UNAVAILABLE while it loads options.data_dir, then turns SERVING.
// Drain turns health NOT_SERVING again, stops accepting calls, ends health
// Watch streams, lets other in-flight calls finish and runs what the batcher
// has queued.
//
// Example:
//   absl::StatusOr<std::unique_ptr<nibble::server::NibbleServer>> server =
//       nibble::server::NibbleServer::Start({.listen = "127.0.0.1:0"},
//                                           nibble::cpu::CpuKernels());
//   int port = (*server)->port();
//   (*server)->Drain(absl::ZeroDuration(), absl::Seconds(5));
#ifndef NIBBLE_SERVER_EDGE_NIBBLE_SERVER_H_
#define NIBBLE_SERVER_EDGE_NIBBLE_SERVER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/thread_pool.h"
#include "format/weight_format.h"
#include "grpcpp/grpcpp.h"
#include "kernels/gemm_kernel.h"
#include "kernels/scheduler.h"
#include "kernels/tuning_table.h"
#include "server/core/batcher.h"
#include "server/core/device_batchers.h"
#include "server/core/matmul_runner.h"
#include "server/core/reply_budget.h"
#include "server/core/weight_store.h"
#include "server/edge/health_service.h"
#include "server/edge/kserve_service.h"
#include "server/edge/nibble_service.h"
#include "server/edge/rpc_metrics.h"
#include "server/operations/auth.h"
#include "server/operations/metrics_http.h"
#include "server/storage/weight_directory.h"

namespace nibble::server {

struct ServerOptions {
  // HOST:PORT; port 0 picks a free one (see port()).
  std::string listen = "0.0.0.0:50051";
  // Kernel threads; 0 means one per hardware thread.
  int threads = 0;
  // Largest request or response message, so that large activations fit.
  int max_message_bytes = 64 << 20;
  // Most bytes gRPC may hold for requests still arriving, over all
  // connections (--max_receive_buffer_bytes); 0 for no limit. gRPC (1.51)
  // compares a message with max_message_bytes only once all of it has
  // arrived, so without this a client could make the server buffer up to
  // 4 GiB per call; past it, calls are reset with RESOURCE_EXHAUSTED.
  int64_t max_receive_buffer_bytes = 0;
  // Most bytes of matmul replies held for clients until gRPC has sent them,
  // over all connections, a quarter of it per connection
  // (--max_held_reply_bytes; see ReplyBudget); 0 for no limit.
  int64_t max_held_reply_bytes = 0;
  // Most bytes of packed weights held resident (nibbled --max_weight_bytes);
  // 0 for no limit.
  int64_t max_weight_bytes = 0;
  // Most weights held resident plus uploads in progress (--max_weights); 0
  // for no limit.
  int64_t max_weights = 0;
  // Most bytes of GPU memory the weights may take on each GPU of the CUDA
  // backend (--max_gpu_bytes), as GpuBudgetBytes resolves it: 0 for the GPU's
  // free memory at start less a margin, -1 for no limit.
  int64_t max_gpu_bytes = 0;
  // The GPUs the CUDA backend places weights on (--gpus), as device
  // ordinals; empty for every GPU the process sees. They must be of one
  // kind (cuda::SameKind): the kernels' rules are the first one's.
  std::vector<int> gpus;
  // How often an idle connection is pinged, and how long the server waits
  // for the answer before closing it (--keepalive_time_ms,
  // --keepalive_timeout_ms), so that vanished clients free their resources.
  absl::Duration keepalive_time = absl::Minutes(1);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // Shortest interval between client pings the server tolerates, with or
  // without calls in flight; clients pinging more often are disconnected.
  absl::Duration min_client_ping_interval = absl::Seconds(10);
  // Concurrent calls per connection (--max_concurrent_streams).
  int max_concurrent_streams = 256;
  // Where matmuls run and weights are kept (nibbled --backend): kAuto takes
  // the GPU when there is one. On kCuda the CUDA kernels run, with the given
  // kernels for the shapes they refuse.
  Backend backend = Backend::kCpu;
  // Which kernel variant wins for which shape (nibbled --tuning_table): the
  // rules of the CPU's ISA level, or on kCuda of the GPU's level
  // (cuda::ForGpu), the GPU's own rule deciding where those are silent.
  TuningTable tuning_table = TuningTable::Default();
  // How Matmul requests on one weight are merged (nibbled --max_batch_rows,
  // --max_batch_delay_us, --max_queue_rows). On the CUDA backend each GPU
  // has a batcher of its own that runs several batches at once
  // (GpuBatching); weights the CPU serves keep these options.
  BatcherOptions batching;
  // What uploads may hold (--upload_idle_seconds,
  // --max_uploads_per_connection).
  UploadLimits uploads;
  // Where every uploaded weight is kept and reloaded from at start
  // (nibbled --data_dir); empty to keep weights in memory only.
  std::string data_dir;
  // PEM (nibbled --tls_cert, --tls_key): TLS when set, plain when empty.
  std::string tls_cert;
  std::string tls_key;
  // PEM (--tls_client_ca): clients must present a certificate it signed.
  std::string tls_client_ca;
  // Bearer tokens (--auth_token_file, --auth_writes_only); none needed when
  // unset.
  std::optional<TokenAuthenticator> auth;
  // Puts weights in the store at start (nibbled --import): called once,
  // before the server listens and before data_dir is loaded, with the
  // functions that store a weight. Its error stops Start, which returns it
  // before anything listens. A data_dir file of a weight it stored is the one
  // it just wrote, and is not loaded again.
  std::function<absl::Status(const InitialWeightStore&)> initial_weights;
  // HOST:PORT for Prometheus's GET /metrics (--metrics_listen); port 0 picks
  // a free one (see metrics_port()); empty for none.
  std::string metrics_listen;
  // Bearer tokens a scrape must carry (--metrics_auth_token_file); none
  // needed when unset.
  std::optional<TokenAuthenticator> metrics_auth;
  // Whether /metrics names weights in labels (--metrics_weight_labels).
  bool metrics_weight_labels = true;
};

class NibbleServer {
 public:
  // Stores options.initial_weights, starts listening, loads the weights in
  // options.data_dir (see Lifecycle above), then serves; returns once
  // loaded. The kernels must outlive the server. FAILED_PRECONDITION when
  // options.backend cannot be had (see ResolveBackend) or the data directory
  // cannot be created, listed or written; UNAVAILABLE when the address
  // cannot be bound; options.initial_weights' error as it returns it.
  static absl::StatusOr<std::unique_ptr<NibbleServer>> Start(
      const ServerOptions& options, std::vector<const GemmKernel*> kernels);

  ~NibbleServer();

  int port() const { return port_; }
  int threads() const { return pool_.threads(); }
  // options.backend resolved: kCpu or kCuda.
  Backend backend() const { return backend_; }
  // Picks each call's kernel; its table().isa() names the rules it reads.
  const Scheduler& scheduler() const { return scheduler_; }
  // What Start found in options.data_dir: all zero and empty without one.
  // The files of weights options.initial_weights stored are not counted.
  const LoadReport& data_dir_report() const { return data_dir_report_; }
  BatcherStats batcher_stats() const { return batchers_.Stats(); }
  int64_t resident_bytes() const { return store_.resident_bytes(); }
  // The GPUs weights are placed on (ServerOptions::gpus resolved), with
  // their budgets (ServerOptions::max_gpu_bytes resolved) and what they
  // hold; none on the CPU backend.
  std::vector<GpuUsage> gpu_usage() const { return store_.gpu_usage(); }
  // The port of GET /metrics; 0 without options.metrics_listen.
  int metrics_port() const {
    return metrics_http_ != nullptr ? metrics_http_->port() : 0;
  }
  // What GET /metrics answers: Prometheus text.
  std::string RenderMetrics() const;
  // Turns health NOT_SERVING (and KServe ServerReady false) and keeps
  // serving for `delay`, so that load balancers stop sending new calls; then
  // stops accepting calls, ends health Watch streams (whose last message was
  // NOT_SERVING), lets other in-flight ones finish until `grace` has
  // passed, cancels the rest, and runs what the batcher still holds. Returns
  // when all is done.
  void Drain(absl::Duration delay, absl::Duration grace);
  // Drain without the delay. Idempotent, like Drain.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // Blocks until the server has shut down.
  void Wait();

 private:
  NibbleServer(const ServerOptions& options, Backend backend,
               std::vector<int> gpus, std::vector<const GemmKernel*> kernels);
  // Fills the store from data_dir_, and data_dir_report_, leaving out the
  // weights of initial_weights_names_.
  absl::Status LoadWeights();
  // Health of every service, and KServe ServerReady.
  void SetServing(bool serving);
  const Backend backend_;
  // ServerOptions::gpus resolved; empty on the CPU backend.
  const std::vector<int> gpus_;
  ThreadPool pool_;
  Scheduler scheduler_;
  WeightStore store_;
  std::optional<WeightDirectory> data_dir_;
  LoadReport data_dir_report_;
  // The weights ServerOptions::initial_weights stored.
  absl::flat_hash_set<std::string> initial_weights_names_;
  MatmulRunner runner_;
  // One per GPU of gpus_ and one for the CPU. Outlives the services and the
  // gRPC server, whose calls it answers.
  DeviceBatchers batchers_;
  std::optional<TokenAuthenticator> auth_;
  // Outlives the services, whose calls hold replies in it.
  ReplyBudget reply_budget_;
  NibbleServiceImpl service_;
  KServeServiceImpl kserve_service_;
  // NOT_SERVING from construction until Start has loaded the weights.
  HealthService health_;
  // Written by interceptors until server_ is gone.
  RpcStats rpc_stats_;
  std::atomic<bool> serving_ = false;
  // ServerOptions::metrics_weight_labels.
  const bool metrics_weight_labels_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  // Last, so destroyed first: its scrapes read everything above.
  std::unique_ptr<MetricsHttpServer> metrics_http_;
  // Makes Drain run once; later and concurrent calls wait for it to end.
  absl::Mutex drain_mutex_;
  bool drained_ ABSL_GUARDED_BY(drain_mutex_) = false;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_EDGE_NIBBLE_SERVER_H_
