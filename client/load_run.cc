#include "client/load_run.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/arrival_schedule.h"
#include "client/latency_histogram.h"
#include "client/nibble_client.h"
#include "grpc/grpc.h"
#include "grpcpp/client_context.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble {
namespace client {
namespace {

// Steady, unlike absl::Now(), so that clock adjustments cannot skew latencies.
using Clock = std::chrono::steady_clock;

// Requests finished so far, warmup included, for the progress line.
struct Progress {
  std::atomic<int64_t> ok{0};
  std::atomic<int64_t> failed{0};
};

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

}  // namespace

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

}  // namespace client
}  // namespace nibble
