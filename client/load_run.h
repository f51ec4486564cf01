// The load runs of nibble-load: what to run (LoadConfig), where to send it
// (LoadTarget), and RunLoad, which runs one closed- or open-loop run, or one
// step of a sweep, and returns what it measured (LoadReport).
//
// Example:
//   nibble::client::LoadConfig config;  // Filled in from the flags.
//   nibble::client::LoadTarget target;
//   for (const auto& channel : nibble::client::ConnectChannels(config)) {
//     target.clients.push_back(
//         std::make_unique<nibble::NibbleClient>(channel, config.timeout));
//     target.stubs.push_back(nibble::v1::NibbleService::NewStub(channel));
//   }
//   // ... fill in target.request ...
//   nibble::client::LoadReport report =
//       nibble::client::RunLoad(config, target);
#ifndef NIBBLE_CLIENT_LOAD_RUN_H_
#define NIBBLE_CLIENT_LOAD_RUN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/arrival_schedule.h"
#include "client/latency_histogram.h"
#include "client/nibble_client.h"
#include "client/sweep_range.h"
#include "grpcpp/channel.h"
#include "kernels/dtype.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble {
namespace client {

// The error a send refused by --max_in_flight counts as; not the server's.
inline constexpr absl::string_view kClientInFlightError =
    "RESOURCE_EXHAUSTED (client: too many in flight)";

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

// The connections a run sends over, and the request it sends.
struct LoadTarget {
  // Closed loop, one per connection.
  std::vector<std::unique_ptr<NibbleClient>> clients;
  // Open loop, on the same channels.
  std::vector<std::unique_ptr<v1::NibbleService::Stub>> stubs;
  v1::MatmulRequest request;
};

// One step of a sweep: its config, with that step's load, and its report.
struct SweepStep {
  LoadConfig config;
  LoadReport report;
};

// One channel per connection: a local subchannel pool keeps gRPC from
// sharing one connection between channels.
std::vector<std::shared_ptr<grpc::Channel>> ConnectChannels(
    const LoadConfig& config);

// One run, or one step of a sweep: the warmup, then the measured window.
LoadReport RunLoad(const LoadConfig& config, const LoadTarget& target);

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_LOAD_RUN_H_
