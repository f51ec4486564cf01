// The metrics pieces of nibbled: the histogram, the Prometheus text rendered
// from real stats (checked by a strict parser of the exposition format), the
// /metrics HTTP endpoint, and the gRPC interceptor counting calls by method
// and code on an in-process server.
#include "server/operations/metrics.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/nibble_client.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "httplib.h"
#include "kernels/cpu/cpu_kernels.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "server/core/batcher.h"
#include "server/edge/nibble_server.h"
#include "server/edge/rpc_metrics.h"
#include "server/operations/auth.h"
#include "server/operations/metrics_histogram.h"
#include "server/operations/metrics_http.h"

namespace nibble::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(HistogramTest, CountsEachValueInTheFirstBucketThatHoldsIt) {
  static constexpr double kBounds[] = {1, 2, 4};
  Histogram histogram(kBounds);
  for (const double value : {0.5, 1.0, 1.5, 4.0, 9.0}) histogram.Record(value);
  EXPECT_THAT(histogram.bucket_counts(), ElementsAre(2, 1, 1, 1));
  EXPECT_THAT(histogram.CumulativeCounts(), ElementsAre(2, 3, 4, 5));
  EXPECT_EQ(histogram.count(), 5);
  EXPECT_EQ(histogram.sum(), 16.0);
}

// One parsed sample line.
struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

// One metric family: its # HELP and # TYPE lines and its samples.
struct Family {
  std::string help;
  std::string type;
  std::vector<Sample> samples;
};

bool IsMetricName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_' && c != ':') return false;
  }
  return true;
}

bool IsLabelName(absl::string_view name) {
  if (name.empty() || absl::ascii_isdigit(name[0])) return false;
  for (const char c : name) {
    if (!absl::ascii_isalnum(c) && c != '_') return false;
  }
  return true;
}

absl::StatusOr<double> ParseValue(absl::string_view text) {
  if (text == "+Inf") return INFINITY;
  if (text == "-Inf") return -INFINITY;
  if (text == "NaN") return NAN;
  double value = 0;
  if (!absl::SimpleAtod(text, &value) || std::isinf(value) ||
      std::isnan(value)) {
    return absl::InvalidArgumentError(absl::StrCat("bad value ", text));
  }
  return value;
}

// Parses `{name="value",...}` at the start of `rest`, consuming it.
absl::Status ParseLabels(absl::string_view& rest,
                         std::map<std::string, std::string>& labels) {
  rest.remove_prefix(1);  // '{'
  while (true) {
    const size_t equals = rest.find('=');
    if (equals == absl::string_view::npos) {
      return absl::InvalidArgumentError("label without '='");
    }
    const std::string name(rest.substr(0, equals));
    if (!IsLabelName(name)) {
      return absl::InvalidArgumentError(absl::StrCat("bad label name ", name));
    }
    rest.remove_prefix(equals + 1);
    if (rest.empty() || rest[0] != '"') {
      return absl::InvalidArgumentError("label value without '\"'");
    }
    rest.remove_prefix(1);
    std::string value;
    while (!rest.empty() && rest[0] != '"') {
      if (rest[0] == '\n') return absl::InvalidArgumentError("raw newline");
      if (rest[0] == '\\') {
        if (rest.size() < 2) return absl::InvalidArgumentError("bad escape");
        if (rest[1] == '\\') {
          value += '\\';
        } else if (rest[1] == '"') {
          value += '"';
        } else if (rest[1] == 'n') {
          value += '\n';
        } else {
          return absl::InvalidArgumentError("unknown escape");
        }
        rest.remove_prefix(2);
      } else {
        value += rest[0];
        rest.remove_prefix(1);
      }
    }
    if (rest.empty()) return absl::InvalidArgumentError("unclosed value");
    rest.remove_prefix(1);
    if (!labels.emplace(name, std::move(value)).second) {
      return absl::InvalidArgumentError(absl::StrCat("label twice: ", name));
    }
    if (rest.empty()) return absl::InvalidArgumentError("unclosed labels");
    if (rest[0] == '}') {
      rest.remove_prefix(1);
      return absl::OkStatus();
    }
    if (rest[0] != ',') return absl::InvalidArgumentError("no ',' or '}'");
    rest.remove_prefix(1);
  }
}

// Whether a sample named `name` belongs to the family `family` of `type`.
bool BelongsTo(absl::string_view name, absl::string_view family,
               absl::string_view type) {
  if (name == family) return type != "histogram";
  if (type != "histogram") return false;
  for (const absl::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (name == absl::StrCat(family, suffix)) return true;
  }
  return false;
}

absl::Status CheckHistograms(absl::string_view family_name,
                             const Family& family) {
  // By the labels other than le.
  struct Series {
    std::vector<std::pair<double, double>> buckets;  // le, count
    int sums = 0;
    std::vector<double> counts;
  };
  std::map<std::map<std::string, std::string>, Series> series;
  for (const Sample& sample : family.samples) {
    std::map<std::string, std::string> labels = sample.labels;
    if (absl::EndsWith(sample.name, "_bucket")) {
      const auto le = labels.find("le");
      if (le == labels.end()) return absl::InvalidArgumentError("bucket no le");
      absl::StatusOr<double> bound = ParseValue(le->second);
      if (!bound.ok()) return bound.status();
      labels.erase(le);
      series[labels].buckets.emplace_back(*bound, sample.value);
    } else if (absl::EndsWith(sample.name, "_sum")) {
      ++series[labels].sums;
    } else {
      series[labels].counts.push_back(sample.value);
    }
  }
  for (const auto& [labels, one] : series) {
    const std::string where =
        absl::StrCat(family_name, " series of ", labels.size(), " labels");
    if (one.sums != 1 || one.counts.size() != 1 || one.buckets.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": needs one _sum, one _count and buckets"));
    }
    for (size_t i = 1; i < one.buckets.size(); ++i) {
      if (one.buckets[i].first <= one.buckets[i - 1].first) {
        return absl::InvalidArgumentError(absl::StrCat(where, ": le order"));
      }
      if (one.buckets[i].second < one.buckets[i - 1].second) {
        return absl::InvalidArgumentError(
            absl::StrCat(where, ": buckets not cumulative"));
      }
    }
    if (!std::isinf(one.buckets.back().first)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no +Inf"));
    }
    if (one.buckets.back().second != one.counts[0]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": +Inf bucket is not _count"));
    }
  }
  return absl::OkStatus();
}

// Parses text exposition format 0.0.4 strictly: every family has one # HELP
// and one # TYPE before its samples, which follow together; names and labels
// are well formed and no sample repeats; counters are named _total and never
// negative; histograms are cumulative and end at le="+Inf" equal to _count.
absl::StatusOr<std::map<std::string, Family>> ParseExposition(
    absl::string_view text) {
  if (text.empty() || text.back() != '\n') {
    return absl::InvalidArgumentError("text must end with a newline");
  }
  text.remove_suffix(1);
  std::map<std::string, Family> families;
  std::string current;
  std::map<std::pair<std::string, std::map<std::string, std::string>>, int>
      seen;
  int line_number = 0;
  for (const absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, " \"", line, "\": ", what));
    };
    if (absl::StartsWith(line, "#")) {
      const std::vector<absl::string_view> parts =
          absl::StrSplit(line, absl::MaxSplits(' ', 3));
      if (parts.size() < 4 || (parts[1] != "HELP" && parts[1] != "TYPE")) {
        return error("expected # HELP or # TYPE with a name and text");
      }
      const std::string name(parts[2]);
      if (!IsMetricName(name) || !absl::StartsWith(name, "nibble_")) {
        return error("bad metric name");
      }
      Family& family = families[name];
      if (!family.samples.empty()) return error("after the family's samples");
      if (parts[1] == "HELP") {
        if (!family.help.empty()) return error("second # HELP");
        family.help = std::string(parts[3]);
      } else {
        if (!family.type.empty()) return error("second # TYPE");
        if (family.help.empty()) return error("# TYPE before # HELP");
        family.type = std::string(parts[3]);
        if (family.type != "counter" && family.type != "gauge" &&
            family.type != "histogram") {
          return error("unknown type");
        }
        if ((family.type == "counter") != absl::EndsWith(name, "_total")) {
          return error("counters, and only they, end in _total");
        }
        current = name;
      }
      continue;
    }
    Sample sample;
    absl::string_view rest = line;
    const size_t name_end = rest.find_first_of("{ ");
    if (name_end == absl::string_view::npos) return error("no value");
    sample.name = std::string(rest.substr(0, name_end));
    rest.remove_prefix(name_end);
    if (!IsMetricName(sample.name)) return error("bad sample name");
    if (rest[0] == '{') {
      if (absl::Status status = ParseLabels(rest, sample.labels);
          !status.ok()) {
        return error(status.message());
      }
    }
    if (rest.size() < 2 || rest[0] != ' ') return error("no ' ' before value");
    rest.remove_prefix(1);
    absl::StatusOr<double> value = ParseValue(rest);
    if (!value.ok()) return error(value.status().message());
    sample.value = *value;
    if (current.empty() ||
        !BelongsTo(sample.name, current, families[current].type)) {
      return error("sample outside its family, or before its # TYPE");
    }
    if (families[current].type == "counter" && sample.value < 0) {
      return error("negative counter");
    }
    if (++seen[{sample.name, sample.labels}] > 1) return error("repeated");
    families[current].samples.push_back(std::move(sample));
  }
  for (const auto& [name, family] : families) {
    if (family.type.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(name, " has no # TYPE"));
    }
    if (family.type == "histogram") {
      if (absl::Status status = CheckHistograms(name, family); !status.ok()) {
        return status;
      }
    }
  }
  return families;
}

// The value of the sample `name` with exactly `labels`, or NaN.
double Value(const std::map<std::string, Family>& families,
             absl::string_view family, absl::string_view name,
             const std::map<std::string, std::string>& labels = {}) {
  const auto found = families.find(std::string(family));
  if (found == families.end()) return NAN;
  for (const Sample& sample : found->second.samples) {
    if (sample.name == name && sample.labels == labels) return sample.value;
  }
  return NAN;
}

// A snapshot as the server would take it, from stats filled at random.
MetricsSnapshot RandomSnapshot(std::mt19937_64& rng) {
  const std::vector<std::string> methods = {
      "/nibble.v1.NibbleService/Matmul", "/nibble.v1.NibbleService/GetWeight",
      "/grpc.health.v1.Health/Check", kUnregisteredMethod};
  const std::vector<std::string> weights = {"proj", "w.q_4-b", "up"};
  std::uniform_real_distribution<double> seconds(0, 12);
  RpcStats rpc_stats;
  for (int i = 0; i < 500; ++i) {
    rpc_stats.Record(methods[rng() % methods.size()],
                     static_cast<grpc::StatusCode>(rng() % kGrpcStatusCodes),
                     absl::Seconds(seconds(rng) * seconds(rng) / 12));
  }
  BatcherStats batcher;
  for (int i = 0; i < 300; ++i) {
    const int64_t rows = 1 + rng() % 5000;
    batcher.batch_rows.Record(static_cast<double>(rows));
    batcher.compute_seconds.Record(seconds(rng) / 1000);
    batcher.queue_seconds.Record(i % 3 == 0 ? 0 : seconds(rng));
    batcher.kernel_seconds.Record(seconds(rng) / 1000);
    batcher.reply_seconds.Record(seconds(rng) / 5000);
    ++batcher.batches_run;
    batcher.rows_run += rows;
    WeightMatmulCounts& counts =
        batcher.run_by_weight[weights[rng() % weights.size()]];
    ++counts.requests;
    counts.rows += rows;
  }
  batcher.requests_run = batcher.batches_run;
  batcher.requests_refused_queue_full = rng() % 10;
  batcher.requests_refused_shutting_down = rng() % 10;
  batcher.requests_expired = rng() % 10;
  batcher.requests_cancelled = rng() % 10;
  batcher.queued_rows_by_weight["proj"] = 1 + rng() % 100;
  batcher.queued_rows_by_weight["up"] = 1 + rng() % 100;
  MetricsSnapshot snapshot{
      .rpcs = rpc_stats.Snapshot(),
      .batcher = std::move(batcher),
      .weights = {},
      .reserved_weight_bytes = static_cast<int64_t>(rng() >> 24),
      .max_weight_bytes = static_cast<int64_t>(rng() >> 8),
      .gpus = {},
      .backend = rng() % 2 == 0 ? "cpu" : "cuda",
      .gpu_run_stages = {.runs = static_cast<int64_t>(rng() >> 40),
                         .lane_wait_ns = static_cast<int64_t>(rng() >> 20),
                         .gather_ns = static_cast<int64_t>(rng() >> 20),
                         .device_ns = static_cast<int64_t>(rng() >> 20),
                         .scatter_ns = static_cast<int64_t>(rng() >> 20)},
      .serving = rng() % 2 == 0};
  // GPUs 0 and 3 of a host, and weights on either or on the CPU.
  for (int gpu : {0, 3}) {
    snapshot.gpus.push_back(
        {.usage = {.gpu = gpu,
                   .resident_bytes = static_cast<int64_t>(rng() >> 16),
                   .reserved_bytes = static_cast<int64_t>(rng() >> 18),
                   .max_bytes = static_cast<int64_t>(rng() >> 12)},
         .free_bytes = static_cast<int64_t>(rng() >> 14)});
  }
  constexpr int kPlaces[] = {-1, 0, 3};
  for (const std::string& weight : weights) {
    snapshot.weights.push_back(
        {.name = weight,
         .resident_bytes = static_cast<int64_t>(rng() >> 20),
         .gpu = kPlaces[rng() % 3]});
  }
  return snapshot;
}

TEST(RenderPrometheusTextTest, RandomStatsRenderValidExpositionText) {
  for (uint64_t seed = 1; seed <= 20; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    const MetricsSnapshot snapshot = RandomSnapshot(rng);
    const std::string text = RenderPrometheusText(snapshot);
    absl::StatusOr<std::map<std::string, Family>> families =
        ParseExposition(text);
    ASSERT_TRUE(families.ok()) << families.status() << "\n" << text;

    EXPECT_EQ(Value(*families, "nibble_serving", "nibble_serving"),
              snapshot.serving ? 1 : 0);
    for (const RpcMethodStats& method : snapshot.rpcs) {
      for (int code = 0; code < kGrpcStatusCodes; ++code) {
        const std::string code_name =
            absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
        const double want = method.calls_by_code[code];
        const double got = Value(
            *families, "nibble_rpc_requests_total", "nibble_rpc_requests_total",
            {{"method", method.method}, {"code", code_name}});
        if (want == 0) {
          EXPECT_TRUE(std::isnan(got)) << "zero counts are left out";
        } else {
          EXPECT_EQ(got, want) << method.method << " " << code_name;
        }
      }
      EXPECT_EQ(Value(*families, "nibble_rpc_duration_seconds",
                      "nibble_rpc_duration_seconds_count",
                      {{"method", method.method}}),
                method.duration_seconds.count());
    }
    int64_t resident_bytes = 0;
    for (const WeightGauge& weight : snapshot.weights) {
      resident_bytes += weight.resident_bytes;
      EXPECT_EQ(Value(*families, "nibble_weight_bytes", "nibble_weight_bytes",
                      {{"weight", weight.name}}),
                weight.resident_bytes);
    }
    EXPECT_EQ(Value(*families, "nibble_resident_weight_bytes",
                    "nibble_resident_weight_bytes"),
              resident_bytes);
    EXPECT_EQ(Value(*families, "nibble_weights", "nibble_weights"), 3);
    for (const GpuGauge& gpu : snapshot.gpus) {
      const std::map<std::string, std::string> label = {
          {"gpu", absl::StrCat(gpu.usage.gpu)}};
      int weights_there = 0;
      for (const WeightGauge& weight : snapshot.weights) {
        weights_there += weight.gpu == gpu.usage.gpu;
      }
      EXPECT_EQ(
          Value(*families, "nibble_gpu_weights", "nibble_gpu_weights", label),
          weights_there);
      EXPECT_EQ(Value(*families, "nibble_gpu_resident_bytes",
                      "nibble_gpu_resident_bytes", label),
                gpu.usage.resident_bytes);
      EXPECT_EQ(Value(*families, "nibble_gpu_reserved_bytes",
                      "nibble_gpu_reserved_bytes", label),
                gpu.usage.reserved_bytes);
      EXPECT_EQ(Value(*families, "nibble_max_gpu_bytes", "nibble_max_gpu_bytes",
                      label),
                gpu.usage.max_bytes);
      EXPECT_EQ(Value(*families, "nibble_gpu_free_bytes",
                      "nibble_gpu_free_bytes", label),
                gpu.free_bytes);
    }

    const BatcherStats& batcher = snapshot.batcher;
    for (const auto& [weight, counts] : batcher.run_by_weight) {
      EXPECT_EQ(Value(*families, "nibble_matmul_requests_total",
                      "nibble_matmul_requests_total", {{"weight", weight}}),
                counts.requests);
      EXPECT_EQ(Value(*families, "nibble_matmul_rows_total",
                      "nibble_matmul_rows_total", {{"weight", weight}}),
                counts.rows);
    }
    EXPECT_EQ(Value(*families, "nibble_matmul_dropped_total",
                    "nibble_matmul_dropped_total", {{"reason", "queue_full"}}),
              batcher.requests_refused_queue_full);
    EXPECT_EQ(Value(*families, "nibble_matmul_dropped_total",
                    "nibble_matmul_dropped_total", {{"reason", "cancelled"}}),
              batcher.requests_cancelled);
    EXPECT_EQ(Value(*families, "nibble_queued_rows", "nibble_queued_rows"),
              batcher.queued_rows_by_weight.at("proj") +
                  batcher.queued_rows_by_weight.at("up"));
    EXPECT_EQ(Value(*families, "nibble_weight_queued_rows",
                    "nibble_weight_queued_rows", {{"weight", "up"}}),
              batcher.queued_rows_by_weight.at("up"));
    EXPECT_EQ(Value(*families, "nibble_batch_rows", "nibble_batch_rows_count"),
              batcher.batches_run);
    EXPECT_EQ(Value(*families, "nibble_batch_rows", "nibble_batch_rows_sum"),
              batcher.rows_run);
    EXPECT_EQ(Value(*families, "nibble_batch_rows", "nibble_batch_rows_bucket",
                    {{"le", "16"}}),
              batcher.batch_rows.CumulativeCounts()[4]);
    EXPECT_EQ(Value(*families, "nibble_matmul_queue_seconds",
                    "nibble_matmul_queue_seconds_bucket", {{"le", "5e-05"}}),
              batcher.queue_seconds.CumulativeCounts()[0]);
    EXPECT_NEAR(Value(*families, "nibble_batch_compute_seconds",
                      "nibble_batch_compute_seconds_sum"),
                batcher.compute_seconds.sum(), 1e-9);
    EXPECT_EQ(Value(*families, "nibble_matmul_kernel_seconds",
                    "nibble_matmul_kernel_seconds_count",
                    {{"backend", snapshot.backend}}),
              batcher.kernel_seconds.count());
    EXPECT_NEAR(Value(*families, "nibble_matmul_reply_seconds",
                      "nibble_matmul_reply_seconds_sum",
                      {{"backend", snapshot.backend}}),
                batcher.reply_seconds.sum(), 1e-9);
    EXPECT_EQ(
        Value(*families, "nibble_gpu_runs_total", "nibble_gpu_runs_total"),
        snapshot.gpu_run_stages.runs);
    EXPECT_NEAR(
        Value(*families, "nibble_gpu_run_stage_seconds_total",
              "nibble_gpu_run_stage_seconds_total", {{"stage", "device"}}),
        snapshot.gpu_run_stages.device_ns * 1e-9, 1e-9);
    EXPECT_NEAR(
        Value(*families, "nibble_gpu_run_stage_seconds_total",
              "nibble_gpu_run_stage_seconds_total", {{"stage", "scatter"}}),
        snapshot.gpu_run_stages.scatter_ns * 1e-9, 1e-9);
  }
}

// Without weight labels no series names a weight, and the per-weight
// counters become one series each, summed over the weights.
TEST(RenderPrometheusTextTest, WithoutWeightLabelsNoWeightIsNamed) {
  for (uint64_t seed = 1; seed <= 5; ++seed) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    std::mt19937_64 rng(seed);
    MetricsSnapshot snapshot = RandomSnapshot(rng);
    snapshot.weight_labels = false;
    const std::string text = RenderPrometheusText(snapshot);
    absl::StatusOr<std::map<std::string, Family>> families =
        ParseExposition(text);
    ASSERT_TRUE(families.ok()) << families.status() << "\n" << text;
    EXPECT_THAT(text, Not(HasSubstr("weight=")));
    for (const WeightGauge& weight : snapshot.weights) {
      EXPECT_THAT(text, Not(HasSubstr("\"" + weight.name + "\"")));
    }
    int64_t requests = 0;
    int64_t rows = 0;
    for (const auto& [weight, counts] : snapshot.batcher.run_by_weight) {
      requests += counts.requests;
      rows += counts.rows;
    }
    EXPECT_EQ(Value(*families, "nibble_matmul_requests_total",
                    "nibble_matmul_requests_total"),
              requests);
    EXPECT_EQ(Value(*families, "nibble_matmul_rows_total",
                    "nibble_matmul_rows_total"),
              rows);
    EXPECT_EQ(Value(*families, "nibble_queued_rows", "nibble_queued_rows"),
              snapshot.batcher.queued_rows_by_weight.at("proj") +
                  snapshot.batcher.queued_rows_by_weight.at("up"));
  }
}

TEST(RenderPrometheusTextTest, EmptySnapshotRendersEveryFamily) {
  absl::StatusOr<std::map<std::string, Family>> families =
      ParseExposition(RenderPrometheusText({}));
  ASSERT_TRUE(families.ok()) << families.status();
  for (const char* name : {"nibble_build_info",
                           "nibble_serving",
                           "nibble_rpc_requests_total",
                           "nibble_rpc_duration_seconds",
                           "nibble_weights",
                           "nibble_resident_weight_bytes",
                           "nibble_weight_bytes",
                           "nibble_gpu_weights",
                           "nibble_gpu_resident_bytes",
                           "nibble_gpu_reserved_bytes",
                           "nibble_max_gpu_bytes",
                           "nibble_gpu_free_bytes",
                           "nibble_matmul_requests_total",
                           "nibble_matmul_rows_total",
                           "nibble_matmul_dropped_total",
                           "nibble_queued_rows",
                           "nibble_weight_queued_rows",
                           "nibble_batch_rows",
                           "nibble_matmul_queue_seconds",
                           "nibble_matmul_kernel_seconds",
                           "nibble_matmul_reply_seconds",
                           "nibble_batch_compute_seconds",
                           "nibble_gpu_runs_total",
                           "nibble_gpu_run_stage_seconds_total"}) {
    EXPECT_TRUE(families->contains(name)) << name;
  }
  EXPECT_EQ(Value(*families, "nibble_queued_rows", "nibble_queued_rows"), 0);
  EXPECT_EQ(Value(*families, "nibble_batch_rows", "nibble_batch_rows_bucket",
                  {{"le", "+Inf"}}),
            0);
}

TEST(EscapeLabelValueTest, EscapesBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("plain.name-1"), "plain.name-1");
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
}

TEST(EscapeLabelValueTest, OddMethodNamesRoundTripThroughTheText) {
  const std::string odd = "/odd\\svc\"x\ny/Method";
  RpcStats rpc_stats;
  rpc_stats.Record(odd, grpc::StatusCode::NOT_FOUND, absl::Milliseconds(3));
  const std::string text = RenderPrometheusText({.rpcs = rpc_stats.Snapshot(),
                                                 .batcher = {},
                                                 .weights = {},
                                                 .serving = true});
  absl::StatusOr<std::map<std::string, Family>> families =
      ParseExposition(text);
  ASSERT_TRUE(families.ok()) << families.status() << "\n" << text;
  EXPECT_EQ(
      Value(*families, "nibble_rpc_requests_total", "nibble_rpc_requests_total",
            {{"method", odd}, {"code", "NOT_FOUND"}}),
      1);
}

TEST(MetricsHttpServerTest, ServesMetricsAndExplainsOtherPaths) {
  int renders = 0;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start("127.0.0.1:0", [&renders] {
        ++renders;
        return std::string("nibble_serving 1\n");
      });
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->port(), 0);

  httplib::Client client("127.0.0.1", (*server)->port());
  httplib::Result metrics = client.Get("/metrics");
  ASSERT_TRUE(metrics) << httplib::to_string(metrics.error());
  EXPECT_EQ(metrics->status, 200);
  EXPECT_EQ(metrics->body, "nibble_serving 1\n");
  EXPECT_EQ(metrics->get_header_value("Content-Type"), kPrometheusContentType);
  EXPECT_EQ(renders, 1);

  httplib::Result other = client.Get("/");
  ASSERT_TRUE(other) << httplib::to_string(other.error());
  EXPECT_EQ(other->status, 404);
  EXPECT_THAT(other->body, HasSubstr("GET /metrics"));
}

TEST(MetricsHttpServerTest, WithTokensOnlyScrapesWithOneAreAnswered) {
  absl::StatusOr<TokenAuthenticator> auth =
      TokenAuthenticator::FromText("scrape-token\nother\n", /*all_rpcs=*/true);
  ASSERT_TRUE(auth.ok()) << auth.status();
  int renders = 0;
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          "127.0.0.1:0",
          [&renders] {
            ++renders;
            return std::string("nibble_serving 1\n");
          },
          *auth);
  ASSERT_TRUE(server.ok()) << server.status();
  httplib::Client client("127.0.0.1", (*server)->port());
  const struct {
    httplib::Headers headers;
    const char* why;
  } kRefused[] = {
      {{}, "needs a bearer token"},
      {{{"Authorization", "scrape-token"}}, "must read \"Bearer TOKEN\""},
      {{{"Authorization", "Bearer wrong"}}, "not one this server accepts"},
  };
  for (const auto& [headers, why] : kRefused) {
    SCOPED_TRACE(why);
    httplib::Result refused = client.Get("/metrics", headers);
    ASSERT_TRUE(refused) << httplib::to_string(refused.error());
    EXPECT_EQ(refused->status, 401);
    EXPECT_EQ(refused->get_header_value("WWW-Authenticate"), "Bearer");
    EXPECT_THAT(refused->body, HasSubstr(why));
  }
  EXPECT_EQ(renders, 0);
  httplib::Result scraped =
      client.Get("/metrics", {{"Authorization", "Bearer other"}});
  ASSERT_TRUE(scraped) << httplib::to_string(scraped.error());
  EXPECT_EQ(scraped->status, 200);
  EXPECT_EQ(scraped->body, "nibble_serving 1\n");
  EXPECT_EQ(renders, 1);
}

// A TCP connection to 127.0.0.1:`port`, or -1.
int ConnectTo(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
      0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the server closed `fd` within `timeout`: a read sees the end.
bool ClosedWithin(int fd, absl::Duration timeout) {
  pollfd polled{fd, POLLIN, 0};
  if (poll(&polled, 1, absl::ToInt64Milliseconds(timeout)) != 1) return false;
  char byte;
  return recv(fd, &byte, 1, 0) <= 0;
}

// Idle and trickling clients delay no scrape, however many: a scrape is
// answered long before their connections time out, past kMaxConnections the
// oldest connections are closed, and every one is closed once its
// kExchangeTime is up.
TEST(MetricsHttpServerTest, IdleAndTricklingClientsDelayNoScrape) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
      MetricsHttpServer::Start(
          "127.0.0.1:0", [] { return std::string("nibble_serving 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> idle;
  for (int i = 0; i < MetricsHttpServer::kMaxConnections + 8; ++i) {
    idle.push_back(ConnectTo(port));
    ASSERT_GE(idle.back(), 0) << i;
  }
  const int trickling = ConnectTo(port);
  ASSERT_GE(trickling, 0);
  std::atomic<bool> trickle_cut = false;
  std::thread trickle([&] {
    const std::string request = "GET /metrics HTTP/1.1\r\nX-Slow: ";
    for (size_t i = 0; !trickle_cut; ++i) {
      const char byte = i < request.size() ? request[i] : 'a';
      if (send(trickling, &byte, 1, MSG_NOSIGNAL) != 1) trickle_cut = true;
      absl::SleepFor(absl::Milliseconds(50));
      if (i > 30 * 20) break;  // 30 s: the test fails below
    }
  });
  // Far shorter than kExchangeTime: a scrape that waited for the others to
  // time out would fail.
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(2);
  client.set_read_timeout(2);
  httplib::Result scraped = client.Get("/metrics");
  ASSERT_TRUE(scraped) << httplib::to_string(scraped.error());
  EXPECT_EQ(scraped->status, 200);
  EXPECT_EQ(scraped->body, "nibble_serving 1\n");
  // The oldest were closed to admit the rest, the newest at their deadline.
  const absl::Duration bound =
      MetricsHttpServer::kExchangeTime + absl::Seconds(25);
  EXPECT_TRUE(ClosedWithin(idle.front(), bound));
  EXPECT_TRUE(ClosedWithin(idle.back(), bound));
  trickle.join();
  EXPECT_TRUE(trickle_cut.load());
  for (int fd : idle) close(fd);
  close(trickling);
}

TEST(MetricsHttpServerTest, BusyPortIsUnavailableNamingTheAddress) {
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> first =
      MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string(); });
  ASSERT_TRUE(first.ok()) << first.status();
  const std::string address = absl::StrCat("127.0.0.1:", (*first)->port());
  absl::StatusOr<std::unique_ptr<MetricsHttpServer>> second =
      MetricsHttpServer::Start(address, [] { return std::string(); });
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr(address));
}

TEST(MetricsHttpServerTest, MalformedAddressIsInvalid) {
  for (const char* listen :
       {"9464", "localhost:", "127.0.0.1:http", "127.0.0.1:70000", ":9464"}) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start(listen, [] { return std::string(); });
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
        << listen;
    EXPECT_THAT(server.status().message(), HasSubstr("HOST:PORT")) << listen;
  }
}

TEST(MetricsHttpServerTest, StopsRightAfterStarting) {
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> server =
        MetricsHttpServer::Start("127.0.0.1:0", [] { return std::string(); });
    ASSERT_TRUE(server.ok()) << server.status();
  }
}

// Counts of `method` by code name, from what the interceptor recorded.
std::map<std::string, int64_t> CallsByCode(const RpcStats& stats,
                                           absl::string_view method) {
  std::map<std::string, int64_t> calls;
  for (const RpcMethodStats& one : stats.Snapshot()) {
    if (one.method != method) continue;
    for (int code = 0; code < kGrpcStatusCodes; ++code) {
      if (one.calls_by_code[code] == 0) continue;
      calls[absl::StatusCodeToString(static_cast<absl::StatusCode>(code))] =
          one.calls_by_code[code];
    }
  }
  return calls;
}

TEST(RpcMetricsInterceptorTest, CountsCallsByMethodAndCode) {
  RpcStats stats;
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                           &port);
  std::vector<
      std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>
      creators;
  creators.push_back(std::make_unique<RpcMetricsInterceptorFactory>(&stats));
  builder.experimental().SetInterceptorCreators(std::move(creators));
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  server->GetHealthCheckService()->SetServingStatus("known", true);

  std::shared_ptr<grpc::Channel> channel = grpc::CreateChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  std::unique_ptr<grpc::health::v1::Health::Stub> health =
      grpc::health::v1::Health::NewStub(channel);
  for (const char* service : {"", "known", "known", "unknown"}) {
    grpc::ClientContext context;
    grpc::health::v1::HealthCheckRequest request;
    request.set_service(service);
    grpc::health::v1::HealthCheckResponse response;
    health->Check(&context, request, &response);
  }
  // A service this server does not have.
  {
    grpc::ClientContext context;
    v1::ListWeightsResponse response;
    const grpc::Status status =
        v1::NibbleService::NewStub(channel)->ListWeights(
            &context, v1::ListWeightsRequest(), &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  }

  const std::map<std::string, int64_t> want = {{"OK", 3}, {"NOT_FOUND", 1}};
  EXPECT_EQ(CallsByCode(stats, "/grpc.health.v1.Health/Check"), want);
  const std::map<std::string, int64_t> want_unregistered = {
      {"UNIMPLEMENTED", 1}};
  EXPECT_EQ(CallsByCode(stats, kUnregisteredMethod), want_unregistered);
  for (const RpcMethodStats& method : stats.Snapshot()) {
    EXPECT_THAT(method.method, ::testing::Not(HasSubstr("ListWeights")))
        << "an unregistered method named its own label";
    if (method.method == "/grpc.health.v1.Health/Check") {
      EXPECT_EQ(method.duration_seconds.count(), 4);
    }
  }
  server->Shutdown();
}

// The whole path on an in-process nibbled: its calls, weights and batches
// show up in a scrape of --metrics_listen that parses.
TEST(NibbleServerMetricsTest, ScrapeParsesAndCountsTheServersWork) {
  constexpr uint64_t kSeed = 11;
  SCOPED_TRACE(absl::StrCat("seed ", kSeed));
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  options.metrics_listen = "127.0.0.1:0";
  constexpr int64_t kBudget = 1 << 30;
  options.max_weight_bytes = kBudget;
  absl::StatusOr<std::unique_ptr<NibbleServer>> server =
      NibbleServer::Start(options, cpu::CpuKernels());
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_GT((*server)->metrics_port(), 0);
  NibbleClient client(
      CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port())));
  const WeightSpec spec{WeightFormat::kU4b8, 256, 96, 64};
  ASSERT_TRUE(client.Upload(RandomQuantizedWeight(spec, kSeed), "proj").ok());
  std::mt19937_64 rng(kSeed);
  std::uniform_real_distribution<float> value(-1, 1);
  std::vector<float> a(2 * spec.k);
  for (float& x : a) x = value(rng);
  const absl::string_view a_bytes(reinterpret_cast<const char*>(a.data()),
                                  a.size() * sizeof(float));
  constexpr int kMatmuls = 3;
  for (int i = 0; i < kMatmuls; ++i) {
    ASSERT_TRUE(client.Matmul("proj", 2, DType::kF32, a_bytes).ok());
  }
  EXPECT_EQ(client.Matmul("missing", 2, DType::kF32, a_bytes).status().code(),
            absl::StatusCode::kNotFound);

  httplib::Client http("127.0.0.1", (*server)->metrics_port());
  httplib::Result scrape = http.Get("/metrics");
  ASSERT_TRUE(scrape) << httplib::to_string(scrape.error());
  ASSERT_EQ(scrape->status, 200);
  absl::StatusOr<std::map<std::string, Family>> families =
      ParseExposition(scrape->body);
  ASSERT_TRUE(families.ok()) << families.status() << "\n" << scrape->body;
  const std::string matmul = "/nibble.v1.NibbleService/Matmul";
  EXPECT_EQ(
      Value(*families, "nibble_rpc_requests_total", "nibble_rpc_requests_total",
            {{"method", matmul}, {"code", "OK"}}),
      kMatmuls);
  EXPECT_EQ(
      Value(*families, "nibble_rpc_requests_total", "nibble_rpc_requests_total",
            {{"method", matmul}, {"code", "NOT_FOUND"}}),
      1);
  EXPECT_EQ(
      Value(*families, "nibble_rpc_requests_total", "nibble_rpc_requests_total",
            {{"method", "/nibble.v1.NibbleService/UploadWeight"},
             {"code", "OK"}}),
      1);
  EXPECT_EQ(Value(*families, "nibble_serving", "nibble_serving"), 1);
  EXPECT_EQ(Value(*families, "nibble_weights", "nibble_weights"), 1);
  EXPECT_EQ(
      Value(*families, "nibble_max_weight_bytes", "nibble_max_weight_bytes"),
      kBudget);
  EXPECT_EQ(Value(*families, "nibble_reserved_weight_bytes",
                  "nibble_reserved_weight_bytes"),
            0);
  // The CPU backend has no GPU series.
  EXPECT_TRUE(families->at("nibble_gpu_resident_bytes").samples.empty());
  EXPECT_EQ(Value(*families, "nibble_weight_bytes", "nibble_weight_bytes",
                  {{"weight", "proj"}}),
            (*server)->resident_bytes());
  EXPECT_EQ(Value(*families, "nibble_matmul_requests_total",
                  "nibble_matmul_requests_total", {{"weight", "proj"}}),
            kMatmuls);
  EXPECT_EQ(Value(*families, "nibble_matmul_rows_total",
                  "nibble_matmul_rows_total", {{"weight", "proj"}}),
            2 * kMatmuls);
  EXPECT_EQ(Value(*families, "nibble_batch_rows", "nibble_batch_rows_sum"),
            2 * kMatmuls);
  EXPECT_EQ(Value(*families, "nibble_matmul_queue_seconds",
                  "nibble_matmul_queue_seconds_count"),
            kMatmuls);
  EXPECT_EQ(Value(*families, "nibble_matmul_kernel_seconds",
                  "nibble_matmul_kernel_seconds_count", {{"backend", "cpu"}}),
            kMatmuls);
  // A reply is counted just after it was handed to gRPC, so the last one may
  // reach the client before its count; scrape until it is in.
  for (int scrapes = 1;
       scrapes < 500 && Value(*families, "nibble_matmul_reply_seconds",
                              "nibble_matmul_reply_seconds_count",
                              {{"backend", "cpu"}}) < kMatmuls;
       ++scrapes) {
    absl::SleepFor(absl::Milliseconds(10));
    scrape = http.Get("/metrics");
    ASSERT_TRUE(scrape) << httplib::to_string(scrape.error());
    families = ParseExposition(scrape->body);
    ASSERT_TRUE(families.ok()) << families.status();
  }
  EXPECT_EQ(Value(*families, "nibble_matmul_reply_seconds",
                  "nibble_matmul_reply_seconds_count", {{"backend", "cpu"}}),
            kMatmuls);
  EXPECT_EQ(Value(*families, "nibble_gpu_runs_total", "nibble_gpu_runs_total"),
            0);

  (*server)->Shutdown(absl::ZeroDuration());
  scrape = http.Get("/metrics");
  ASSERT_TRUE(scrape) << httplib::to_string(scrape.error());
  families = ParseExposition(scrape->body);
  ASSERT_TRUE(families.ok()) << families.status();
  EXPECT_EQ(Value(*families, "nibble_serving", "nibble_serving"), 0);
}

}  // namespace
}  // namespace nibble::server
