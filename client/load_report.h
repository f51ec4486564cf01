// The reports of nibble-load: the human summary of a run, the lines and
// table of a sweep, and the same results as JSON, CSV and an SVG plot, plus
// the opening and writing of those result files. `spec` is the weight's;
// --api=Check sends no matmul and passes nothing, and the reports leave out
// the weight, M, dtype and kernels.
//
// Example:
//   nibble::client::LoadReport report =
//       nibble::client::RunLoad(config, target);
//   nibble::client::PrintSummary(config, spec, report);
//   std::string csv = absl::StrCat(nibble::client::CsvHeader(),
//                                  nibble::client::CsvRow(config, report));
#ifndef NIBBLE_CLIENT_LOAD_REPORT_H_
#define NIBBLE_CLIENT_LOAD_REPORT_H_

#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "client/load_run.h"
#include "client/svg_plot.h"
#include "format/weight_format.h"

namespace nibble {
namespace client {

// The whole result of one run as one JSON object, without a newline.
std::string ReportJson(const LoadConfig& config,
                       const std::optional<WeightSpec>& spec,
                       const LoadReport& report);

// Why a sweep stops after `step`, the `index`th from 0; nothing when it goes
// on.
std::optional<std::string> StopReason(const LoadConfig& config, int index,
                                      const SweepStep& step);

// The summary of one run, on stdout.
void PrintSummary(const LoadConfig& config,
                  const std::optional<WeightSpec>& spec,
                  const LoadReport& report);

// What a sweep will do, on stdout, before its first step.
void PrintSweepHeader(const LoadConfig& config,
                      const std::optional<WeightSpec>& spec);

// One line on stdout as each step of a sweep ends; `index` counts from 0.
void PrintStepLine(int index, int steps, const SweepStep& step);

// A table of the steps of a sweep, and why it stopped, on stdout.
void PrintSweepTable(const LoadConfig& config,
                     const std::vector<SweepStep>& steps,
                     const std::optional<std::string>& stop_reason);

// The whole result of a sweep as one JSON object, without a newline.
std::string SweepJson(const LoadConfig& config,
                      const std::optional<WeightSpec>& spec,
                      const std::vector<SweepStep>& steps,
                      const std::optional<std::string>& stop_reason);

// The header line of the CSV file, and the row of one run or step.
std::string CsvHeader();
// Closed loop has no sent rate, so that cell is empty.
std::string CsvRow(const LoadConfig& config, const LoadReport& report);

// Throughput and p50/p99 latency against the offered load of each step.
client::Plot SweepPlot(const LoadConfig& config,
                       const std::optional<WeightSpec>& spec,
                       const std::vector<SweepStep>& steps);

// A result file named by `flag`, opened before the run so that a bad path
// fails at once rather than after it.
absl::Status OpenOutput(absl::string_view flag, const std::string& path,
                        std::ofstream& file);

// Writes `text` to `file` when it is open and closes it; false, having said
// so, when that fails.
bool WriteOutput(std::ofstream& file, const std::string& path,
                 absl::string_view text);

}  // namespace client
}  // namespace nibble

#endif  // NIBBLE_CLIENT_LOAD_REPORT_H_
