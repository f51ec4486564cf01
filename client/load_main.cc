// nibble-load: a load generator for a nibble server. Closed loop, each worker
// thread sends Matmul requests back to back over one of a few connections.
// Open loop (--rate), one thread sends asynchronous requests at scheduled
// times whatever the replies do, and latency counts from each request's
// scheduled send time, so a stalled server shows in the percentiles. The
// report gives throughput, latency percentiles from log-bucketed histograms,
// and errors by status code; --json writes it as one JSON object. A sweep
// (--sweep_rate, --sweep_concurrency) runs one such step per load level, stops
// at the first step over the --slo or with errors, and can also write a CSV
// row per step and an SVG plot of throughput and latency against load.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <mutex>
#include <optional>
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
#include "client/arrival_schedule.h"
#include "client/command_line.h"
#include "client/json_text.h"
#include "client/latency_histogram.h"
#include "client/matrix_bytes.h"
#include "client/nibble_client.h"
#include "client/svg_plot.h"
#include "client/sweep_range.h"
#include "grpc/grpc.h"
#include "grpcpp/client_context.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "proto/conversions.h"

ABSL_FLAG(std::string, target, "localhost:50051",
          "HOST:PORT of the nibble server");
ABSL_FLAG(std::string, name, "", "resident weight to multiply with");
ABSL_FLAG(int64_t, m, 1, "rows of A per request");
ABSL_FLAG(std::string, dtype, "f32", "type of A and C: f32, f16 or bf16");
ABSL_FLAG(int, concurrency, 8,
          "closed loop: worker threads, each keeping one request in flight");
ABSL_FLAG(double, rate, 0,
          "requests per second; when given, open loop instead of "
          "--concurrency: requests go out on schedule however slow the "
          "replies");
ABSL_FLAG(std::string, arrival, "constant",
          "open loop: constant gaps, or poisson (exponential gaps)");
ABSL_FLAG(uint64_t, seed, 1, "open loop: seed of the poisson arrivals");
ABSL_FLAG(int64_t, requests, 0,
          "open loop: stop after this many measured sends instead of "
          "--duration");
ABSL_FLAG(int, max_in_flight, 10000,
          "open loop: most requests outstanding; sends beyond it count as "
          "client-side RESOURCE_EXHAUSTED errors");
ABSL_FLAG(int, connections, 4, "separate connections the load is spread over");
ABSL_FLAG(double, duration, 10, "seconds measured");
ABSL_FLAG(double, warmup, 1, "seconds of load before measuring, not counted");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(10),
          "deadline of each request, e.g. 500ms or 10s");
ABSL_FLAG(std::string, json, "",
          "also write the whole result to this file as one JSON object");
ABSL_FLAG(std::string, csv, "",
          "also write a header and one row per step (a single run is one "
          "step) to this CSV file");
ABSL_FLAG(std::string, sweep_rate, "",
          "FROM:TO:STEP: open loop at rates FROM, FROM+STEP, ... up to TO "
          "requests/s, one step each");
ABSL_FLAG(std::string, sweep_concurrency, "",
          "FROM:TO:STEP: closed loop at concurrency FROM, FROM+STEP, ... up "
          "to TO, one step each");
ABSL_FLAG(double, step_duration, 5,
          "sweep: seconds measured per step, after --warmup");
ABSL_FLAG(double, slo, 0,
          "sweep: milliseconds; stop after the first step whose p99 exceeds "
          "it");
ABSL_FLAG(std::string, plot, "",
          "sweep: write throughput and p50/p99 latency against the offered "
          "load to this SVG file");

namespace nibble {
namespace {

constexpr absl::string_view kFlags[] = {
    "target",        "name",        "m",
    "dtype",         "concurrency", "rate",
    "arrival",       "seed",        "requests",
    "max_in_flight", "connections", "duration",
    "warmup",        "timeout",     "json",
    "csv",           "sweep_rate",  "sweep_concurrency",
    "step_duration", "slo",         "plot"};

// Flags that only make sense in a sweep.
constexpr absl::string_view kSweepFlags[] = {"step_duration", "slo", "plot"};

// Flags that a sweep sets per step instead.
constexpr absl::string_view kNotInSweepFlags[] = {"rate", "concurrency",
                                                  "duration", "requests"};

// Flags that only make sense with --rate.
constexpr absl::string_view kOpenLoopFlags[] = {"arrival", "seed", "requests",
                                                "max_in_flight"};

// The error a send refused by --max_in_flight counts as; not the server's.
constexpr absl::string_view kClientInFlightError =
    "RESOURCE_EXHAUSTED (client: too many in flight)";

// Steady, unlike absl::Now(), so that clock adjustments cannot skew latencies.
using Clock = std::chrono::steady_clock;

// What a sweep varies from step to step.
enum class SweepOver { kNone, kRate, kConcurrency };

struct LoadConfig {
  std::string target;
  std::string name;
  int64_t m = 1;
  DType dtype = DType::kF32;
  int concurrency = 1;
  // Open loop, from --rate; the fields below it apply only then.
  bool open_loop = false;
  double rate = 0;
  client::ArrivalProcess arrival = client::ArrivalProcess::kConstant;
  uint64_t seed = 1;
  // 0: run for `duration`.
  int64_t requests = 0;
  int max_in_flight = 1;
  int connections = 1;
  absl::Duration duration;
  absl::Duration warmup;
  absl::Duration timeout;
  std::string json_path;
  std::string csv_path;
  // A sweep sets `rate` or `concurrency` to each value of `sweep` in turn and
  // runs each step for `duration`.
  SweepOver sweep_over = SweepOver::kNone;
  client::SweepRange sweep;
  // Milliseconds of p99 above which a sweep stops; 0 for no SLO.
  double slo_ms = 0;
  std::string plot_path;
};

// What one worker saw inside the measured window.
struct WorkerResult {
  // Microseconds. One per worker, so that recording takes no lock.
  client::LatencyHistogram latencies;
  // By status code name, or kClientInFlightError.
  absl::flat_hash_map<std::string, int64_t> errors;
  absl::flat_hash_map<std::string, int64_t> kernels;
};

// What the report says about a whole run.
struct LoadReport {
  WorkerResult total;
  // The measured window: --duration, or the scheduled time of --requests.
  absl::Duration window;
  double throughput_rps = 0;
  // Open loop only: the requests sent in the window, and their rate.
  int64_t sent = 0;
  double sent_rps = 0;
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
      "                   [--concurrency C | --rate R [--arrival "
      "constant|poisson] [--seed S]\n"
      "                   [--requests N] [--max_in_flight F]] [--connections "
      "N] "
      "[--timeout DURATION]\n"
      "                   [--duration SECONDS] [--warmup SECONDS] "
      "[--json FILE] [--csv FILE]\n"
      "       nibble-load --name NAME (--sweep_rate FROM:TO:STEP | "
      "--sweep_concurrency FROM:TO:STEP)\n"
      "                   [--step_duration SECONDS] [--slo MS] [--plot "
      "FILE.svg] [other flags as above]\n\n"
      "Sends Matmul requests on a resident weight back to back from C "
      "threads (closed loop), or\nat R requests/s whatever the replies "
      "(open loop; latency counts from each request's\nscheduled send time), "
      "then reports throughput and latency percentiles. A sweep runs\none "
      "step per rate or concurrency and stops at the first step whose p99 "
      "exceeds --slo\nor that has errors. Exits 1 when no request "
      "succeeded.\n\nflags:\n",
      DescribeFlags(kFlags));
}

bool FlagGiven(const CommandLine& command_line, absl::string_view name) {
  return std::find(command_line.flags_given.begin(),
                   command_line.flags_given.end(),
                   name) != command_line.flags_given.end();
}

// The open-loop part of the config, when --rate is given.
absl::Status OpenLoopFromFlags(const CommandLine& command_line,
                               LoadConfig& config) {
  config.open_loop =
      FlagGiven(command_line, "rate") || config.sweep_over == SweepOver::kRate;
  if (!config.open_loop) {
    for (absl::string_view flag : kOpenLoopFlags) {
      if (FlagGiven(command_line, flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag,
                         " applies to the open loop only; add --rate or "
                         "--sweep_rate"));
      }
    }
    return absl::OkStatus();
  }
  if (FlagGiven(command_line, "concurrency")) {
    return absl::InvalidArgumentError(
        "--rate and --concurrency exclude each other: --rate sends on a "
        "schedule, --concurrency keeps C requests in flight");
  }
  // A sweep has set the rate of its first step.
  if (config.sweep_over == SweepOver::kNone) {
    config.rate = absl::GetFlag(FLAGS_rate);
    if (!(config.rate > 0) || !std::isfinite(config.rate)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--rate must be a positive number of requests/s, got ", config.rate));
    }
  }
  absl::StatusOr<client::ArrivalProcess> arrival =
      client::ParseArrivalProcess(absl::GetFlag(FLAGS_arrival));
  if (!arrival.ok()) return arrival.status();
  config.arrival = *arrival;
  config.seed = absl::GetFlag(FLAGS_seed);
  config.requests = absl::GetFlag(FLAGS_requests);
  if (FlagGiven(command_line, "requests") && config.requests <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--requests must be positive, got ", config.requests));
  }
  config.max_in_flight = absl::GetFlag(FLAGS_max_in_flight);
  if (config.max_in_flight <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_in_flight must be positive, got ", config.max_in_flight));
  }
  return absl::OkStatus();
}

// The sweep part of the config, when --sweep_rate or --sweep_concurrency is
// given; it sets the first step's load and the step duration.
absl::Status SweepFromFlags(const CommandLine& command_line,
                            LoadConfig& config) {
  const bool over_rate = FlagGiven(command_line, "sweep_rate");
  const bool over_concurrency = FlagGiven(command_line, "sweep_concurrency");
  if (!over_rate && !over_concurrency) {
    for (absl::string_view flag : kSweepFlags) {
      if (FlagGiven(command_line, flag)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag,
                         " applies to sweeps only; add --sweep_rate or "
                         "--sweep_concurrency"));
      }
    }
    return absl::OkStatus();
  }
  if (over_rate && over_concurrency) {
    return absl::InvalidArgumentError(
        "--sweep_rate and --sweep_concurrency exclude each other; sweep one "
        "at a time");
  }
  const absl::string_view sweep_flag =
      over_rate ? "sweep_rate" : "sweep_concurrency";
  for (absl::string_view flag : kNotInSweepFlags) {
    if (FlagGiven(command_line, flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " does not go with --", sweep_flag,
          ": the sweep sets each step's load, and --step_duration its "
          "length"));
    }
  }
  absl::StatusOr<client::SweepRange> range = client::ParseSweepRange(
      absl::GetFlag(over_rate ? FLAGS_sweep_rate : FLAGS_sweep_concurrency),
      /*integers=*/over_concurrency);
  if (!range.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", sweep_flag, ": ", range.status().message()));
  }
  config.sweep = *range;
  if (over_rate) {
    config.sweep_over = SweepOver::kRate;
    config.rate = range->from;
  } else {
    config.sweep_over = SweepOver::kConcurrency;
    config.concurrency = static_cast<int>(range->from);
  }
  const double step_duration = absl::GetFlag(FLAGS_step_duration);
  if (!(step_duration > 0) || !std::isfinite(step_duration)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--step_duration must be a positive number of seconds, got ",
        step_duration));
  }
  config.duration = absl::Seconds(step_duration);
  if (FlagGiven(command_line, "slo")) {
    config.slo_ms = absl::GetFlag(FLAGS_slo);
    if (!(config.slo_ms > 0) || !std::isfinite(config.slo_ms)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--slo must be a positive number of milliseconds, got ",
                       config.slo_ms));
    }
  }
  config.plot_path = absl::GetFlag(FLAGS_plot);
  return absl::OkStatus();
}

absl::StatusOr<LoadConfig> ConfigFromFlags(const CommandLine& command_line) {
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
  if (absl::Status status = SweepFromFlags(command_line, config);
      !status.ok()) {
    return status;
  }
  if (absl::Status status = OpenLoopFromFlags(command_line, config);
      !status.ok()) {
    return status;
  }
  // More connections than closed-loop workers would leave some idle.
  if (!config.open_loop) {
    config.connections = std::min(config.connections,
                                  config.sweep_over == SweepOver::kConcurrency
                                      ? static_cast<int>(config.sweep.to)
                                      : config.concurrency);
  }
  const double duration = absl::GetFlag(FLAGS_duration);
  const double warmup = absl::GetFlag(FLAGS_warmup);
  if (!(duration > 0) || !(warmup >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--duration must be positive and --warmup not negative, got ", duration,
        " and ", warmup));
  }
  if (config.sweep_over == SweepOver::kNone) {
    config.duration = absl::Seconds(duration);
  }
  config.warmup = absl::Seconds(warmup);
  config.timeout = absl::GetFlag(FLAGS_timeout);
  if (config.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--timeout must be positive, got ",
                     absl::FormatDuration(config.timeout)));
  }
  config.json_path = absl::GetFlag(FLAGS_json);
  config.csv_path = absl::GetFlag(FLAGS_csv);
  return config;
}

// One channel per connection: a local subchannel pool keeps gRPC from
// sharing one connection between channels.
std::vector<std::shared_ptr<grpc::Channel>> ConnectChannels(
    const LoadConfig& config) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < config.connections; ++i) {
    grpc::ChannelArguments arguments = DefaultChannelArguments();
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    channels.push_back(CreateChannel(config.target, arguments));
  }
  return channels;
}

int64_t Microseconds(Clock::duration duration) {
  return std::chrono::duration_cast<std::chrono::microseconds>(duration)
      .count();
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
      result.latencies.Record(Microseconds(finish - start));
      ++result.kernels[response->kernel()];
    } else {
      ++result.errors[absl::StatusCodeToString(response.status().code())];
    }
  }
}

// One open-loop request, from its send until its callback deletes it.
struct OpenLoopCall {
  grpc::ClientContext context;
  v1::MatmulResponse response;
  // When the schedule said to send it; its latency counts from here.
  Clock::time_point intended;
  // Scheduled inside the measured window.
  bool measured = false;
};

// Shared between the sending thread and the callbacks, which gRPC runs on its
// own threads.
struct OpenLoopState {
  std::mutex mutex;
  std::condition_variable drained;
  int in_flight = 0;
  // Of the measured requests.
  WorkerResult result;
  Clock::time_point last_completion;
};

void OnOpenLoopDone(OpenLoopCall* call, const grpc::Status& status,
                    OpenLoopState& state, Progress& progress) {
  const Clock::time_point finish = Clock::now();
  (status.ok() ? progress.ok : progress.failed)
      .fetch_add(1, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(state.mutex);
  if (call->measured) {
    if (status.ok()) {
      state.result.latencies.Record(Microseconds(finish - call->intended));
      ++state.result.kernels[call->response.kernel()];
    } else {
      ++state.result.errors[absl::StatusCodeToString(
          static_cast<absl::StatusCode>(status.error_code()))];
    }
    state.last_completion = std::max(state.last_completion, finish);
  }
  delete call;
  if (--state.in_flight == 0) state.drained.notify_all();
}

// Sends `request` on the schedule, from `start`, spread over `stubs` in turn,
// without waiting for replies; then waits for the outstanding ones. Requests
// scheduled before `measure_start` are warmup and not counted.
LoadReport RunOpenLoop(
    const std::vector<std::unique_ptr<v1::NibbleService::Stub>>& stubs,
    const LoadConfig& config, const v1::MatmulRequest& request,
    Clock::time_point start, Clock::time_point measure_start,
    Progress& progress) {
  const Clock::time_point measure_end =
      measure_start + absl::ToChronoNanoseconds(config.duration);
  client::ArrivalSchedule schedule(config.arrival, config.rate, config.seed);
  OpenLoopState state;
  LoadReport report;
  int64_t scheduled = 0;  // Measured, refused ones included.
  Clock::time_point window_end;
  Clock::time_point last_send = measure_start;
  for (size_t i = 0;; ++i) {
    const Clock::time_point intended =
        start + absl::ToChronoNanoseconds(schedule.Next());
    const bool measured = intended >= measure_start;
    if (measured && (config.requests > 0 ? scheduled == config.requests
                                         : intended >= measure_end)) {
      window_end = config.requests > 0 ? intended : measure_end;
      break;
    }
    // A sender running late sends at once; the latency still counts from
    // `intended`.
    std::this_thread::sleep_until(intended);
    if (measured) ++scheduled;
    {
      std::lock_guard<std::mutex> lock(state.mutex);
      if (state.in_flight >= config.max_in_flight) {
        progress.failed.fetch_add(1, std::memory_order_relaxed);
        if (measured) ++state.result.errors[kClientInFlightError];
        continue;
      }
      ++state.in_flight;
    }
    // Owned by the call from here on; OnOpenLoopDone deletes it.
    auto* call = new OpenLoopCall;
    call->intended = intended;
    call->measured = measured;
    call->context.set_deadline(
        absl::ToChronoTime(absl::Now() + config.timeout));
    stubs[i % stubs.size()]->async()->Matmul(
        &call->context, &request, &call->response,
        [call, &state, &progress](grpc::Status status) {
          OnOpenLoopDone(call, status, state, progress);
        });
    if (measured) {
      ++report.sent;
      last_send = Clock::now();
    }
  }
  std::unique_lock<std::mutex> lock(state.mutex);
  state.drained.wait(lock, [&state] { return state.in_flight == 0; });

  report.total = std::move(state.result);
  report.window = absl::FromChrono(window_end - measure_start);
  const double window = absl::ToDoubleSeconds(report.window);
  // A sender or server that fell behind stretches the time taken.
  report.sent_rps =
      report.sent / std::max(window, absl::ToDoubleSeconds(absl::FromChrono(
                                         last_send - measure_start)));
  report.throughput_rps =
      report.total.latencies.count() /
      std::max(window, absl::ToDoubleSeconds(absl::FromChrono(
                           state.last_completion - measure_start)));
  return report;
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
int64_t TotalErrors(const absl::flat_hash_map<std::string, int64_t>& errors) {
  int64_t total = 0;
  for (const auto& [label, count] : errors) total += count;
  return total;
}

std::string FormatErrors(
    const absl::flat_hash_map<std::string, int64_t>& errors) {
  if (errors.empty()) return "none";
  return absl::StrCat(TotalErrors(errors), " (",
                      absl::StrJoin(ByCount(errors), ", ",
                                    [](std::string* out, const auto& entry) {
                                      absl::StrAppend(out, entry.first, " ",
                                                      entry.second);
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

// How far the sent rate fell short of the offered one, in percent; 0 when it
// kept up.
double ShortfallPercent(const LoadConfig& config, const LoadReport& report) {
  return std::max(0.0, 100 * (1 - report.sent_rps / config.rate));
}

// {"a": 1, ...} from a count per label, the most frequent first.
std::string JsonCounts(
    const absl::flat_hash_map<std::string, int64_t>& counts) {
  return absl::StrCat("{",
                      absl::StrJoin(ByCount(counts), ", ",
                                    [](std::string* out, const auto& entry) {
                                      absl::StrAppend(
                                          out, client::JsonString(entry.first),
                                          ": ", entry.second);
                                    }),
                      "}");
}

std::string ReportJson(const LoadConfig& config, const WeightSpec& spec,
                       const LoadReport& report) {
  using client::JsonNumber;
  using client::JsonString;
  const client::LatencyHistogram& latency = report.total.latencies;
  const std::string null = "null";
  const std::string config_json = absl::StrCat(
      "{\"target\": ", JsonString(config.target),
      ", \"weight\": ", JsonString(config.name),
      ", \"weight_spec\": ", JsonString(spec.DebugString()),
      ", \"m\": ", config.m,
      ", \"dtype\": ", JsonString(DTypeName(config.dtype)),
      ", \"mode\": ", JsonString(config.open_loop ? "open" : "closed"),
      ", \"rate\": ", config.open_loop ? JsonNumber(config.rate) : null,
      ", \"arrival\": ",
      config.open_loop ? JsonString(client::ArrivalProcessName(config.arrival))
                       : null,
      ", \"seed\": ", config.open_loop ? absl::StrCat(config.seed) : null,
      ", \"requests\": ",
      config.open_loop && config.requests > 0 ? absl::StrCat(config.requests)
                                              : null,
      ", \"max_in_flight\": ",
      config.open_loop ? absl::StrCat(config.max_in_flight) : null,
      ", \"concurrency\": ",
      config.open_loop ? null : absl::StrCat(config.concurrency),
      ", \"connections\": ", config.connections,
      ", \"duration_s\": ", JsonNumber(absl::ToDoubleSeconds(report.window)),
      ", \"warmup_s\": ", JsonNumber(absl::ToDoubleSeconds(config.warmup)),
      ", \"timeout_s\": ", JsonNumber(absl::ToDoubleSeconds(config.timeout)),
      "}");
  const std::string latency_json = absl::StrCat(
      "{\"min\": ", latency.min(), ", \"mean\": ", JsonNumber(latency.mean()),
      ", \"p50\": ", latency.ValueAtQuantile(0.5),
      ", \"p90\": ", latency.ValueAtQuantile(0.9),
      ", \"p99\": ", latency.ValueAtQuantile(0.99),
      ", \"p999\": ", latency.ValueAtQuantile(0.999),
      ", \"max\": ", latency.max(), "}");
  const std::string histogram_json = absl::StrCat(
      "[",
      absl::StrJoin(latency.NonEmptyBuckets(), ", ",
                    [](std::string* out, const auto& bucket) {
                      absl::StrAppend(out, "{\"lower\": ", bucket.lower,
                                      ", \"upper\": ", bucket.upper,
                                      ", \"count\": ", bucket.count, "}");
                    }),
      "]");
  return absl::StrCat(
      "{\"config\": ", config_json,
      ", \"offered_rps\": ", config.open_loop ? JsonNumber(config.rate) : null,
      ", \"sent_rps\": ", config.open_loop ? JsonNumber(report.sent_rps) : null,
      ", \"send_shortfall_percent\": ",
      config.open_loop ? JsonNumber(ShortfallPercent(config, report)) : null,
      ", \"throughput_rps\": ", JsonNumber(report.throughput_rps),
      ", \"requests_ok\": ", latency.count(),
      ", \"errors\": ", TotalErrors(report.total.errors),
      ", \"errors_by_code\": ", JsonCounts(report.total.errors),
      ", \"latency_us\": ", latency_json, ", \"latency_from\": ",
      JsonString(config.open_loop ? "scheduled send" : "actual send"),
      ", \"kernels\": ", JsonCounts(report.total.kernels),
      ", \"histogram\": ", histogram_json, "}");
}

// Runs the closed loop: `concurrency` workers over the connections.
LoadReport RunClosedLoop(
    const std::vector<std::unique_ptr<NibbleClient>>& clients,
    const LoadConfig& config, absl::string_view a, Clock::time_point start,
    Clock::time_point measure_start, Progress& progress) {
  const Clock::time_point measure_end =
      measure_start + absl::ToChronoNanoseconds(config.duration);
  std::vector<WorkerResult> results(config.concurrency);
  std::vector<std::thread> workers;
  for (int i = 0; i < config.concurrency; ++i) {
    workers.emplace_back(RunWorker, std::ref(*clients[i % clients.size()]),
                         std::cref(config), a, measure_start, measure_end,
                         std::ref(progress), std::ref(results[i]));
  }
  if (isatty(STDERR_FILENO))
    ShowProgress(progress, start, measure_start, measure_end);
  for (std::thread& worker : workers) worker.join();

  LoadReport report;
  for (const WorkerResult& result : results) {
    report.total.latencies.Merge(result.latencies);
    for (const auto& [label, count] : result.errors) {
      report.total.errors[label] += count;
    }
    for (const auto& [kernel, count] : result.kernels) {
      report.total.kernels[kernel] += count;
    }
  }
  report.window = config.duration;
  report.throughput_rps = static_cast<double>(report.total.latencies.count()) /
                          absl::ToDoubleSeconds(config.duration);
  return report;
}

// The connections a run sends over, and the request it sends.
struct LoadTarget {
  // Closed loop, one per connection.
  std::vector<std::unique_ptr<NibbleClient>> clients;
  // Open loop, on the same channels.
  std::vector<std::unique_ptr<v1::NibbleService::Stub>> stubs;
  v1::MatmulRequest request;
};

// One run, or one step of a sweep: the warmup, then the measured window.
LoadReport RunLoad(const LoadConfig& config, const LoadTarget& target) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point measure_start =
      start + absl::ToChronoNanoseconds(config.warmup);
  Progress progress;
  if (!config.open_loop) {
    return RunClosedLoop(target.clients, config, target.request.a(), start,
                         measure_start, progress);
  }
  // With --requests the end is only known once sent; this is its schedule.
  const Clock::time_point progress_end =
      measure_start + absl::ToChronoNanoseconds(
                          config.requests > 0
                              ? absl::Seconds(config.requests / config.rate)
                              : config.duration);
  std::thread progress_thread;
  if (isatty(STDERR_FILENO)) {
    progress_thread = std::thread(ShowProgress, std::cref(progress), start,
                                  measure_start, progress_end);
  }
  LoadReport report = RunOpenLoop(target.stubs, config, target.request, start,
                                  measure_start, progress);
  if (progress_thread.joinable()) progress_thread.join();
  return report;
}

struct SweepStep {
  LoadConfig config;
  LoadReport report;
};

// The load a step offers: its rate, or its concurrency.
double Offered(const LoadConfig& config) {
  return config.open_loop ? config.rate : config.concurrency;
}

std::string OfferedText(const LoadConfig& config) {
  return config.open_loop ? absl::StrFormat("rate %g requests/s", config.rate)
                          : absl::StrCat("concurrency ", config.concurrency);
}

double Milliseconds(int64_t microseconds) { return microseconds / 1000.0; }

// Why a sweep stops after `step`, the `index`th from 0; nothing when it goes
// on.
std::optional<std::string> StopReason(const LoadConfig& config, int index,
                                      const SweepStep& step) {
  const std::string which =
      absl::StrCat("step ", index + 1, " (", OfferedText(step.config), ")");
  const WorkerResult& total = step.report.total;
  if (!total.errors.empty()) {
    return absl::StrCat(which, " had errors: ", FormatErrors(total.errors));
  }
  if (total.latencies.count() == 0) {
    return absl::StrCat(which, " had no request finish in its measured window");
  }
  const double p99_ms = Milliseconds(total.latencies.ValueAtQuantile(0.99));
  if (config.slo_ms > 0 && p99_ms > config.slo_ms) {
    return absl::StrFormat("%s: p99 %.3f ms exceeds the SLO of %g ms", which,
                           p99_ms, config.slo_ms);
  }
  return std::nullopt;
}

void PrintHeader(const LoadConfig& config, const WeightSpec& spec) {
  std::cout << absl::StrFormat(
      "target:      %s\n"
      "weight:      %s (%s)\n"
      "m:           %d\n"
      "dtype:       %s\n",
      config.target, config.name, spec.DebugString(), config.m,
      DTypeName(config.dtype));
}

void PrintSummary(const LoadConfig& config, const WeightSpec& spec,
                  const LoadReport& report) {
  const client::LatencyHistogram& latency = report.total.latencies;
  PrintHeader(config, spec);
  if (config.open_loop) {
    std::cout << absl::StrFormat(
        "rate:        %.1f requests/s offered, %s arrivals (seed %d), at most "
        "%d in flight over %d connections\n",
        config.rate, client::ArrivalProcessName(config.arrival), config.seed,
        config.max_in_flight, config.connections);
  } else {
    std::cout << absl::StrFormat("concurrency: %d over %d connections\n",
                                 config.concurrency, config.connections);
  }
  std::cout << absl::StrFormat("duration:    %.1f s after %.1f s warmup\n",
                               absl::ToDoubleSeconds(report.window),
                               absl::ToDoubleSeconds(config.warmup));
  if (config.open_loop) {
    std::cout << absl::StrFormat(
        "sent:        %d at %.1f requests/s (%.1f %% short of the offered "
        "rate)\n",
        report.sent, report.sent_rps, ShortfallPercent(config, report));
  }
  std::cout << absl::StrFormat(
      "requests ok: %d\n"
      "errors:      %s\n"
      "throughput:  %.1f requests/s\n"
      "latency us:  p50 %d  p90 %d  p99 %d  p99.9 %d  max %d%s\n"
      "kernel:      %s\n",
      latency.count(), FormatErrors(report.total.errors), report.throughput_rps,
      latency.ValueAtQuantile(0.5), latency.ValueAtQuantile(0.9),
      latency.ValueAtQuantile(0.99), latency.ValueAtQuantile(0.999),
      latency.max(), config.open_loop ? "  (from scheduled send times)" : "",
      FormatKernels(report.total.kernels));
}

void PrintSweepHeader(const LoadConfig& config, const WeightSpec& spec) {
  PrintHeader(config, spec);
  const bool rate = config.sweep_over == SweepOver::kRate;
  std::cout << absl::StrFormat(
      "sweep:       %s %g to %g in steps of %g%s, %.1f s each after %.1f s "
      "warmup, %s\n",
      rate ? "rate" : "concurrency", config.sweep.from, config.sweep.to,
      config.sweep.step, rate ? " requests/s" : "",
      absl::ToDoubleSeconds(config.duration),
      absl::ToDoubleSeconds(config.warmup),
      config.slo_ms > 0
          ? absl::StrFormat("stopping when p99 > %g ms", config.slo_ms)
          : "stopping on errors");
}

void PrintStepLine(int index, int steps, const SweepStep& step) {
  const client::LatencyHistogram& latency = step.report.total.latencies;
  std::cout << absl::StrFormat(
      "step %d/%d  %s: throughput %.1f requests/s, p50 %.3f ms, p99 %.3f ms, "
      "errors %s\n",
      index + 1, steps, OfferedText(step.config), step.report.throughput_rps,
      Milliseconds(latency.ValueAtQuantile(0.5)),
      Milliseconds(latency.ValueAtQuantile(0.99)),
      FormatErrors(step.report.total.errors));
  std::cout.flush();
}

void PrintSweepTable(const LoadConfig& config,
                     const std::vector<SweepStep>& steps,
                     const std::optional<std::string>& stop_reason) {
  std::cout << absl::StrFormat("\n%4s  %11s  %9s  %12s  %9s  %9s  %6s\n",
                               "step", config.open_loop ? "offered/s" : "conc.",
                               "sent/s", "throughput/s", "p50 ms", "p99 ms",
                               "errors");
  for (size_t i = 0; i < steps.size(); ++i) {
    const LoadReport& report = steps[i].report;
    const client::LatencyHistogram& latency = report.total.latencies;
    std::cout << absl::StrFormat(
        "%4d  %11g  %9s  %12.1f  %9.3f  %9.3f  %6d\n", i + 1,
        Offered(steps[i].config),
        config.open_loop ? absl::StrFormat("%.1f", report.sent_rps) : "-",
        report.throughput_rps, Milliseconds(latency.ValueAtQuantile(0.5)),
        Milliseconds(latency.ValueAtQuantile(0.99)),
        TotalErrors(report.total.errors));
  }
  std::cout << "stopped:     "
            << stop_reason.value_or(absl::StrCat(
                   "no, all ", steps.size(), " steps ran without ",
                   config.slo_ms > 0 ? "errors or SLO misses" : "errors"))
            << "\n";
}

std::string SweepJson(const LoadConfig& config, const WeightSpec& spec,
                      const std::vector<SweepStep>& steps,
                      const std::optional<std::string>& stop_reason) {
  using client::JsonNumber;
  using client::JsonString;
  return absl::StrCat(
      "{\"sweep\": {\"over\": ",
      JsonString(config.sweep_over == SweepOver::kRate ? "rate"
                                                       : "concurrency"),
      ", \"from\": ", JsonNumber(config.sweep.from),
      ", \"to\": ", JsonNumber(config.sweep.to),
      ", \"step\": ", JsonNumber(config.sweep.step), ", \"step_duration_s\": ",
      JsonNumber(absl::ToDoubleSeconds(config.duration)),
      ", \"slo_ms\": ", config.slo_ms > 0 ? JsonNumber(config.slo_ms) : "null",
      "}, \"steps\": [",
      absl::StrJoin(steps, ", ",
                    [&spec](std::string* out, const SweepStep& step) {
                      absl::StrAppend(
                          out, ReportJson(step.config, spec, step.report));
                    }),
      "], \"stopped_early\": ", stop_reason.has_value() ? "true" : "false",
      ", \"stop_reason\": ",
      stop_reason.has_value() ? JsonString(*stop_reason) : "null", "}");
}

std::string CsvHeader() {
  return "offered,sent_rps,throughput_rps,errors,p50_us,p90_us,p99_us,p999_us,"
         "max_us\n";
}

// Closed loop has no sent rate, so that cell is empty.
std::string CsvRow(const LoadConfig& config, const LoadReport& report) {
  const client::LatencyHistogram& latency = report.total.latencies;
  return absl::StrFormat(
      "%g,%s,%.3f,%d,%d,%d,%d,%d,%d\n", Offered(config),
      config.open_loop ? absl::StrFormat("%.3f", report.sent_rps) : "",
      report.throughput_rps, TotalErrors(report.total.errors),
      latency.ValueAtQuantile(0.5), latency.ValueAtQuantile(0.9),
      latency.ValueAtQuantile(0.99), latency.ValueAtQuantile(0.999),
      latency.max());
}

client::Plot SweepPlot(const LoadConfig& config, const WeightSpec& spec,
                       const std::vector<SweepStep>& steps) {
  client::Plot plot;
  plot.title = absl::StrFormat("nibble-load sweep: %s, weight %s (%s), m=%d %s",
                               config.target, config.name, spec.DebugString(),
                               config.m, DTypeName(config.dtype));
  plot.x_label = config.open_loop ? "offered load (requests/s)"
                                  : "offered load (concurrency)";
  client::PlotPanel& throughput = plot.panels.emplace_back();
  throughput.y_label = "throughput (requests/s)";
  client::PlotSeries& ok = throughput.series.emplace_back();
  ok.label = "throughput";
  client::PlotPanel& latency = plot.panels.emplace_back();
  latency.y_label = "latency (ms)";
  client::PlotSeries& p50 = latency.series.emplace_back();
  p50.label = "p50";
  client::PlotSeries& p99 = latency.series.emplace_back();
  p99.label = "p99";
  if (config.slo_ms > 0) {
    latency.threshold = config.slo_ms;
    latency.threshold_label = absl::StrFormat("SLO %g ms", config.slo_ms);
  }
  for (const SweepStep& step : steps) {
    const double x = Offered(step.config);
    const client::LatencyHistogram& histogram = step.report.total.latencies;
    ok.points.emplace_back(x, step.report.throughput_rps);
    p50.points.emplace_back(x, Milliseconds(histogram.ValueAtQuantile(0.5)));
    p99.points.emplace_back(x, Milliseconds(histogram.ValueAtQuantile(0.99)));
  }
  return plot;
}

// A result file named by `flag`, opened before the run so that a bad path
// fails at once rather than after it.
absl::Status OpenOutput(absl::string_view flag, const std::string& path,
                        std::ofstream& file) {
  if (path.empty()) return absl::OkStatus();
  file.open(path);
  if (!file.is_open()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write --", flag, " file \"", path,
                     "\"; check that its directory exists"));
  }
  return absl::OkStatus();
}

// Writes `text` to `file` when it is open and closes it; false, having said
// so, when that fails.
bool WriteOutput(std::ofstream& file, const std::string& path,
                 absl::string_view text) {
  if (!file.is_open()) return true;
  file << text;
  file.close();
  if (file.fail()) {
    std::cerr << "nibble-load: writing " << path
              << " failed; is the disk full?\n";
    return false;
  }
  return true;
}

// Runs the steps of the sweep in `config` until one gives a reason to stop,
// and writes the files asked for.
int RunSweep(const LoadConfig& config, const WeightSpec& spec,
             const LoadTarget& target, std::ofstream& json_file,
             std::ofstream& csv_file, std::ofstream& plot_file) {
  PrintSweepHeader(config, spec);
  const std::vector<double> values = config.sweep.Values();
  std::vector<SweepStep> steps;
  std::optional<std::string> stop_reason;
  for (size_t i = 0; i < values.size() && !stop_reason.has_value(); ++i) {
    SweepStep& step = steps.emplace_back();
    step.config = config;
    if (config.sweep_over == SweepOver::kRate) {
      step.config.rate = values[i];
    } else {
      step.config.concurrency = static_cast<int>(values[i]);
      step.config.connections =
          std::min(config.connections, step.config.concurrency);
    }
    step.report = RunLoad(step.config, target);
    PrintStepLine(i, values.size(), step);
    stop_reason = StopReason(config, i, step);
  }
  PrintSweepTable(config, steps, stop_reason);

  std::string csv = CsvHeader();
  bool any_ok = false;
  for (const SweepStep& step : steps) {
    absl::StrAppend(&csv, CsvRow(step.config, step.report));
    any_ok = any_ok || step.report.total.latencies.count() > 0;
  }
  const bool written =
      WriteOutput(
          json_file, config.json_path,
          absl::StrCat(SweepJson(config, spec, steps, stop_reason), "\n")) &&
      WriteOutput(csv_file, config.csv_path, csv) &&
      WriteOutput(plot_file, config.plot_path,
                  client::PlotSvg(SweepPlot(config, spec, steps)));
  if (!written) return kExitFailure;
  if (!any_ok) {
    std::cerr << "nibble-load: no request succeeded in any step; see the "
                 "errors column\n";
    return kExitFailure;
  }
  return kExitOk;
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
  absl::StatusOr<LoadConfig> config = ConfigFromFlags(*command_line);
  if (!config.ok()) return UsageError(config.status().message());
  std::ofstream json_file;
  std::ofstream csv_file;
  std::ofstream plot_file;
  for (const absl::Status& status :
       {OpenOutput("json", config->json_path, json_file),
        OpenOutput("csv", config->csv_path, csv_file),
        OpenOutput("plot", config->plot_path, plot_file)}) {
    if (!status.ok()) return UsageError(status.message());
  }

  LoadTarget target;
  for (const auto& channel : ConnectChannels(*config)) {
    target.clients.push_back(
        std::make_unique<NibbleClient>(channel, config->timeout));
    target.stubs.push_back(v1::NibbleService::NewStub(channel));
  }
  absl::StatusOr<v1::WeightInfo> info =
      target.clients[0]->GetWeight(config->name);
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
  target.request.set_weight_name(config->name);
  target.request.set_m(config->m);
  target.request.set_dtype(ToProto(config->dtype));
  target.request.set_a(
      RandomMatrixBytes(config->m, spec->k, config->dtype, /*seed=*/1));

  if (config->sweep_over != SweepOver::kNone) {
    return RunSweep(*config, *spec, target, json_file, csv_file, plot_file);
  }
  const LoadReport report = RunLoad(*config, target);
  PrintSummary(*config, *spec, report);
  if (!WriteOutput(json_file, config->json_path,
                   absl::StrCat(ReportJson(*config, *spec, report), "\n")) ||
      !WriteOutput(csv_file, config->csv_path,
                   absl::StrCat(CsvHeader(), CsvRow(*config, report)))) {
    return kExitFailure;
  }
  if (report.total.latencies.count() == 0) {
    std::cerr << "nibble-load: no request succeeded in the measured window; "
                 "see the errors line\n";
    return kExitFailure;
  }
  return kExitOk;
}

}  // namespace
}  // namespace nibble

int main(int argc, char* argv[]) { return nibble::Main(argc, argv); }
