// nibble-load: a closed-loop load generator for a nibble server. Each worker
// thread sends Matmul requests back to back over one of a few connections;
// the report gives throughput, latency percentiles from a log-bucketed
// histogram merged from per-worker ones, and errors by status code.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "client/command_line.h"
#include "client/latency_histogram.h"
#include "client/matrix_bytes.h"
#include "client/nibble_client.h"
#include "grpc/grpc.h"
#include "proto/conversions.h"

ABSL_FLAG(std::string, target, "localhost:50051",
          "HOST:PORT of the nibble server");
ABSL_FLAG(std::string, name, "", "resident weight to multiply with");
ABSL_FLAG(int64_t, m, 1, "rows of A per request");
ABSL_FLAG(std::string, dtype, "f32", "type of A and C: f32, f16 or bf16");
ABSL_FLAG(int, concurrency, 8,
          "worker threads, each keeping one request in flight");
ABSL_FLAG(int, connections, 4,
          "separate connections the workers are spread over");
ABSL_FLAG(double, duration, 10, "seconds measured");
ABSL_FLAG(double, warmup, 1, "seconds of load before measuring, not counted");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "deadline of each request, e.g. 500ms or 10s");

namespace nibble {
namespace {

constexpr absl::string_view kFlags[] = {
    "target",      "name",     "m",      "dtype",  "concurrency",
    "connections", "duration", "warmup", "timeout"};

// Steady, unlike absl::Now(), so that clock adjustments cannot skew latencies.
using Clock = std::chrono::steady_clock;

struct LoadConfig {
  std::string target;
  std::string name;
  int64_t m = 1;
  DType dtype = DType::kF32;
  int concurrency = 1;
  int connections = 1;
  absl::Duration duration;
  absl::Duration warmup;
  absl::Duration timeout;
};

// What one worker saw inside the measured window.
struct WorkerResult {
  // Microseconds. One per worker, so that recording takes no lock.
  client::LatencyHistogram latencies;
  absl::flat_hash_map<absl::StatusCode, int64_t> errors;
  absl::flat_hash_map<std::string, int64_t> kernels;
};

// Requests finished so far, warmup included, for the progress line.
struct Progress {
  std::atomic<int64_t> ok{0};
  std::atomic<int64_t> failed{0};
};

int UsageError(absl::string_view message) {
  std::cerr << "nibble-load: " << message
            << "\n(`nibble-load --help` lists the flags)\n";
  return kExitUsage;
}

std::string Usage() {
  return absl::StrCat(
      "usage: nibble-load --name NAME [--target HOST:PORT] [--m M] "
      "[--dtype f32|f16|bf16]\n"
      "                   [--concurrency C] [--connections N] "
      "[--timeout DURATION]\n"
      "                   [--duration SECONDS] [--warmup SECONDS]\n\n"
      "Sends Matmul requests on a resident weight back to back from C "
      "threads, then reports\nthroughput and latency percentiles. Exits 1 "
      "when no request succeeded.\n\nflags:\n",
      DescribeFlags(kFlags));
}

absl::StatusOr<LoadConfig> ConfigFromFlags() {
  LoadConfig config;
  config.target = absl::GetFlag(FLAGS_target);
  config.name = absl::GetFlag(FLAGS_name);
  if (config.name.empty()) {
    return absl::InvalidArgumentError(
        "--name is required: the resident weight to multiply with");
  }
  config.m = absl::GetFlag(FLAGS_m);
  if (config.m <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--m must be positive, got ", config.m));
  }
  absl::StatusOr<DType> dtype = ParseDType(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  config.dtype = *dtype;
  config.concurrency = absl::GetFlag(FLAGS_concurrency);
  config.connections = absl::GetFlag(FLAGS_connections);
  if (config.concurrency <= 0 || config.connections <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--concurrency and --connections must be positive, got ",
                     config.concurrency, " and ", config.connections));
  }
  // More connections than workers would leave some idle.
  config.connections = std::min(config.connections, config.concurrency);
  const double duration = absl::GetFlag(FLAGS_duration);
  const double warmup = absl::GetFlag(FLAGS_warmup);
  if (!(duration > 0) || !(warmup >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--duration must be positive and --warmup not negative, got ", duration,
        " and ", warmup));
  }
  config.duration = absl::Seconds(duration);
  config.warmup = absl::Seconds(warmup);
  config.timeout = absl::GetFlag(FLAGS_timeout);
  if (config.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be positive, got ",
                     absl::FormatDuration(config.timeout)));
  }
  return config;
}

// One client per connection: distinct channel arguments with a local
// subchannel pool keep gRPC from sharing one connection between channels.
std::vector<std::unique_ptr<NibbleClient>> ConnectClients(
    const LoadConfig& config) {
  std::vector<std::unique_ptr<NibbleClient>> clients;
  for (int i = 0; i < config.connections; ++i) {
    grpc::ChannelArguments arguments = DefaultChannelArguments();
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    clients.push_back(std::make_unique<NibbleClient>(
        CreateChannel(config.target, arguments), config.timeout));
  }
  return clients;
}

void RunWorker(NibbleClient& client, const LoadConfig& config,
               absl::string_view a, Clock::time_point measure_start,
               Clock::time_point measure_end, Progress& progress,
               WorkerResult& result) {
  while (Clock::now() < measure_end) {
    const Clock::time_point start = Clock::now();
    absl::StatusOr<v1::MatmulResponse> response =
        client.Matmul(config.name, config.m, config.dtype, a);
    const Clock::time_point finish = Clock::now();
    (response.ok() ? progress.ok : progress.failed)
        .fetch_add(1, std::memory_order_relaxed);
    // Only requests that finish inside the window count, so that throughput
    // is completions per second of the window.
    if (finish < measure_start || finish >= measure_end) continue;
    if (response.ok()) {
      result.latencies.Record(
          std::chrono::duration_cast<std::chrono::microseconds>(finish - start)
              .count());
      ++result.kernels[response->kernel()];
    } else {
      ++result.errors[response.status().code()];
    }
  }
}

// Prints a line a second from `start` until `end`, overwriting the last one.
void ShowProgress(const Progress& progress, Clock::time_point start,
                  Clock::time_point measure_start, Clock::time_point end) {
  int64_t last_done = 0;
  int seconds = 1;
  for (Clock::time_point tick = start + std::chrono::seconds(1); tick < end;
       tick += std::chrono::seconds(1), ++seconds) {
    std::this_thread::sleep_until(tick);
    const int64_t ok = progress.ok.load(std::memory_order_relaxed);
    const int64_t failed = progress.failed.load(std::memory_order_relaxed);
    std::cerr << absl::StrFormat(
        "\r%4ds %-9s %8d ok %6d errors %9d requests/s ", seconds,
        tick <= measure_start ? "warmup" : "measuring", ok, failed,
        ok + failed - last_done);
    last_done = ok + failed;
  }
  std::cerr << "\r\x1b[K";
}

// The entries of `counts`, the most frequent first and ties by key, so that
// the report does not depend on hash order.
template <typename Key>
std::vector<std::pair<Key, int64_t>> ByCount(
    const absl::flat_hash_map<Key, int64_t>& counts) {
  std::vector<std::pair<Key, int64_t>> sorted(counts.begin(), counts.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  return sorted;
}

// "3 (DEADLINE_EXCEEDED 2, UNAVAILABLE 1)", or "none".
std::string FormatErrors(
    const absl::flat_hash_map<absl::StatusCode, int64_t>& errors) {
  if (errors.empty()) return "none";
  int64_t total = 0;
  for (const auto& [code, count] : errors) total += count;
  return absl::StrCat(total, " (",
                      absl::StrJoin(ByCount(errors), ", ",
                                    [](std::string* out, const auto& entry) {
                                      absl::StrAppend(
                                          out,
                                          absl::StatusCodeToString(entry.first),
                                          " ", entry.second);
                                    }),
                      ")");
}

// "striped_u4b8_avx512 (12298), ...", or "none".
std::string FormatKernels(
    const absl::flat_hash_map<std::string, int64_t>& kernels) {
  if (kernels.empty()) return "none";
  return absl::StrJoin(
      ByCount(kernels), ", ", [](std::string* out, const auto& entry) {
        absl::StrAppend(out, entry.first, " (", entry.second, ")");
      });
}

int Main(int argc, char* argv[]) {
  absl::StatusOr<CommandLine> command_line = ParseCommandLine(argc, argv);
  if (!command_line.ok()) return UsageError(command_line.status().message());
  if (command_line->help_requested) {
    std::cout << Usage();
    return kExitOk;
  }
  if (!command_line->positional.empty()) {
    return UsageError(absl::StrCat("unexpected argument \"",
                                   command_line->positional[0],
                                   "\": every value goes with a flag"));
  }
  absl::StatusOr<LoadConfig> config = ConfigFromFlags();
  if (!config.ok()) return UsageError(config.status().message());

  std::vector<std::unique_ptr<NibbleClient>> clients = ConnectClients(*config);
  absl::StatusOr<v1::WeightInfo> info = clients[0]->GetWeight(config->name);
  if (!info.ok()) {
    std::cerr << "nibble-load: looking up weight \"" << config->name << "\" on "
              << config->target
              << " failed: " << absl::StatusCodeToString(info.status().code())
              << ": " << info.status().message() << "\n";
    return kExitFailure;
  }
  absl::StatusOr<WeightSpec> spec = WeightSpecFromInfo(*info);
  if (!spec.ok()) {
    std::cerr << "nibble-load: the server describes weight \"" << config->name
              << "\" oddly: " << spec.status().message() << "\n";
    return kExitFailure;
  }
  const std::string a =
      RandomMatrixBytes(config->m, spec->k, config->dtype, /*seed=*/1);

  const Clock::time_point start = Clock::now();
  const Clock::time_point measure_start =
      start + absl::ToChronoNanoseconds(config->warmup);
  const Clock::time_point measure_end =
      measure_start + absl::ToChronoNanoseconds(config->duration);
  Progress progress;
  std::vector<WorkerResult> results(config->concurrency);
  std::vector<std::thread> workers;
  for (int i = 0; i < config->concurrency; ++i) {
    workers.emplace_back(RunWorker, std::ref(*clients[i % clients.size()]),
                         std::cref(*config), absl::string_view(a),
                         measure_start, measure_end, std::ref(progress),
                         std::ref(results[i]));
  }
  if (isatty(STDERR_FILENO))
    ShowProgress(progress, start, measure_start, measure_end);
  for (std::thread& worker : workers) worker.join();

  WorkerResult total;
  for (const WorkerResult& result : results) {
    total.latencies.Merge(result.latencies);
    for (const auto& [code, count] : result.errors) total.errors[code] += count;
    for (const auto& [kernel, count] : result.kernels) {
      total.kernels[kernel] += count;
    }
  }
  const client::LatencyHistogram& latency = total.latencies;
  std::cout << absl::StrFormat(
      "target:      %s\n"
      "weight:      %s (%s)\n"
      "m:           %d\n"
      "dtype:       %s\n"
      "concurrency: %d over %d connections\n"
      "duration:    %.1f s after %.1f s warmup\n"
      "requests ok: %d\n"
      "errors:      %s\n"
      "throughput:  %.1f requests/s\n"
      "latency us:  p50 %d  p90 %d  p99 %d  p99.9 %d  max %d\n"
      "kernel:      %s\n",
      config->target, config->name, spec->DebugString(), config->m,
      DTypeName(config->dtype), config->concurrency, config->connections,
      absl::ToDoubleSeconds(config->duration),
      absl::ToDoubleSeconds(config->warmup), latency.count(),
      FormatErrors(total.errors),
      static_cast<double>(latency.count()) /
          absl::ToDoubleSeconds(config->duration),
      latency.ValueAtQuantile(0.5), latency.ValueAtQuantile(0.9),
      latency.ValueAtQuantile(0.99), latency.ValueAtQuantile(0.999),
      latency.max(), FormatKernels(total.kernels));
  if (latency.count() == 0) {
    std::cerr << "nibble-load: no request succeeded in the measured window; "
                 "see the errors line\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace
}  // namespace nibble

int main(int argc, char* argv[]) { return nibble::Main(argc, argv); }
