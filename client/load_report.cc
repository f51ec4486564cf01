#include "client/load_report.h"

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <iostream>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/arrival_schedule.h"
#include "client/json_text.h"
#include "client/latency_histogram.h"
#include "client/load_run.h"
#include "client/svg_plot.h"
#include "format/dtype.h"
#include "format/weight_format.h"

namespace nibble {
namespace client {
namespace {

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

int64_t MismatchCount(const absl::flat_hash_map<std::string, int64_t>& errors) {
  const auto mismatches = errors.find(kVerifyMismatchError);
  return mismatches == errors.end() ? 0 : mismatches->second;
}

// The load a step offers: its rate, or its concurrency.
double Offered(const LoadConfig& config) {
  return config.open_loop ? config.rate : config.concurrency;
}

std::string OfferedText(const LoadConfig& config) {
  return config.open_loop ? absl::StrFormat("rate %g requests/s", config.rate)
                          : absl::StrCat("concurrency ", config.concurrency);
}

double Milliseconds(int64_t microseconds) { return microseconds / 1000.0; }

void PrintHeader(const LoadConfig& config,
                 const std::optional<WeightSpec>& spec) {
  std::cout << absl::StrFormat(
      "target:      %s\n"
      "api:         %s\n",
      absl::StrJoin(config.targets, ", "), LoadApiName(config.api));
  if (!spec.has_value()) return;
  std::cout << absl::StrFormat(
      "weight:      %s (%s)\n"
      "m:           %d\n"
      "dtype:       %s\n",
      config.name, spec->DebugString(), config.m, DTypeName(config.dtype));
}

}  // namespace

std::string ReportJson(const LoadConfig& config,
                       const std::optional<WeightSpec>& spec,
                       const LoadReport& report) {
  using client::JsonNumber;
  using client::JsonString;
  const client::LatencyHistogram& latency = report.total.latencies;
  const std::string null = "null";
  const std::string config_json = absl::StrCat(
      "{\"targets\": [",
      absl::StrJoin(config.targets, ", ",
                    [](std::string* out, const std::string& target) {
                      absl::StrAppend(out, JsonString(target));
                    }),
      "], \"api\": ", JsonString(LoadApiName(config.api)),
      ", \"weight\": ", spec.has_value() ? JsonString(config.name) : null,
      ", \"weight_spec\": ",
      spec.has_value() ? JsonString(spec->DebugString()) : null,
      ", \"m\": ", spec.has_value() ? absl::StrCat(config.m) : null,
      ", \"dtype\": ",
      spec.has_value() ? JsonString(DTypeName(config.dtype)) : null,
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
      ", \"verify_every\": ",
      config.verify_every > 0 ? absl::StrCat(config.verify_every) : null, "}");
  const std::string series_json = absl::StrCat(
      "[",
      absl::StrJoin(report.series, ", ",
                    [](std::string* out, const SecondStats& second) {
                      absl::StrAppend(out, "{\"second\": ", second.second,
                                      ", \"sent\": ", second.sent,
                                      ", \"ok\": ", second.ok,
                                      ", \"errors\": ", second.errors,
                                      ", \"p50_us\": ", second.p50_us,
                                      ", \"p99_us\": ", second.p99_us, "}");
                    }),
      "]");
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
      ", \"verified\": ", report.verified, ", \"latency_us\": ", latency_json,
      ", \"latency_from\": ",
      JsonString(config.open_loop ? "scheduled send" : "actual send"),
      ", \"kernels\": ",
      spec.has_value() ? JsonCounts(report.total.kernels) : null,
      ", \"histogram\": ", histogram_json, ", \"series\": ", series_json, "}");
}

// Why a sweep stops after `step`, the `index`th from 0; nothing when it goes
// on.
std::optional<std::string> StopReason(const LoadConfig& config, int index,
                                      const SweepStep& step) {
  const std::string which =
      absl::StrCat("step ", index + 1, " (", OfferedText(step.config), ")");
  const MeasuredTotals& total = step.report.total;
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

void PrintSummary(const LoadConfig& config,
                  const std::optional<WeightSpec>& spec,
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
      "latency us:  p50 %d  p90 %d  p99 %d  p99.9 %d  max %d%s\n",
      latency.count(), FormatErrors(report.total.errors), report.throughput_rps,
      latency.ValueAtQuantile(0.5), latency.ValueAtQuantile(0.9),
      latency.ValueAtQuantile(0.99), latency.ValueAtQuantile(0.999),
      latency.max(), config.open_loop ? "  (from scheduled send times)" : "");
  if (spec.has_value()) {
    std::cout << "kernel:      " << FormatKernels(report.total.kernels) << "\n";
  }
  if (config.verify_every > 0) {
    std::cout << absl::StrFormat(
        "verified:    %d replies against the float64 reference, %d wrong\n",
        report.verified, MismatchCount(report.total.errors));
  }
}

void PrintSweepHeader(const LoadConfig& config,
                      const std::optional<WeightSpec>& spec) {
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

std::string SweepJson(const LoadConfig& config,
                      const std::optional<WeightSpec>& spec,
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

client::Plot SweepPlot(const LoadConfig& config,
                       const std::optional<WeightSpec>& spec,
                       const std::vector<SweepStep>& steps) {
  client::Plot plot;
  plot.title = absl::StrFormat("nibble-load sweep: %s %s",
                               absl::StrJoin(config.targets, ", "),
                               LoadApiName(config.api));
  if (spec.has_value()) {
    absl::StrAppendFormat(&plot.title, ", weight %s (%s), m=%d %s", config.name,
                          spec->DebugString(), config.m,
                          DTypeName(config.dtype));
  }
  plot.x_label = config.open_loop ? "offered load (requests/s)"
                                  : "offered load (concurrency)";
  // Filled first and moved in last, so that no reference into a vector
  // outlives its growth.
  client::PlotSeries ok;
  ok.label = "throughput";
  client::PlotSeries p50;
  p50.label = "p50";
  client::PlotSeries p99;
  p99.label = "p99";
  for (const SweepStep& step : steps) {
    const double x = Offered(step.config);
    const client::LatencyHistogram& histogram = step.report.total.latencies;
    ok.points.emplace_back(x, step.report.throughput_rps);
    p50.points.emplace_back(x, Milliseconds(histogram.ValueAtQuantile(0.5)));
    p99.points.emplace_back(x, Milliseconds(histogram.ValueAtQuantile(0.99)));
  }
  client::PlotPanel throughput;
  throughput.y_label = "throughput (requests/s)";
  throughput.series.push_back(std::move(ok));
  client::PlotPanel latency;
  latency.y_label = "latency (ms)";
  latency.series.push_back(std::move(p50));
  latency.series.push_back(std::move(p99));
  if (config.slo_ms > 0) {
    latency.threshold = config.slo_ms;
    latency.threshold_label = absl::StrFormat("SLO %g ms", config.slo_ms);
  }
  plot.panels.push_back(std::move(throughput));
  plot.panels.push_back(std::move(latency));
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

}  // namespace client
}  // namespace nibble
