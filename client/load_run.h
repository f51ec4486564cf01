// The load runs of nibble-load: what to run (LoadConfig), where to send it
// (LoadTarget), and RunLoad, which runs one closed- or open-loop run, or one
// step of a sweep, and returns what it measured (LoadReport).
//
// Example:
//   nibble::client::LoadConfig config;  // Filled in from the flags.
//   nibble::client::LoadTarget target;
//   target.channels = nibble::client::ConnectChannels(config);
//   // ... fill in target.request ...
//   nibble::client::LoadReport report =
//       nibble::client::RunLoad(config, target);
#ifndef NIBBLE_CLIENT_LOAD_RUN_H_
#define NIBBLE_CLIENT_LOAD_RUN_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/arrival_schedule.h"
#include "client/load_recorder.h"
#include "client/nibble_client.h"
#include "client/request_sender.h"
#include "client/sweep_range.h"
#include "format/dtype.h"
#include "grpcpp/channel.h"
#include "nibble/v1/nibble.pb.h"

namespace nibble {
namespace client {

// The error a send refused by --max_in_flight counts as; not the server's.
inline constexpr absl::string_view kClientInFlightError =
    "RESOURCE_EXHAUSTED (client: too many in flight)";

// The error a reply that --verify found wrong counts as.
inline constexpr absl::string_view kVerifyMismatchError =
    "MISMATCH (client: C differs from the reference)";

// What a sweep varies from step to step.
enum class SweepOver { kNone, kRate, kConcurrency };

struct LoadConfig {
  // One or more targets, as given: HOST:PORT or a gRPC name such as
  // dns:///HOST:PORT.
  std::vector<std::string> targets;
  ConnectionOptions connection;
  // The weight; empty with LoadApi::kCheck, which sends none.
  std::string name;
  LoadApi api = LoadApi::kMatmul;
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
  // Check every verify_every-th successful reply; 0 for none.
  int64_t verify_every = 0;
  double tolerance = 0;
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

// What the report says about a whole run.
struct LoadReport {
  MeasuredTotals total;
  // One entry per second of the measured window (and of the draining after
  // it in open loop).
  std::vector<SecondStats> series;
  // The measured window: --duration, or the scheduled time of --requests.
  absl::Duration window;
  double throughput_rps = 0;
  // Open loop only: the requests sent in the window, and their rate.
  int64_t sent = 0;
  double sent_rps = 0;
  // Replies --verify compared with the reference, wrong ones included.
  int64_t verified = 0;
};

// The connections a run sends over, and the request it sends.
struct LoadTarget {
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  // Unused with LoadApi::kCheck.
  v1::MatmulRequest request;
  // With --verify: the float64 reference of C for request.a.
  std::vector<double> expected_c;
};

// One step of a sweep: its config, with that step's load, and its report.
struct SweepStep {
  LoadConfig config;
  LoadReport report;
};

// `connections` channels, spread over the targets in turn. Each has its own
// connection (a local subchannel pool) and balances round-robin over the
// addresses its target resolves to.
std::vector<std::shared_ptr<grpc::Channel>> ConnectChannels(
    const LoadConfig& config);

// One run, or one step of a sweep: the warmup, then the measured window.
LoadReport RunLoad(const LoadConfig& config, const LoadTarget& target);

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_LOAD_RUN_H_
