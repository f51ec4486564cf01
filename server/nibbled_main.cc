// nibbled: serves C = A · dequant(B) on resident 4-bit weights over gRPC.
// main is the start-up's steps: flags into options, the --import plan, the
// server, what it loaded, the listening line, then serving until SIGTERM or
// SIGINT.
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/command_line.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/gemm_kernel.h"
#include "server/core/checkpoint_loader.h"
#include "server/core/weight_store.h"
#include "server/edge/nibble_server.h"
#include "server/operations/log.h"
#include "server/operations/nibbled_flags.h"
#include "server/operations/open_file_limit.h"
#include "server/storage/weight_directory.h"

namespace {

using nibble::kExitFailure;
using nibble::kExitOk;
using nibble::kExitUsage;
using nibble::server::Backend;
using nibble::server::CheckpointLoadReport;
using nibble::server::GpuUsage;
using nibble::server::InitialWeightStore;
using nibble::server::LoadReport;
using nibble::server::LogError;
using nibble::server::LogInfo;
using nibble::server::LogWarning;
using nibble::server::NibbledOptions;
using nibble::server::NibbleServer;
using nibble::server::PlannedCheckpoint;

// A flag value that cannot work, or a --data_dir or --backend that cannot be
// had; anything else that stops nibbled before it serves is kExitFailure.
int UsageError(const absl::Status& status) {
  absl::FPrintF(stderr, "nibbled: %s\n", status.message());
  return kExitUsage;
}

int NotStarted(const absl::Status& status, int exit_code) {
  absl::FPrintF(stderr, "nibbled: %s\n", status.message());
  LogError("not started", {{"error", status.message()}});
  return exit_code;
}

// Blocks SIGTERM and SIGINT in this thread and so in every thread started
// after it; StopSignalWaiter's thread waits for them.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

// Lets nibbled hold as many connections as the hard limit allows, and logs
// the limit; nibbled goes on with the soft one when it cannot.
void RaiseOpenFileLimit() {
  absl::StatusOr<nibble::server::OpenFileLimit> files =
      nibble::server::RaiseOpenFileLimit();
  if (!files.ok()) {
    LogWarning("open file limit not raised",
               {{"error", files.status().message()}});
    return;
  }
  LogInfo("open file limit",
          {{"max_open_files", files->now}, {"was", files->before}});
}

// The --import checkpoints and what storing them came to.
struct Import {
  std::vector<PlannedCheckpoint> checkpoints;
  // Set when storing the checkpoints fails, which makes Start fail with it.
  absl::Status status;
  CheckpointLoadReport report;
};

// Opens and checks every --import checkpoint before anything is stored, and
// has the server store them at start, recording the outcome in `import`,
// which must outlive NibbleServer::Start.
absl::Status PlanImport(NibbledOptions& options, Import& import) {
  if (options.import_paths.empty()) return absl::OkStatus();
  LogInfo("checking import",
          {{"files", absl::StrJoin(options.import_paths, ",")}});
  absl::StatusOr<std::vector<PlannedCheckpoint>> planned =
      nibble::server::PlanCheckpoints(
          options.import_paths, options.import,
          {.max_resident_bytes = options.server.max_weight_bytes,
           .max_weights = options.server.max_weights});
  if (!planned.ok()) return planned.status();
  import.checkpoints = *std::move(planned);
  if (import.checkpoints.empty()) return absl::OkStatus();
  options.server.initial_weights = [&import](const InitialWeightStore& store) {
    absl::StatusOr<CheckpointLoadReport> report =
        nibble::server::LoadCheckpoints(import.checkpoints, store);
    if (!report.ok()) {
      import.status = report.status();
      return import.status;
    }
    import.report = *report;
    return absl::OkStatus();
  };
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<NibbleServer>> StartServer(
    const NibbledOptions& options, nibble::cpu::Isa isa) {
  if (!options.server.data_dir.empty()) {
    LogInfo("loading weights", {{"data_dir", options.server.data_dir}});
  }
  return NibbleServer::Start(options.server, nibble::cpu::CpuKernels(isa));
}

// The --data_dir files the server skipped or cleaned up, on stderr and in
// the log.
void ReportDataDir(const LoadReport& loaded) {
  for (const nibble::server::WeightFileProblem& problem : loaded.problems) {
    absl::FPrintF(stderr, "nibbled: skipped %s, not serving it: %s\n",
                  problem.path, problem.reason);
    LogWarning("skipped weight file",
               {{"path", problem.path}, {"reason", problem.reason}});
  }
  for (const std::string& path : loaded.removed_temp_files) {
    absl::FPrintF(stderr, "nibbled: removed %s, left by an unfinished upload\n",
                  path);
    LogInfo("removed unfinished upload", {{"path", path}});
  }
}

// HOST of `listen` (HOST:PORT, as given) with the port actually bound, which
// differs when the flag asked for port 0; a Unix socket (unix:PATH) as given,
// since it has no port.
std::string BoundAddress(const std::string& listen, int port) {
  if (absl::StartsWith(listen, "unix:")) return listen;
  return absl::StrCat(listen.substr(0, listen.rfind(':')), ":", port);
}

// The GPUs of `gpus` (all of one kind), e.g. "GPUs 0, 1: NVIDIA H100 80GB
// HBM3, 132 SMs, sm_90, 79.1 GiB each".
std::string GpusDescription(const std::vector<GpuUsage>& gpus) {
  std::vector<int> ordinals;
  for (const GpuUsage& gpu : gpus) ordinals.push_back(gpu.gpu);
  return absl::StrCat(gpus.size() == 1 ? "GPU " : "GPUs ",
                      absl::StrJoin(ordinals, ", "), ": ",
                      nibble::cuda::DeviceDescription(ordinals.front()),
                      gpus.size() == 1 ? "" : " each");
}

// The "listening on" line on stdout, which scripts and tests wait for, and
// its log line with the limits in effect.
void AnnounceListening(const NibbledOptions& options,
                       const NibbleServer& server, nibble::cpu::Isa isa,
                       const CheckpointLoadReport& imported) {
  const std::string address =
      BoundAddress(options.server.listen, server.port());
  const std::string& metrics_listen = options.server.metrics_listen;
  const std::string metrics_address =
      metrics_listen.empty()
          ? ""
          : BoundAddress(metrics_listen, server.metrics_port());
  const bool on_gpu = server.backend() == Backend::kCuda;
  const std::vector<GpuUsage> gpus = server.gpu_usage();
  const std::string device = on_gpu ? GpusDescription(gpus) : "";
  std::vector<std::string> gpu_budgets;
  for (const GpuUsage& gpu : gpus) {
    gpu_budgets.push_back(gpu.max_bytes > 0 ? absl::StrCat(gpu.max_bytes)
                                            : std::string("none"));
  }
  const std::string& tuning_table_path = options.tuning_table_path;
  const std::string tuning_table_name =
      tuning_table_path.empty() ? "built-in" : tuning_table_path;
  if (!on_gpu && !options.server.gpus.empty()) {
    LogWarning("--gpus has no effect: nibbled runs the cpu backend",
               {{"gpus", absl::StrJoin(options.server.gpus, ",")}});
  }
  if (options.server.batching.activation_precision ==
          nibble::ActivationPrecision::kInt8 &&
      (on_gpu || isa < nibble::cpu::Isa::kAvx512Vnni)) {
    LogWarning(
        "no int8 kernels run here: they need the cpu backend on a CPU with "
        "AVX-512 VNNI; requests run as with --activation_precision=bf16",
        {{"kernels", nibble::cpu::IsaName(isa)}});
  }
  // Without rules of the kernels' level the scheduler's default rule picks
  // (on the GPU, cuda::PreferredVariant).
  const std::string& rules_level = server.scheduler().table().isa();
  const std::string variants_from =
      absl::StrCat("tuning table ", tuning_table_name, " (",
                   !rules_level.empty() ? absl::StrCat(rules_level, " rules")
                   : on_gpu             ? std::string("no rules for this GPU")
                                        : std::string("no rules for this CPU"),
                   ")");
  const std::string& data_dir = options.server.data_dir;
  const LoadReport& loaded = server.data_dir_report();
  absl::PrintF(
      "nibbled: listening on %s (%s backend%s, %d threads, %s kernels, "
      "%s%s%s%s)\n",
      address, nibble::server::BackendName(server.backend()),
      on_gpu ? absl::StrCat(" on ", device) : "", server.threads(),
      nibble::cpu::IsaName(isa), variants_from,
      options.import_paths.empty()
          ? ""
          : absl::StrFormat(", %d layers imported", imported.layers),
      data_dir.empty() ? ""
                       : absl::StrFormat(", %d weights loaded from %s",
                                         loaded.weights_loaded, data_dir),
      metrics_address.empty()
          ? ""
          : absl::StrCat(", metrics at http://", metrics_address, "/metrics"));
  std::fflush(stdout);
  // The line above is what scripts and tests wait for; this one is for log
  // collectors.
  const int64_t max_weight_bytes = options.server.max_weight_bytes;
  const int64_t max_receive_buffer_bytes =
      options.server.max_receive_buffer_bytes;
  const int64_t max_held_reply_bytes = options.server.max_held_reply_bytes;
  LogInfo(
      "listening",
      {{"addr", address},
       {"backend", nibble::server::BackendName(server.backend())},
       {"device", device},
       {"threads", server.threads()},
       {"kernels", nibble::cpu::IsaName(isa)},
       {"activation_precision",
        nibble::ActivationPrecisionName(
            options.server.batching.activation_precision)},
       {"tuning_table", tuning_table_name},
       {"data_dir", data_dir},
       {"weights_loaded", loaded.weights_loaded},
       {"layers_imported", imported.layers},
       {"metrics_addr", metrics_address},
       {"resident_bytes", server.resident_bytes()},
       {"max_weight_bytes",
        max_weight_bytes > 0 ? absl::StrCat(max_weight_bytes) : "none"},
       {"max_weight_bytes_from", options.max_weight_bytes_source},
       {"max_weights", options.server.max_weights},
       {"max_gpu_bytes",
        gpu_budgets.empty() ? "none" : absl::StrJoin(gpu_budgets, ",")},
       {"max_receive_buffer_bytes", max_receive_buffer_bytes > 0
                                        ? absl::StrCat(max_receive_buffer_bytes)
                                        : "none"},
       {"max_held_reply_bytes", max_held_reply_bytes > 0
                                    ? absl::StrCat(max_held_reply_bytes)
                                    : "none"}});
}

// Waits for SIGTERM or SIGINT on its own thread from the start on, so that
// a signal is honoured however long the import and the data directory take
// to load. Before the server is handed over (Serving), nibbled has
// acknowledged nothing that is not on disk (it answers UNAVAILABLE while it
// loads, and every file it writes is renamed into place whole), so the
// signal ends it at once with exit 0. From then on the signal drains the
// server as --drain_delay_seconds and --shutdown_grace_seconds say.
class StopSignalWaiter {
 public:
  // `stop_signals` must be blocked in every thread (BlockStopSignals).
  StopSignalWaiter(const sigset_t& stop_signals, const NibbledOptions& options)
      : thread_([this, stop_signals, &options] {
          int signal = 0;
          sigwait(&stop_signals, &signal);
          Stop(signal, options);
        }) {}
  // When nibbled did not start, main returns with the thread still waiting.
  ~StopSignalWaiter() {
    if (thread_.joinable()) thread_.detach();
  }

  void Serving(NibbleServer& server) {
    absl::MutexLock lock(&mu_);
    server_ = &server;
  }
  // Returns once a stop signal has drained the server given to Serving.
  void WaitUntilStopped(NibbleServer& server) {
    server.Wait();
    thread_.join();
  }

 private:
  void Stop(int signal, const NibbledOptions& options) {
    absl::MutexLock lock(&mu_);
    if (server_ == nullptr) {
      LogInfo("signal received while starting, stopping before serving",
              {{"signal", strsignal(signal)}});
      // Without destructors: other threads are still loading or importing.
      _exit(kExitOk);
    }
    const double delay = options.drain_delay_seconds;
    const double grace = options.shutdown_grace_seconds;
    LogInfo("signal received, draining", {{"signal", strsignal(signal)},
                                          {"drain_delay_seconds", delay},
                                          {"grace_seconds", grace}});
    server_->Drain(absl::Seconds(delay), absl::Seconds(grace));
  }

  absl::Mutex mu_;
  NibbleServer* server_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::thread thread_;
};

}  // namespace

int main(int argc, char** argv) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  if (absl::Status status = nibble::server::ParseNibbledFlags(argc, argv);
      !status.ok()) {
    return UsageError(status);
  }
  absl::StatusOr<NibbledOptions> options = nibble::server::OptionsFromFlags();
  if (!options.ok()) return UsageError(options.status());
  const sigset_t stop_signals = BlockStopSignals();
  StopSignalWaiter stop_signal_waiter(stop_signals, *options);
  RaiseOpenFileLimit();
  const nibble::cpu::Isa isa = nibble::cpu::DetectIsa();

  Import import;
  if (absl::Status status = PlanImport(*options, import); !status.ok()) {
    return NotStarted(status, kExitFailure);
  }
  absl::StatusOr<std::unique_ptr<NibbleServer>> server =
      StartServer(*options, isa);
  if (!server.ok()) {
    // An unusable --data_dir or --backend is a usage error, like a bad flag;
    // a failed import is not, whatever its code.
    const bool usage =
        server.status().code() == absl::StatusCode::kFailedPrecondition &&
        import.status.ok();
    return NotStarted(server.status(), usage ? kExitUsage : kExitFailure);
  }
  stop_signal_waiter.Serving(**server);
  // The files stay mapped only as long as the import needs them.
  import.checkpoints.clear();

  ReportDataDir((*server)->data_dir_report());
  AnnounceListening(*options, **server, isa, import.report);
  stop_signal_waiter.WaitUntilStopped(**server);
  LogInfo("stopped");
  return kExitOk;
}
