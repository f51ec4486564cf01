#include "server/edge/nibble_server.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/resource_quota.h"
#include "grpcpp/security/server_credentials.h"
#include "kernels/cuda/cuda_backend.h"
#include "server/core/upload_assembler.h"
#include "server/edge/reflection_service.h"
#include "server/operations/log.h"
#include "server/operations/metrics.h"

namespace nibble::server {
namespace {

// The CPU backend schedules `kernels` by the tuning table's rules for its ISA
// level; the CUDA backend puts the GPU's kernels first, so that `kernels` run
// only the shapes those refuse, and picks variants by the table's rules for
// the first of `gpus` (all of one kind), or the GPU's rule where those are
// silent.
Scheduler MakeScheduler(Backend backend, const std::vector<int>& gpus,
                        std::vector<const GemmKernel*> kernels,
                        const TuningTable& table) {
  if (backend != Backend::kCuda) return Scheduler(std::move(kernels), table);
  std::vector<const GemmKernel*> all = cuda::CudaKernels();
  all.insert(all.end(), kernels.begin(), kernels.end());
  const int gpu = gpus.front();
  return Scheduler(std::move(all), cuda::ForGpu(table, gpu),
                   [gpu](const GemmProblem& problem) {
                     return cuda::PreferredVariant(problem, gpu);
                   });
}

// Each of `gpus` with its budget from `options` and its free memory now.
std::vector<GpuBudget> GpuBudgets(const ServerOptions& options,
                                  const std::vector<int>& gpus) {
  std::vector<GpuBudget> budgets;
  for (int gpu : gpus) {
    absl::StatusOr<cuda::GpuMemory> memory = cuda::DeviceMemory(gpu);
    budgets.push_back(
        {.gpu = gpu,
         .max_bytes = GpuBudgetBytes(options.max_gpu_bytes,
                                     memory.ok() ? memory->free_bytes : 0)});
  }
  return budgets;
}

// Each GPU's batcher runs batches on several dispatchers at once, two per
// weight, each on its own stream (cuda::kMaxLanes), so that one batch's
// copies and its replies' work on the host overlap another's kernel; and a
// batch's replies go to gRPC from several threads, since the host's cores
// are not busy with kernels (a batch of 60 on the H200 handed its replies
// over one by one for about a millisecond). The second batch starts from
// kGpuRowsBesideRunning rows rather than full: a GPU run's host stages
// (gather, copies, scatter) take several times its kernel, which costs
// about as much for 8 rows as for 1, so waiting for a full batch leaves the
// GPU idle (8192 x 28672 at 64 clients on an H100: batches of 13 rows, 303 us
// a run, 54 of them the kernel's). At 64 clients on an H100 that gave 1.08x
// the requests/s on the tiny weight and 1.11x on 8192 x 28672 (medians of
// three runs); 256 clients, whose batches fill, ran as before.
constexpr int64_t kGpuRowsBesideRunning = 8;
BatcherOptions GpuBatching(BatcherOptions batching) {
  batching.dispatchers = std::max(batching.dispatchers, cuda::kMaxLanes / 2);
  batching.max_running_batches = std::max(batching.max_running_batches, 2);
  batching.rows_beside_running =
      std::min(batching.max_batch_rows, kGpuRowsBesideRunning);
  batching.reply_threads = std::max(batching.reply_threads, 4);
  return batching;
}

// `backend` resolved, the GPUs of ServerOptions::gpus resolved: none on the
// CPU backend; FAILED_PRECONDITION for GPUs of different kinds.
absl::StatusOr<std::vector<int>> GpusToUse(const ServerOptions& options,
                                           Backend backend) {
  if (backend != Backend::kCuda) return std::vector<int>();
  absl::StatusOr<std::vector<int>> gpus =
      ResolveGpus(options.gpus, cuda::DeviceCount());
  if (!gpus.ok()) return gpus.status();
  const int first = gpus->front();
  for (int gpu : *gpus) {
    if (!cuda::SameKind(first, gpu)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--gpus: GPU ", gpu, " (", cuda::DeviceDescription(gpu),
          ") is not of the kind of GPU ", first, " (",
          cuda::DeviceDescription(first),
          "), and nibbled tunes its kernels for one kind: name GPUs of one "
          "kind with --gpus, or run one nibbled per kind"));
    }
  }
  return gpus;
}

}  // namespace

NibbleServer::NibbleServer(const ServerOptions& options, Backend backend,
                           std::vector<int> gpus,
                           std::vector<const GemmKernel*> kernels)
    : backend_(backend),
      gpus_(std::move(gpus)),
      pool_(options.threads),
      scheduler_(MakeScheduler(backend, gpus_, std::move(kernels),
                               options.tuning_table)),
      store_({.max_resident_bytes = options.max_weight_bytes,
              .max_weights = options.max_weights,
              .gpus = GpuBudgets(options, gpus_)}),
      data_dir_(options.data_dir.empty()
                    ? std::nullopt
                    : std::make_optional<WeightDirectory>(options.data_dir)),
      runner_(&scheduler_, &pool_),
      batchers_(options.batching, GpuBatching(options.batching), gpus_,
                BackendOf(&runner_)),
      auth_(options.auth),
      reply_budget_(options.max_held_reply_bytes),
      service_(&store_, &batchers_, data_dir_ ? &*data_dir_ : nullptr,
               auth_ ? &*auth_ : nullptr, backend, options.max_message_bytes,
               &reply_budget_, options.uploads),
      kserve_service_(&store_, &batchers_,
                      {.load =
                           [this](absl::string_view name) {
                             return service_.LoadFromDataDir(name);
                           },
                       .unload =
                           [this](absl::string_view name) {
                             return service_.Delete(name);
                           }},
                      auth_ ? &*auth_ : nullptr, options.max_message_bytes,
                      &reply_budget_),
      // Health reports on these besides the server as a whole ("").
      health_({v1::NibbleService::service_full_name(),
               inference::GRPCInferenceService::service_full_name()}),
      metrics_weight_labels_(options.metrics_weight_labels) {}

NibbleServer::~NibbleServer() {
  // Quietly: after a Drain this does nothing, and a server that failed to
  // start has nothing in flight to report on.
  if (server_ != nullptr) server_->Shutdown(absl::ToChronoTime(absl::Now()));
}

absl::Status NibbleServer::LoadWeights() {
  if (!data_dir_.has_value()) return absl::OkStatus();
  int initial_weight_files = 0;
  absl::StatusOr<LoadReport> report =
      data_dir_->LoadAll([&](WeightFileReader& file) -> absl::Status {
        if (initial_weights_names_.contains(file.name())) {
          ++initial_weight_files;
          return absl::OkStatus();
        }
        // A weight past the budget is skipped before its data is read, and
        // LoadAll reports it and leaves its file alone.
        return service_.StoreFile(file);
      });
  if (!report.ok()) return report.status();
  data_dir_report_ = *std::move(report);
  // LoadAll counted them as loaded; they were stored before it ran.
  data_dir_report_.weights_loaded -= initial_weight_files;
  return absl::OkStatus();
}

namespace {

int Milliseconds(absl::Duration duration) {
  return static_cast<int>(absl::ToInt64Milliseconds(duration));
}

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
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();

  absl::StatusOr<Backend> backend =
      ResolveBackend(options.backend, cuda::CompiledIn(), cuda::DeviceCount());
  if (!backend.ok()) return backend.status();
  absl::StatusOr<std::vector<int>> gpus = GpusToUse(options, *backend);
  if (!gpus.ok()) return gpus.status();
  std::unique_ptr<NibbleServer> server(new NibbleServer(
      options, *backend, *std::move(gpus), std::move(kernels)));
  // Checked before listening, so that an unusable directory fails at once.
  if (server->data_dir_.has_value()) {
    if (absl::Status status = server->data_dir_->Prepare(); !status.ok()) {
      return status;
    }
  }
  // Before listening, so that a failed import is never seen by a client.
  if (options.initial_weights) {
    // The import stores layers two at a time.
    absl::Mutex names_mutex;
    const auto remember =
        [&server, &names_mutex](
            absl::StatusOr<std::shared_ptr<const ResidentWeight>> stored,
            absl::string_view name) -> absl::StatusOr<int64_t> {
      if (!stored.ok()) return stored.status();
      absl::MutexLock lock(&names_mutex);
      server->initial_weights_names_.emplace(name);
      return (*stored)->packed.resident_bytes();
    };
    const auto store = [&](const QuantizedWeight& weight,
                           absl::string_view name) {
      return remember(server->service_.Store(weight, name), name);
    };
    const auto store_packed = [&](PackedWeight packed, absl::string_view name) {
      return remember(server->service_.StorePacked(std::move(packed), name),
                      name);
    };
    const auto store_columns = [&](const Fp4Columns& columns,
                                   absl::string_view name) {
      return remember(server->service_.StoreColumns(columns, name), name);
    };
    // StoreColumns decides where the columns go.
    const bool keeps_canonical = server->service_.KeepsCanonicalWeights();
    const InitialWeightStore stores{
        .canonical = store,
        .packed = keeps_canonical
                      ? std::nullopt
                      : std::optional<StorePackedWeightFunction>(store_packed),
        .columns = keeps_canonical
                       ? std::optional<StoreColumnsFunction>(store_columns)
                       : std::nullopt};
    if (absl::Status status = options.initial_weights(stores); !status.ok()) {
      return status;
    }
  }
  if (server->data_dir_.has_value()) server->store_.SetLoading(true);
  server->kserve_service_.SetReady(false);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, Credentials(options),
                           &server->port_);
  // Without this a second nibbled on the same port would start too and
  // silently take half of the connections.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  // No compressed requests: gRPC 1.51 compares the compressed message with
  // the limit and then inflates all of it, so 1 MiB of gzip could cost 1 GiB.
  // With every algorithm disabled, a call whose grpc-encoding names one is
  // refused with UNIMPLEMENTED once its headers arrive, before its message is
  // read.
  for (int algorithm = GRPC_COMPRESS_NONE + 1;
       algorithm < GRPC_COMPRESS_ALGORITHMS_COUNT; ++algorithm) {
    builder.SetCompressionAlgorithmSupportStatus(
        static_cast<grpc_compression_algorithm>(algorithm), false);
  }
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  if (options.max_receive_buffer_bytes > 0) {
    // The builder keeps its own reference to the quota.
    grpc::ResourceQuota receive_quota("nibbled-receive");
    receive_quota.Resize(options.max_receive_buffer_bytes);
    builder.SetResourceQuota(receive_quota);
  }
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             Milliseconds(options.keepalive_time));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             Milliseconds(options.keepalive_timeout));
  // Clients that keep idle connections alive with their own pings are
  // welcome; gRPC's default (one ping in 5 minutes) would disconnect them.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(
      GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS,
      Milliseconds(options.min_client_ping_interval));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS,
                             options.max_concurrent_streams);
  builder.RegisterService(&server->service_);
  builder.RegisterService(&server->kserve_service_);
  builder.RegisterService(&server->health_);
  AddReflectionV1(builder);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      interceptors;
  interceptors.push_back(
      std::make_unique<RpcMetricsInterceptorFactory>(&server->rpc_stats_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
  server->server_ = builder.BuildAndStart();
  if (server->server_ == nullptr || server->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen,
                     ": the address is malformed or the port is in use"));
  }
  // Before loading, so that the load can be watched.
  if (!options.metrics_listen.empty()) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> metrics =
        MetricsHttpServer::Start(
            options.metrics_listen,
            [raw = server.get()] { return raw->RenderMetrics(); },
            options.metrics_auth);
    if (!metrics.ok()) return metrics.status();
    server->metrics_http_ = *std::move(metrics);
  }
  if (absl::Status status = server->LoadWeights(); !status.ok()) {
    return status;
  }
  server->store_.SetLoading(false);
  server->SetServing(true);
  return server;
}

void NibbleServer::SetServing(bool serving) {
  health_.SetServing(serving);
  kserve_service_.SetReady(serving);
  serving_ = serving;
}

std::string NibbleServer::RenderMetrics() const {
  MetricsSnapshot snapshot{.rpcs = rpc_stats_.Snapshot(),
                           .batcher = batchers_.Stats(),
                           .weights = {},
                           .reserved_weight_bytes = store_.reserved_bytes(),
                           .max_weight_bytes = store_.max_resident_bytes(),
                           .max_weights = store_.max_weights(),
                           .held_reply_bytes = reply_budget_.held_bytes(),
                           .max_held_reply_bytes = reply_budget_.max_bytes(),
                           .gpus = {},
                           .backend = std::string(BackendName(backend_)),
                           .gpu_run_stages = cuda::RunStages(),
                           .serving = serving_.load(),
                           .weight_labels = metrics_weight_labels_};
  for (const std::shared_ptr<const ResidentWeight>& weight : store_.List()) {
    snapshot.weights.push_back(
        {.name = weight->name,
         .resident_bytes = weight->packed.resident_bytes(),
         .gpu = weight->device != nullptr ? weight->device->device() : -1});
  }
  for (const GpuUsage& usage : store_.gpu_usage()) {
    absl::StatusOr<cuda::GpuMemory> memory = cuda::DeviceMemory(usage.gpu);
    snapshot.gpus.push_back(
        {.usage = usage, .free_bytes = memory.ok() ? memory->free_bytes : 0});
  }
  return RenderPrometheusText(snapshot);
}

void NibbleServer::Drain(absl::Duration delay, absl::Duration grace) {
  absl::MutexLock lock(&drain_mutex_);
  if (server_ == nullptr || drained_) return;
  drained_ = true;
  SetServing(false);
  if (delay > absl::ZeroDuration()) {
    LogInfo("draining: health is NOT_SERVING, still accepting calls",
            {{"drain_delay", absl::FormatDuration(delay)}});
    absl::SleepFor(delay);
  }
  LogInfo("draining: stopped accepting calls, finishing in-flight ones",
          {{"grace", absl::FormatDuration(grace)}});
  // Ends every health Watch (gRPC's client-side health checking keeps one
  // open on each channel), each having heard NOT_SERVING, and any that
  // arrives from now on, so that they do not hold the shutdown for all of
  // `grace`.
  health_.Shutdown();
  server_->Shutdown(absl::ToChronoTime(absl::Now() + grace));
  // Every call has ended, so no client waits on the batcher any more; this
  // stops its threads once they have answered what they still hold.
  batchers_.Shutdown();
  LogInfo("draining: done, every call has ended");
}

void NibbleServer::Shutdown(absl::Duration grace) {
  Drain(absl::ZeroDuration(), grace);
}

void NibbleServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace nibble::server
