// nibbled assembled: the weight store, the kernel scheduler and thread pool,
// the NibbleService, the Open Inference Protocol (KServe v2) service, gRPC's
// standard health service and server reflection, listening on one address.
//
// Example:
//   absl::StatusOr<std::unique_ptr<nibble::server::NibbleServer>> server =
//       nibble::server::NibbleServer::Start({.listen = "127.0.0.1:0"},
//                                           nibble::cpu::CpuKernels());
//   int port = (*server)->port();
//   (*server)->Shutdown();
#ifndef NIBBLE_SERVER_NIBBLE_SERVER_H_
#define NIBBLE_SERVER_NIBBLE_SERVER_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "kernels/gemm_kernel.h"
#include "kernels/scheduler.h"
#include "kernels/thread_pool.h"
#include "kernels/tuning_table.h"
#include "server/auth.h"
#include "server/batcher.h"
#include "server/kserve_service.h"
#include "server/matmul_runner.h"
#include "server/nibble_service.h"
#include "server/weight_directory.h"
#include "server/weight_store.h"

namespace nibble::server {

struct ServerOptions {
  // HOST:PORT; port 0 picks a free one (see port()).
  std::string listen = "0.0.0.0:50051";
  // Kernel threads; 0 means one per hardware thread.
  int threads = 0;
  // Largest request or response message, so that large activations fit.
  int max_message_bytes = 64 << 20;
  // Which kernel variant wins for which shape (nibbled --tuning_table).
  TuningTable tuning_table = TuningTable::Default();
  // How Matmul requests on one weight are merged (nibbled --max_batch_rows,
  // --max_batch_delay_us, --max_queue_rows).
  BatcherOptions batching;
  // Where every uploaded weight is kept and reloaded from at start
  // (nibbled --data_dir); empty to keep weights in memory only.
  std::string data_dir;
  // PEM (nibbled --tls_cert, --tls_key): TLS when set, plain when empty.
  std::string tls_cert;
  std::string tls_key;
  // PEM (--tls_client_ca): clients must present a certificate it signed.
  std::string tls_client_ca;
  // Bearer tokens (--auth_token_file, --auth_all); none needed when unset.
  std::optional<TokenAuthenticator> auth;
};

class NibbleServer {
 public:
  // Loads the weights in options.data_dir, then starts serving. The kernels
  // must outlive the server. FAILED_PRECONDITION when the data directory
  // cannot be created, listed or written; UNAVAILABLE when the address cannot
  // be bound.
  static absl::StatusOr<std::unique_ptr<NibbleServer>> Start(
      const ServerOptions& options, std::vector<const GemmKernel*> kernels);

  ~NibbleServer();

  int port() const { return port_; }
  int threads() const { return pool_.threads(); }
  // What Start found in options.data_dir: all zero and empty without one.
  const LoadReport& data_dir_report() const { return data_dir_report_; }
  BatcherStats batcher_stats() const { return batcher_.Stats(); }
  // Stops accepting calls, lets in-flight calls finish until `grace` has
  // passed, then cancels the rest.
  void Shutdown(absl::Duration grace = absl::Seconds(5));
  // Blocks until the server has shut down.
  void Wait();

 private:
  NibbleServer(const ServerOptions& options,
               std::vector<const GemmKernel*> kernels);
  // Fills the store from data_dir_, and data_dir_report_.
  absl::Status LoadWeights();

  ThreadPool pool_;
  Scheduler scheduler_;
  WeightStore store_;
  std::optional<WeightDirectory> data_dir_;
  LoadReport data_dir_report_;
  MatmulRunner runner_;
  // Outlives the services and the gRPC server, whose calls it answers.
  MatmulBatcher batcher_;
  std::optional<TokenAuthenticator> auth_;
  NibbleServiceImpl service_;
  KServeServiceImpl kserve_service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_NIBBLE_SERVER_H_
