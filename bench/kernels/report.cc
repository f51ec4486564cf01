#include "bench/kernels/report.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "format/weight_format.h"

namespace nibble::bench {
namespace {

double FloorMicros(int64_t bytes, double read_gbps) {
  return read_gbps > 0 ? static_cast<double>(bytes) / (read_gbps * 1e3) : 0;
}

std::string Number(double value) { return absl::StrFormat("%.3f", value); }

// The fields every timing row has, in the order they are written.
struct Row {
  absl::string_view backend;
  absl::string_view kernel;
  absl::string_view variant;
  bool pick = false;
  absl::string_view format;
  int64_t group = 0;
  int64_t m = 0;
  Shape shape;
  int threads = 1;
  Timing timing;
  int64_t bytes = 0;
};

std::string RowJson(const Row& row, double read_gbps) {
  const double us = row.timing.median_us;
  return absl::StrCat(
      "{\"backend\":", JsonString(row.backend),
      ",\"kernel\":", JsonString(row.kernel),
      ",\"variant\":", JsonString(row.variant),
      ",\"pick\":", row.pick ? "true" : "false",
      ",\"format\":", JsonString(row.format), ",\"group\":", row.group,
      ",\"m\":", row.m, ",\"k\":", row.shape.k, ",\"n\":", row.shape.n,
      ",\"threads\":", row.threads, ",\"median_us\":", Number(us),
      ",\"calls\":", row.timing.calls, ",\"bytes\":", row.bytes,
      ",\"gbps\":", Number(GigabytesPerSecond(row.bytes, us)),
      ",\"gflops\":", Number(Gflops(row.m, row.shape.k, row.shape.n, us)),
      ",\"floor_us\":", Number(FloorMicros(row.bytes, read_gbps)), "}");
}

std::string MachineJson(const ReportContext& context) {
  const MachineLimits& limits = context.limits;
  return absl::StrCat(
      "{\"machine\":{\"cpu\":", JsonString(limits.cpu_model),
      ",\"threads\":", limits.threads, ",\"llc_bytes\":", limits.llc_bytes,
      ",\"read_gbps\":", Number(limits.read_gbps),
      ",\"read_buffer_bytes\":", limits.read_buffer_bytes,
      ",\"fma_peak_gflops\":", Number(limits.fma_peak_gflops),
      ",\"fma_isa\":", JsonString(limits.fma_isa),
      ",\"wake_us\":", Number(limits.wake_us),
      ",\"kernel_isa\":", JsonString(context.kernel_isa), ",\"openblas\":",
      context.openblas ? JsonString(context.openblas_description) : "null",
      ",\"tuning_table\":", JsonString(context.tuning_table),
      ",\"repeats\":", context.repeats,
      ",\"dtype\":", JsonString(DTypeName(context.dtype)), "}}");
}

std::optional<double> SgemmMicros(const std::vector<SgemmResult>& sgemm,
                                  const Shape& shape, int64_t m) {
  for (const SgemmResult& result : sgemm) {
    if (result.shape == shape && result.m == m) return result.timing.median_us;
  }
  return std::nullopt;
}

std::string Mebibytes(int64_t bytes) {
  return absl::StrFormat("%.0f MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string TableHeader(const ReportContext& context) {
  const MachineLimits& limits = context.limits;
  std::string header = absl::StrFormat(
      "nibble-bench: %s, %d threads, %s kernels, tuning table %s\n",
      limits.cpu_model, limits.threads, context.kernel_isa,
      context.tuning_table);
  absl::StrAppendFormat(
      &header, "  read bandwidth  %.1f GB/s (best of %d reads of %s; LLC %s)\n",
      limits.read_gbps, kReadBandwidthPasses,
      Mebibytes(limits.read_buffer_bytes),
      limits.llc_bytes > 0 ? Mebibytes(limits.llc_bytes) : "unknown");
  absl::StrAppendFormat(&header, "  fp32 FMA peak   %.1f GFLOP/s (%s)\n",
                        limits.fma_peak_gflops, limits.fma_isa);
  absl::StrAppendFormat(&header,
                        "  wake-up         %.1f us until every thread runs its "
                        "piece (median of %d calls after idle)\n",
                        limits.wake_us, kWakeUpCalls);
  absl::StrAppendFormat(&header, "  baseline        OpenBLAS sgemm: %s\n",
                        context.openblas_description);
  absl::StrAppendFormat(
      &header,
      "  times           median us of up to %d calls after a warm-up, each "
      "reading a weight copy that is not in cache; A and C in %s\n",
      context.repeats, DTypeName(context.dtype));
  absl::StrAppend(
      &header,
      "  columns         pick = the scheduler's variant (int8: the int8 "
      "kernel), x best = its time over the best; GB/s, GFLOP/s and %peak of "
      "the best\n\n");
  absl::StrAppendFormat(
      &header,
      "%-6s %5s %5s %6s %6s %9s %9s %9s  %-16s %6s %9s %6s %8s %6s "
      "%9s %7s\n",
      "format", "group", "m", "k", "n", "fused", "dbl_buf", "striped", "pick",
      "x best", "floor_us", "GB/s", "GFLOP/s", "%peak", "sgemm_us", "speedup");
  return header;
}

std::string TableLine(const ReportContext& context, const PointResult& result,
                      const std::vector<SgemmResult>& sgemm) {
  std::string line = absl::StrFormat(
      "%-6s %5d %5d %6d %6d", WeightFormatName(result.weight.format),
      result.weight.group_size, result.m, result.shape.k, result.shape.n);
  for (KernelVariant variant : kFastVariants) {
    std::string cell = "-";
    for (const KernelTiming& timing : result.kernels) {
      if (timing.variant == variant) {
        cell = absl::StrFormat("%.1f", timing.timing.median_us);
        break;
      }
    }
    absl::StrAppendFormat(&line, " %9s", cell);
  }

  const KernelTiming* best = nullptr;
  const KernelTiming* pick = nullptr;
  for (const KernelTiming& timing : result.kernels) {
    if (best == nullptr || timing.timing.median_us < best->timing.median_us) {
      best = &timing;
    }
    if (timing.pick) pick = &timing;
  }
  if (pick != nullptr) {
    absl::StrAppendFormat(
        &line, "  %-16s %6.2f",
        pick->int8 ? "int8" : KernelVariantName(pick->variant),
        pick->timing.median_us / best->timing.median_us);
  } else {
    absl::StrAppendFormat(&line, "  %-16s %6s", result.pick + "*", "-");
  }
  const double floor_us =
      FloorMicros(result.weight_bytes, context.limits.read_gbps);
  if (best == nullptr) {
    absl::StrAppendFormat(&line, " %9.1f %6s %8s %6s", floor_us, "-", "-", "-");
  } else {
    const double us = best->timing.median_us;
    const double gflops = Gflops(result.m, result.shape.k, result.shape.n, us);
    absl::StrAppendFormat(&line, " %9.1f %6.1f %8.1f %5.1f%%", floor_us,
                          GigabytesPerSecond(result.weight_bytes, us), gflops,
                          context.limits.fma_peak_gflops > 0
                              ? 100 * gflops / context.limits.fma_peak_gflops
                              : 0.0);
  }
  const std::optional<double> sgemm_us =
      SgemmMicros(sgemm, result.shape, result.m);
  if (sgemm_us.has_value() && best != nullptr) {
    absl::StrAppendFormat(&line, " %9.1f %6.2fx", *sgemm_us,
                          *sgemm_us / best->timing.median_us);
  } else {
    absl::StrAppendFormat(&line, " %9s %7s", "-", "-");
  }
  return line + "\n";
}

}  // namespace

double GigabytesPerSecond(int64_t bytes, double micros) {
  return micros > 0 ? static_cast<double>(bytes) / (micros * 1e3) : 0;
}

double Gflops(int64_t m, int64_t k, int64_t n, double micros) {
  return micros > 0 ? 2.0 * m * k * n / (micros * 1e3) : 0;
}

bool OpenOutput(absl::string_view program, const std::string& path,
                std::ofstream& file) {
  file.open(path, std::ios::trunc);
  if (file) return true;
  absl::FPrintF(stderr, "%s: cannot write %s: %s\n", program, path,
                std::strerror(errno));
  return false;
}

std::string JsonString(absl::string_view text) {
  std::string json = "\"";
  for (const char c : text) {
    switch (c) {
      case '"':
        json += "\\\"";
        break;
      case '\\':
        json += "\\\\";
        break;
      case '\n':
        json += "\\n";
        break;
      case '\t':
        json += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          absl::StrAppendFormat(&json, "\\u%04x", c);
        } else {
          json += c;
        }
    }
  }
  return json + "\"";
}

std::vector<std::string> JsonLines(const ReportContext& context,
                                   const std::vector<PointResult>& results,
                                   const std::vector<SgemmResult>& sgemm) {
  std::vector<std::string> lines = {MachineJson(context)};
  const double read_gbps = context.limits.read_gbps;
  for (const PointResult& result : results) {
    for (const KernelTiming& timing : result.kernels) {
      lines.push_back(
          RowJson(Row{.backend = "cpu",
                      .kernel = timing.kernel,
                      .variant = KernelVariantName(timing.variant),
                      .pick = timing.pick,
                      .format = WeightFormatName(result.weight.format),
                      .group = result.weight.group_size,
                      .m = result.m,
                      .shape = result.shape,
                      .threads = result.threads,
                      .timing = timing.timing,
                      .bytes = result.weight_bytes},
                  read_gbps));
    }
  }
  for (const SgemmResult& result : sgemm) {
    lines.push_back(RowJson(Row{.backend = "openblas",
                                .kernel = "sgemm",
                                .variant = "sgemm",
                                .format = "f32",
                                .m = result.m,
                                .shape = result.shape,
                                .threads = result.threads,
                                .timing = result.timing,
                                .bytes = result.shape.k * result.shape.n * 4},
                            read_gbps));
  }
  return lines;
}

std::string FormatTable(const ReportContext& context,
                        const std::vector<PointResult>& results,
                        const std::vector<SgemmResult>& sgemm) {
  std::string table = TableHeader(context);
  bool untimed_pick = false;
  for (size_t i = 0; i < results.size(); ++i) {
    const PointResult& result = results[i];
    if (i > 0 && (results[i - 1].weight != result.weight ||
                  results[i - 1].shape != result.shape)) {
      table += "\n";
    }
    table += TableLine(context, result, sgemm);
    untimed_pick |=
        std::none_of(result.kernels.begin(), result.kernels.end(),
                     [](const KernelTiming& timing) { return timing.pick; });
  }
  if (untimed_pick) {
    table += "\n* the scheduler's pick, the scalar reference, is not timed\n";
  }
  return table;
}

}  // namespace nibble::bench
