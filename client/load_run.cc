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
#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/arrival_schedule.h"
#include "client/load_recorder.h"
#include "client/matrix_bytes.h"
#include "client/nibble_client.h"
#include "client/request_sender.h"
#include "format/reference.h"
#include "grpc/grpc.h"

namespace nibble {
namespace client {
namespace {

using Clock = LoadClock;

int64_t Microseconds(Clock::duration duration) {
  return std::chrono::duration_cast<std::chrono::microseconds>(duration)
      .count();
}

// Files each reply with the recorder, after checking every
// verify_every-th successful one against the reference.
class ReplyHandler {
 public:
  ReplyHandler(const LoadConfig& config, const LoadTarget& target,
               LoadRecorder& recorder)
      : config_(config), target_(target), recorder_(recorder) {}

  // Latency counts from `start`; only `measured` replies reach the totals.
  void Handle(Reply reply, Clock::time_point start, Clock::time_point finish,
              bool measured) {
    if (!reply.status.ok()) {
      recorder_.RecordError(
          finish,
          absl::StatusCodeToString(
              static_cast<absl::StatusCode>(reply.status.error_code())),
          measured);
      return;
    }
    if (config_.verify_every > 0 &&
        ok_replies_.fetch_add(1, std::memory_order_relaxed) %
                config_.verify_every ==
            0) {
      if (measured) verified_.fetch_add(1, std::memory_order_relaxed);
      if (!Matches(reply.c)) {
        recorder_.RecordError(finish, kVerifyMismatchError, measured);
        return;
      }
    }
    recorder_.RecordOk(finish, Microseconds(finish - start), reply.kernel,
                       measured);
  }

  int64_t verified() const { return verified_.load(); }

 private:
  bool Matches(absl::string_view c) const {
    if (c.size() != target_.expected_c.size() * DTypeSize(config_.dtype)) {
      return false;
    }
    const double error = MaxRelativeError(
        MatrixBytesToDoubles(config_.dtype, c), target_.expected_c);
    return error <= config_.tolerance;
  }

  const LoadConfig& config_;
  const LoadTarget& target_;
  LoadRecorder& recorder_;
  std::atomic<int64_t> ok_replies_{0};
  std::atomic<int64_t> verified_{0};
};

std::string Milliseconds(int64_t microseconds) {
  return absl::StrFormat("%.2f ms", microseconds / 1e3);
}

// Prints a line after each second of the clock until `end`, overwriting the
// last one: that second's replies per second and latencies, and the totals.
void ShowProgress(LoadRecorder& recorder, Clock::time_point measure_start,
                  Clock::time_point end) {
  // Just after each whole second from measure_start, so that it has ended.
  constexpr auto kSettle = std::chrono::milliseconds(20);
  for (Clock::time_point tick = measure_start + kSettle;;
       tick += std::chrono::seconds(1)) {
    if (tick <= Clock::now()) continue;
    if (tick > end) break;
    std::this_thread::sleep_until(tick);
    const LoadRecorder::ProgressSnapshot progress = recorder.Progress(tick);
    if (!progress.last_second.has_value()) continue;
    const SecondStats& second = *progress.last_second;
    std::cerr << absl::StrFormat(
        "\r%4ds %-9s %8d replies/s %6d errors/s  p50 %s  p99 %s  (%d ok, %d "
        "errors) \x1b[K",
        second.second < 0 ? second.second : second.second + 1,
        second.second < 0 ? "warmup" : "measuring", second.ok + second.errors,
        second.errors, Milliseconds(second.p50_us), Milliseconds(second.p99_us),
        progress.ok, progress.errors);
  }
  std::cerr << "\r\x1b[K";
}

// Runs the closed loop: `concurrency` chains of requests, each sending the
// next as the previous one's reply comes.
void RunClosedLoop(const LoadConfig& config, RequestSender& sender,
                   ReplyHandler& handler, LoadRecorder& recorder,
                   Clock::time_point measure_start,
                   Clock::time_point measure_end) {
  std::mutex mutex;
  std::condition_variable all_stopped;
  int running = config.concurrency;
  std::function<void(int)> send_next = [&](int chain) {
    const Clock::time_point sent = Clock::now();
    recorder.RecordSent(sent);
    sender.Send(chain, [&, chain, sent](Reply reply) {
      const Clock::time_point finish = Clock::now();
      // Only requests that finish inside the window count, so that
      // throughput is completions per second of the window.
      handler.Handle(std::move(reply), sent, finish,
                     finish >= measure_start && finish < measure_end);
      if (finish < measure_end) {
        send_next(chain);
        return;
      }
      std::lock_guard<std::mutex> lock(mutex);
      if (--running == 0) all_stopped.notify_all();
    });
  };
  for (int chain = 0; chain < config.concurrency; ++chain) send_next(chain);
  std::unique_lock<std::mutex> lock(mutex);
  all_stopped.wait(lock, [&running] { return running == 0; });
}

struct OpenLoopSends {
  int64_t sent = 0;
  Clock::time_point last_send;
  // End of the measured window: measure_end, or with --requests the
  // scheduled time after the last measured send.
  Clock::time_point window_end;
};

// Sends on the schedule from `start`, spread over the connections in turn,
// without waiting for replies. Requests scheduled before `measure_start` are
// warmup and not counted. `in_flight` counts the requests not yet answered;
// it must outlive the replies.
OpenLoopSends RunOpenLoop(const LoadConfig& config, RequestSender& sender,
                          ReplyHandler& handler, LoadRecorder& recorder,
                          std::atomic<int>& in_flight, Clock::time_point start,
                          Clock::time_point measure_start) {
  const Clock::time_point measure_end =
      measure_start + absl::ToChronoNanoseconds(config.duration);
  client::ArrivalSchedule schedule(config.arrival, config.rate, config.seed);
  OpenLoopSends sends;
  sends.last_send = measure_start;
  int64_t scheduled = 0;  // Measured, refused ones included.
  for (size_t i = 0;; ++i) {
    const Clock::time_point intended =
        start + absl::ToChronoNanoseconds(schedule.Next());
    const bool measured = intended >= measure_start;
    if (measured && (config.requests > 0 ? scheduled == config.requests
                                         : intended >= measure_end)) {
      sends.window_end = config.requests > 0 ? intended : measure_end;
      break;
    }
    // A sender running late sends at once; the latency still counts from
    // `intended`.
    std::this_thread::sleep_until(intended);
    if (measured) ++scheduled;
    if (in_flight.fetch_add(1, std::memory_order_relaxed) >=
        config.max_in_flight) {
      in_flight.fetch_sub(1, std::memory_order_relaxed);
      recorder.RecordError(Clock::now(), kClientInFlightError, measured);
      continue;
    }
    const Clock::time_point now = Clock::now();
    recorder.RecordSent(now);
    sender.Send(i, [&handler, &in_flight, intended, measured](Reply reply) {
      handler.Handle(std::move(reply), intended, Clock::now(), measured);
      in_flight.fetch_sub(1, std::memory_order_relaxed);
    });
    if (measured) {
      ++sends.sent;
      sends.last_send = now;
    }
  }
  return sends;
}

double Seconds(Clock::duration duration) {
  return std::chrono::duration<double>(duration).count();
}

}  // namespace

std::vector<std::shared_ptr<grpc::Channel>> ConnectChannels(
    const LoadConfig& config) {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < config.connections; ++i) {
    grpc::ChannelArguments arguments = DefaultChannelArguments();
    arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    arguments.SetLoadBalancingPolicyName("round_robin");
    channels.push_back(CreateChannel(config.targets[i % config.targets.size()],
                                     config.connection, arguments));
  }
  return channels;
}

LoadReport RunLoad(const LoadConfig& config, const LoadTarget& target) {
  const Clock::time_point start = Clock::now();
  const Clock::time_point measure_start =
      start + absl::ToChronoNanoseconds(config.warmup);
  // With --requests the end is only known once sent; this is its schedule.
  const Clock::time_point scheduled_end =
      measure_start + absl::ToChronoNanoseconds(
                          config.open_loop && config.requests > 0
                              ? absl::Seconds(config.requests / config.rate)
                              : config.duration);
  LoadRecorder recorder(measure_start);
  ReplyHandler handler(config, target, recorder);
  std::unique_ptr<RequestSender> sender = MakeRequestSender(
      config.api, target.channels, target.request,
      {.timeout = config.timeout,
       .stream_timeout = config.warmup + config.duration * 2 + config.timeout +
                         (config.open_loop && config.requests > 0
                              ? absl::Seconds(config.requests / config.rate)
                              : absl::ZeroDuration())});
  std::thread progress_thread;
  if (isatty(STDERR_FILENO)) {
    progress_thread = std::thread(ShowProgress, std::ref(recorder),
                                  measure_start, scheduled_end);
  }

  LoadReport report;
  if (config.open_loop) {
    std::atomic<int> in_flight{0};
    const OpenLoopSends sends = RunOpenLoop(config, *sender, handler, recorder,
                                            in_flight, start, measure_start);
    sender->Finish();
    report.window = absl::FromChrono(sends.window_end - measure_start);
    report.sent = sends.sent;
    // A sender or server that fell behind stretches the time taken.
    report.sent_rps =
        report.sent / std::max(Seconds(sends.window_end - measure_start),
                               Seconds(sends.last_send - measure_start));
  } else {
    RunClosedLoop(config, *sender, handler, recorder, measure_start,
                  scheduled_end);
    sender->Finish();
    report.window = config.duration;
  }
  const Clock::time_point finish = Clock::now();
  if (progress_thread.joinable()) progress_thread.join();
  RunResult result = recorder.Finish(finish);
  report.total = std::move(result.totals);
  report.series = std::move(result.series);
  report.verified = handler.verified();
  // In open loop the replies to the last sends may come after the window.
  const double seconds = config.open_loop
                             ? std::max(absl::ToDoubleSeconds(report.window),
                                        Seconds(finish - measure_start))
                             : absl::ToDoubleSeconds(report.window);
  report.throughput_rps = report.total.latencies.count() / seconds;
  return report;
}

}  // namespace client
}  // namespace nibble
