// nibble-load: a load generator for nibble servers. Closed loop
// (--concurrency C), C chains of requests each send the next as the previous
// one's reply comes. Open loop (--rate), one thread sends at scheduled times
// whatever the replies do, and latency counts from each request's scheduled
// send time, so a stalled server shows in the percentiles. Requests go out
// asynchronously as unary Matmul, over MatmulStreams or as KServe ModelInfer
// (--api), or as grpc.health.v1 Check to time the RPC without the matmul, to
// one target, a list, or a name balanced round-robin; --verify
// checks replies against the float64 reference. The report gives throughput,
// latency percentiles from log-bucketed histograms, errors by status code and
// a per-second series; --json writes it as one JSON object. A sweep
// (--sweep_rate, --sweep_concurrency) runs one such step per load level, stops
// at the first step over the --slo or with errors, and can also write a CSV
// row per step and an SVG plot of throughput and latency against load.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "base/command_line.h"
#include "client/arrival_schedule.h"
#include "client/connection_flags.h"
#include "client/load_report.h"
#include "client/load_run.h"
#include "client/matrix_bytes.h"
#include "client/nibble_client.h"
#include "client/proto_conversions.h"
#include "client/request_sender.h"
#include "client/svg_plot.h"
#include "client/sweep_range.h"
#include "client/weight_files.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "nibble/v1/nibble.grpc.pb.h"

ABSL_FLAG(std::string, target, "localhost:50051",
          "HOST:PORT of the nibble server; a comma-separated list spreads the "
          "connections over several, and a name such as dns:///HOST:PORT "
          "balances each connection round-robin over its addresses");
ABSL_FLAG(std::string, name, "",
          "resident weight to multiply with (not with --api=Check)");
ABSL_FLAG(std::string, api, "Matmul",
          "what to send: Matmul (unary), MatmulStream (one bidirectional "
          "stream per connection), ModelInfer (KServe v2) or Check (the "
          "grpc.health.v1 health check of the whole server, no matmul: what "
          "the RPC alone costs; a reply other than SERVING is an error)");
ABSL_FLAG(int64_t, m, 1, "rows of A per request");
ABSL_FLAG(std::string, dtype, "f32", "type of A and C: f32, f16 or bf16");
ABSL_FLAG(std::optional<std::string>, input, std::nullopt,
          "file of A [M, K] in --dtype (raw, row-major); random otherwise");
ABSL_FLAG(int64_t, verify, 0,
          "check every Nth successful reply against the float64 reference "
          "(needs the weight's data: --random or --qweight/--scales); wrong "
          "ones count as errors");
ABSL_FLAG(double, tolerance, 1e-2,
          "--verify: largest max relative error accepted (kernels that round "
          "A to bf16 stay near 2e-3)");
ABSL_FLAG(std::optional<uint64_t>, random, std::nullopt,
          "--verify: seed of the random weight the server was given");
ABSL_FLAG(std::optional<std::string>, qweight, std::nullopt,
          "--verify: qweight file of the weight");
ABSL_FLAG(std::optional<std::string>, scales, std::nullopt,
          "--verify: scales file of the weight");
ABSL_FLAG(std::optional<std::string>, zeros, std::nullopt,
          "--verify: zeros file of the weight (u4 only)");
ABSL_FLAG(int, concurrency, 8,
          "closed loop: requests kept in flight, each sent as the previous "
          "one's reply comes");
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

constexpr absl::string_view kFlags[] = {"target",        "name",
                                        "api",           "m",
                                        "dtype",         "input",
                                        "concurrency",   "rate",
                                        "arrival",       "seed",
                                        "requests",      "max_in_flight",
                                        "connections",   "duration",
                                        "warmup",        "timeout",
                                        "verify",        "tolerance",
                                        "random",        "qweight",
                                        "scales",        "zeros",
                                        "json",          "csv",
                                        "sweep_rate",    "sweep_concurrency",
                                        "step_duration", "slo",
                                        "plot",          "tls",
                                        "tls_ca",        "tls_cert",
                                        "tls_key",       "auth_token_file"};

// Flags that only make sense with --verify.
constexpr absl::string_view kVerifyFlags[] = {"tolerance", "random", "qweight",
                                              "scales", "zeros"};

// Flags that describe the matmul, which --api=Check does not send; the
// --verify flags need --verify itself.
constexpr absl::string_view kMatmulFlags[] = {"name", "m", "dtype", "input",
                                              "verify"};

// Flags that only make sense in a sweep.
constexpr absl::string_view kSweepFlags[] = {"step_duration", "slo", "plot"};

// Flags that a sweep sets per step instead.
constexpr absl::string_view kNotInSweepFlags[] = {"rate", "concurrency",
                                                  "duration", "requests"};

// Flags that only make sense with --rate.
constexpr absl::string_view kOpenLoopFlags[] = {"arrival", "seed", "requests",
                                                "max_in_flight"};

using client::ConnectChannels;
using client::CsvHeader;
using client::CsvRow;
using client::LoadConfig;
using client::LoadReport;
using client::LoadTarget;
using client::OpenOutput;
using client::PrintStepLine;
using client::PrintSummary;
using client::PrintSweepHeader;
using client::PrintSweepTable;
using client::ReportJson;
using client::RunLoad;
using client::StopReason;
using client::SweepJson;
using client::SweepOver;
using client::SweepPlot;
using client::SweepStep;
using client::ToProto;
using client::WeightSpecFromInfo;
using client::WriteOutput;

int UsageError(absl::string_view message) {
  std::cerr << "nibble-load: " << message
            << "\n(`nibble-load --help` lists the flags)\n";
  return kExitUsage;
}

std::string Usage() {
  return absl::StrCat(
      "usage: nibble-load (--name NAME | --api Check) [--target "
      "HOST:PORT[,HOST:PORT...] | dns:///NAME:PORT]\n"
      "                   [--api Matmul|MatmulStream|ModelInfer] [--m M] "
      "[--dtype f32|f16|bf16] [--input FILE]\n"
      "                   [--concurrency C | --rate R [--arrival "
      "constant|poisson] [--seed S]\n"
      "                   [--requests N] [--max_in_flight F]] [--connections "
      "N] [--timeout DURATION]\n"
      "                   [--duration SECONDS] [--warmup SECONDS] "
      "[--json FILE] [--csv FILE]\n"
      "                   [--verify N (--random SEED | --qweight FILE "
      "--scales FILE [--zeros FILE])\n"
      "                    [--tolerance X]]\n"
      "                   [--tls | --tls_ca FILE] [--tls_cert FILE --tls_key "
      "FILE] [--auth_token_file FILE]\n"
      "       nibble-load --name NAME (--sweep_rate FROM:TO:STEP | "
      "--sweep_concurrency FROM:TO:STEP)\n"
      "                   [--step_duration SECONDS] [--slo MS] [--plot "
      "FILE.svg] [other flags as above]\n\n"
      "Sends requests on a resident weight, C at a time (closed loop), or at "
      "R requests/s\nwhatever the replies (open loop; latency counts from "
      "each request's scheduled send\ntime), then reports throughput, "
      "latency percentiles and errors by status code. A sweep\nruns one step "
      "per rate or concurrency and stops at the first step whose p99 "
      "exceeds\n--slo or that has errors. --api=Check sends health checks "
      "instead of matmuls, to\nmeasure what the RPC alone costs. Exits 1 "
      "when no request succeeded.\n\nflags:\n",
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
  config.targets = absl::StrSplit(absl::GetFlag(FLAGS_target), ',');
  for (const std::string& target : config.targets) {
    if (target.empty()) {
      return absl::InvalidArgumentError(
          "--target has an empty entry: give HOST:PORT, or several separated "
          "by commas");
    }
  }
  absl::StatusOr<client::LoadApi> api =
      client::ParseLoadApi(absl::GetFlag(FLAGS_api));
  if (!api.ok()) return api.status();
  config.api = *api;
  if (config.api == client::LoadApi::kCheck) {
    for (absl::string_view flag : kMatmulFlags) {
      if (FlagGiven(command_line, flag)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag,
            " does not go with --api=Check: a health check has no weight, A "
            "or C"));
      }
    }
  }
  config.name = absl::GetFlag(FLAGS_name);
  if (config.name.empty() && config.api != client::LoadApi::kCheck) {
    return absl::InvalidArgumentError(
        "--name is required: the resident weight to multiply with");
  }
  absl::StatusOr<ConnectionOptions> connection = ConnectionOptionsFromFlags();
  if (!connection.ok()) return connection.status();
  config.connection = *std::move(connection);
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
  // More connections than closed-loop chains would leave some idle, fewer
  // than targets would leave some targets idle.
  if (!config.open_loop) {
    config.connections = std::min(config.connections,
                                  config.sweep_over == SweepOver::kConcurrency
                                      ? static_cast<int>(config.sweep.to)
                                      : config.concurrency);
  }
  config.connections =
      std::max(config.connections, static_cast<int>(config.targets.size()));
  config.verify_every = absl::GetFlag(FLAGS_verify);
  if (config.verify_every < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--verify must be 0 (off) or a positive N, got ", config.verify_every));
  }
  if (config.verify_every == 0) {
    for (absl::string_view flag : kVerifyFlags) {
      if (FlagGiven(command_line, flag)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--", flag, " serves --verify only: add --verify N or drop it"));
      }
    }
  }
  config.tolerance = absl::GetFlag(FLAGS_tolerance);
  if (!(config.tolerance >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tolerance must not be negative, got ", config.tolerance));
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

// The weight's spec, as each listed target describes it; they must agree.
absl::StatusOr<WeightSpec> LookUpWeight(const LoadConfig& config) {
  std::optional<WeightSpec> first;
  for (const std::string& target : config.targets) {
    NibbleClient client(CreateChannel(target, config.connection),
                        config.timeout);
    absl::StatusOr<v1::WeightInfo> info = client.GetWeight(config.name);
    if (!info.ok()) {
      return absl::Status(
          info.status().code(),
          absl::StrCat(
              "looking up weight \"", config.name, "\" on ", target,
              " failed: ", absl::StatusCodeToString(info.status().code()), ": ",
              info.status().message()));
    }
    absl::StatusOr<WeightSpec> spec = WeightSpecFromInfo(*info);
    if (!spec.ok()) {
      return absl::InternalError(
          absl::StrCat("the server ", target, " describes weight \"",
                       config.name, "\" oddly: ", spec.status().message()));
    }
    if (first.has_value() && !(*spec == *first)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "weight \"", config.name, "\" is ", spec->DebugString(), " on ",
          target, " but ", first->DebugString(), " on ", config.targets[0],
          ": every target must hold the same weight"));
    }
    first = *spec;
  }
  return *first;
}

// The channels, the request with its A, and with --verify the reference C.
absl::StatusOr<LoadTarget> MakeLoadTarget(const LoadConfig& config,
                                          const WeightSpec& spec) {
  LoadTarget target;
  target.channels = ConnectChannels(config);
  target.request.set_weight_name(config.name);
  target.request.set_m(config.m);
  target.request.set_dtype(ToProto(config.dtype));
  if (const std::optional<std::string> input = absl::GetFlag(FLAGS_input)) {
    absl::StatusOr<std::string> a =
        ReadMatrixFile(*input, config.m, spec.k, config.dtype);
    if (!a.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--input: ", a.status().message(),
                       " (M from --m, K of weight \"", config.name, "\")"));
    }
    target.request.set_a(*std::move(a));
  } else {
    target.request.set_a(
        RandomMatrixBytes(config.m, spec.k, config.dtype, /*seed=*/1));
  }
  if (config.verify_every == 0) return target;

  absl::StatusOr<std::optional<WeightSource>> source = MakeWeightSource(
      spec.format, absl::GetFlag(FLAGS_random), absl::GetFlag(FLAGS_qweight),
      absl::GetFlag(FLAGS_scales), absl::GetFlag(FLAGS_zeros));
  if (!source.ok()) return source.status();
  if (!source->has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--verify needs the data of weight \"", config.name,
                     "\" (", spec.DebugString(), "): ", kWeightSourceHint,
                     " with the seed it was uploaded with"));
  }
  absl::StatusOr<QuantizedWeight> weight = LoadWeight(spec, **source);
  if (!weight.ok()) return weight.status();
  target.expected_c =
      ReferenceMatmul(MatrixBytesToDoubles(config.dtype, target.request.a()),
                      config.m, *weight);
  return target;
}

// Runs the steps of the sweep in `config` until one gives a reason to stop,
// and writes the files asked for.
int RunSweep(const LoadConfig& config, const std::optional<WeightSpec>& spec,
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

  // A health check needs no weight, so there is nothing to look up.
  std::optional<WeightSpec> spec;
  LoadTarget target;
  if (config->api == client::LoadApi::kCheck) {
    target.channels = ConnectChannels(*config);
  } else {
    absl::StatusOr<WeightSpec> found = LookUpWeight(*config);
    if (!found.ok()) {
      std::cerr << "nibble-load: " << found.status().message() << "\n";
      return kExitFailure;
    }
    spec = *found;
    absl::StatusOr<LoadTarget> made = MakeLoadTarget(*config, *spec);
    if (!made.ok()) return UsageError(made.status().message());
    target = *std::move(made);
  }

  if (config->sweep_over != SweepOver::kNone) {
    return RunSweep(*config, spec, target, json_file, csv_file, plot_file);
  }
  const LoadReport report = RunLoad(*config, target);
  PrintSummary(*config, spec, report);
  if (!WriteOutput(json_file, config->json_path,
                   absl::StrCat(ReportJson(*config, spec, report), "\n")) ||
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

int main(int argc, char* argv[]) {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return nibble::Main(argc, argv);
}
