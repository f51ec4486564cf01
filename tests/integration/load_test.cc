// Drives a real nibbled with nibble-load's open loop and checks its --json
// report: the asked rate is met, and a server stalled with SIGSTOP shows in
// the percentiles, since latency counts from each request's scheduled time.
// Sweeps stop at the first step over the SLO and write CSV and SVG too.
// --api=Check times the health check RPC with no weight at all.
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/test_files.h"

namespace nibble {
namespace {

using ::nibble::testing::ReadFile;
using ::testing::HasSubstr;
using ::testing::Not;

// The number after `"key": ` following the first `"within":` (the whole text
// when empty); NaN when absent or null.
double JsonValue(const std::string& json, const std::string& key,
                 const std::string& within = "") {
  size_t from = 0;
  if (!within.empty()) {
    from = json.find(absl::StrCat("\"", within, "\":"));
    if (from == std::string::npos) return std::nan("");
  }
  const std::string needle = absl::StrCat("\"", key, "\": ");
  const size_t at = json.find(needle, from);
  if (at == std::string::npos) return std::nan("");
  const char* begin = json.c_str() + at + needle.size();
  char* end = nullptr;
  const double value = std::strtod(begin, &end);
  return end == begin ? std::nan("") : value;
}

int Count(const std::string& text, const std::string& needle) {
  int count = 0;
  for (size_t at = text.find(needle); at != std::string::npos;
       at = text.find(needle, at + 1)) {
    ++count;
  }
  return count;
}

class LoadTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, {"--threads=2"});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    std::string output;
    ASSERT_EQ(testing::RunCommand(
                  absl::StrCat(NIBBLE_CLI_PATH,
                               " upload --target=", server_->target(),
                               " --name=w --format=u4b8 --k=256 --n=256 "
                               "--group=128 --random=1"),
                  &output),
              0)
        << output;
    json_path_ = absl::StrCat(
        ::testing::TempDir(), "/load_",
        ::testing::UnitTest::GetInstance()->current_test_info()->name(),
        ".json");
  }

  // Runs `nibble-load <args>` against the server with --json; its exit code,
  // output in `output_` and the JSON in `json_`.
  int Run(const std::string& args) {
    const int code = testing::RunCommand(
        absl::StrCat(NIBBLE_LOAD_PATH, " --target=", server_->target(),
                     " --json=", json_path_, " ", args),
        &output_);
    json_ = ReadFile(json_path_);
    return code;
  }

  // Run with M = 1 in f32 on weight "w".
  int Load(const std::string& args) {
    return Run(absl::StrCat("--name=w --m=1 --dtype=f32 ", args));
  }

  std::unique_ptr<testing::NibbledProcess> server_;
  std::string json_path_;
  std::string output_;
  std::string json_;
};

TEST_F(LoadTest, OpenLoopMeetsTheAskedRate) {
  ASSERT_EQ(Load("--rate=200 --duration=2 --warmup=0.5"), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("requests/s offered"));
  EXPECT_THAT(output_, HasSubstr("short of the offered rate"));
  for (const char* key :
       {"\"config\":", "\"mode\": \"open\"", "\"throughput_rps\":",
        "\"offered_rps\": 200", "\"errors\": 0", "\"errors_by_code\": {}",
        "\"latency_us\":", "\"p50\":", "\"p90\":", "\"p99\":", "\"p999\":",
        "\"max\":", "\"mean\":", "\"min\":", "\"histogram\": [{\"lower\":"}) {
    EXPECT_THAT(json_, HasSubstr(key)) << json_;
  }
  EXPECT_NEAR(JsonValue(json_, "throughput_rps"), 200, 10) << json_;
  EXPECT_NEAR(JsonValue(json_, "sent_rps"), 200, 10) << json_;
  EXPECT_NEAR(JsonValue(json_, "requests_ok"), 400, 2) << json_;
}

TEST_F(LoadTest, OpenLoopStopsAfterTheAskedRequests) {
  ASSERT_EQ(Load("--rate=500 --arrival=poisson --seed=3 --requests=300 "
                 "--warmup=0"),
            0)
      << output_;
  EXPECT_EQ(JsonValue(json_, "requests_ok"), 300) << json_;
  EXPECT_THAT(json_, HasSubstr("\"arrival\": \"poisson\""));
}

TEST_F(LoadTest, ClosedLoopWritesJsonToo) {
  ASSERT_EQ(Load("--concurrency=2 --duration=1 --warmup=0"), 0) << output_;
  EXPECT_THAT(output_, HasSubstr("concurrency: 2 over 2 connections"));
  EXPECT_THAT(json_, HasSubstr("\"offered_rps\": null"));
  EXPECT_THAT(json_, HasSubstr("\"mode\": \"closed\""));
  EXPECT_GT(JsonValue(json_, "throughput_rps"), 0) << json_;
}

TEST_F(LoadTest, OpenLoopFlagsNeedRate) {
  EXPECT_EQ(Load("--requests=10"), 2);
  EXPECT_THAT(output_, HasSubstr("add --rate"));
  EXPECT_EQ(Load("--rate=10 --concurrency=2"), 2);
  EXPECT_THAT(output_, HasSubstr("exclude each other"));
}

TEST_F(LoadTest, StalledServerShowsInTheTailLatency) {
  const pid_t pid = server_->pid();
  std::thread stall([pid] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    kill(pid, SIGSTOP);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    kill(pid, SIGCONT);
  });
  const int code = Load("--rate=200 --duration=4 --warmup=0");
  stall.join();
  ASSERT_EQ(code, 0) << output_;
  // About 200 requests were scheduled while the server slept; the first of
  // them waited about a second.
  EXPECT_GE(JsonValue(json_, "p99", "latency_us"), 500000) << json_;
  EXPECT_GE(JsonValue(json_, "max", "latency_us"), 800000) << json_;
  EXPECT_EQ(JsonValue(json_, "errors"), 0) << json_;
}

TEST_F(LoadTest, SweepStopsAtTheSlo) {
  ASSERT_EQ(Load("--sweep_rate=50:200:50 --step_duration=1 --warmup=0 "
                 "--slo=0.001"),
            0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("step 1/4  rate 50 requests/s"));
  EXPECT_THAT(output_, Not(HasSubstr("step 2/4")));
  EXPECT_THAT(output_, HasSubstr("exceeds the SLO of 0.001 ms"));
  EXPECT_EQ(Count(json_, "\"throughput_rps\":"), 1) << json_;
  EXPECT_THAT(json_, HasSubstr("\"stopped_early\": true"));
  EXPECT_THAT(json_,
              HasSubstr("\"stop_reason\": \"step 1 (rate 50 requests/s): p99"));
}

TEST_F(LoadTest, SweepRunsEveryStepWithinAGenerousSlo) {
  const std::string dir = ::testing::TempDir();
  const std::string csv_path = absl::StrCat(dir, "/load_sweep.csv");
  const std::string plot_path = absl::StrCat(dir, "/load_sweep.svg");
  ASSERT_EQ(Load(absl::StrCat("--sweep_rate=50:200:50 --step_duration=1 "
                              "--warmup=0 --slo=10000 --csv=",
                              csv_path, " --plot=", plot_path)),
            0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("step 4/4  rate 200 requests/s"));
  EXPECT_THAT(output_, HasSubstr("stopped:     no, all 4 steps ran"));
  EXPECT_EQ(Count(json_, "\"throughput_rps\":"), 4) << json_;
  EXPECT_THAT(json_, HasSubstr("\"stopped_early\": false"));
  EXPECT_THAT(json_, HasSubstr("\"stop_reason\": null"));
  EXPECT_THAT(json_, HasSubstr("\"offered_rps\": 200"));

  const std::string csv = ReadFile(csv_path);
  EXPECT_EQ(Count(csv, "\n"), 5) << csv;
  EXPECT_THAT(csv, HasSubstr("offered,sent_rps,throughput_rps,errors,p50_us"));
  EXPECT_THAT(csv, HasSubstr("\n150,"));

  const std::string svg = ReadFile(plot_path);
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("</svg>"));
  // throughput, p50 and p99, and the SLO dashed with its legend entry.
  EXPECT_EQ(Count(svg, "<polyline"), 3) << svg;
  EXPECT_EQ(Count(svg, "stroke-dasharray"), 2) << svg;
}

TEST_F(LoadTest, ConcurrencySweepAndSingleRunCsv) {
  ASSERT_EQ(Load("--sweep_concurrency=1:2:1 --step_duration=0.5 --warmup=0"), 0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("step 2/2  concurrency 2"));
  EXPECT_THAT(json_, HasSubstr("\"over\": \"concurrency\""));
  EXPECT_EQ(Count(json_, "\"mode\": \"closed\""), 2) << json_;

  const std::string csv_path =
      absl::StrCat(::testing::TempDir(), "/load_single.csv");
  ASSERT_EQ(Load(absl::StrCat("--rate=100 --duration=0.5 --warmup=0 --csv=",
                              csv_path)),
            0)
      << output_;
  const std::string csv = ReadFile(csv_path);
  EXPECT_EQ(Count(csv, "\n"), 2) << csv;
  EXPECT_THAT(csv, HasSubstr("\n100,"));
}

TEST_F(LoadTest, SweepFlagsAreChecked) {
  EXPECT_EQ(Load("--sweep_rate=200:50:50"), 2);
  EXPECT_THAT(output_, HasSubstr("must not exceed TO"));
  EXPECT_EQ(Load("--sweep_rate=50:200:0"), 2);
  EXPECT_THAT(output_, HasSubstr("STEP in \"50:200:0\" must be a positive"));
  EXPECT_EQ(Load("--sweep_concurrency=1:4:0.5"), 2);
  EXPECT_THAT(output_, HasSubstr("must be a whole number"));
  EXPECT_EQ(Load("--sweep_rate=50:100:50 --rate=10"), 2);
  EXPECT_THAT(output_, HasSubstr("--rate does not go with --sweep_rate"));
  EXPECT_EQ(Load("--sweep_rate=50:100:50 --sweep_concurrency=1:2:1"), 2);
  EXPECT_THAT(output_, HasSubstr("exclude each other"));
  EXPECT_EQ(Load("--slo=5"), 2);
  EXPECT_THAT(output_, HasSubstr("applies to sweeps only"));
  EXPECT_EQ(Load("--sweep_rate=50:100:50 --slo=-1"), 2);
  EXPECT_THAT(output_, HasSubstr("--slo must be a positive number"));
}

TEST_F(LoadTest, EveryApiAnswersAndPassesVerification) {
  for (const char* api : {"Matmul", "MatmulStream", "ModelInfer"}) {
    SCOPED_TRACE(api);
    ASSERT_EQ(Load(absl::StrCat("--api=", api,
                                " --rate=200 --duration=1 --warmup=0.2 "
                                "--verify=1 --random=1")),
              0)
        << output_;
    EXPECT_THAT(json_, HasSubstr(absl::StrCat("\"api\": \"", api, "\"")));
    EXPECT_EQ(JsonValue(json_, "errors"), 0) << json_;
    EXPECT_NEAR(JsonValue(json_, "verified"), 200, 5) << json_;
    EXPECT_THAT(output_, HasSubstr("replies against the float64 reference, 0 "
                                   "wrong"));
    // One entry per second, the first one sending at the asked rate.
    EXPECT_NEAR(JsonValue(json_, "sent", "series"), 200, 5) << json_;
    for (const char* key :
         {"\"second\": 0", "\"ok\":", "\"p50_us\":", "\"p99_us\":"}) {
      EXPECT_THAT(json_, HasSubstr(key));
    }
  }
}

TEST_F(LoadTest, VerifyCountsWrongRepliesAsErrors) {
  // The weight was uploaded with seed 1; seed 2 gives another weight.
  EXPECT_EQ(Load("--concurrency=2 --duration=0.5 --warmup=0 --verify=1 "
                 "--random=2"),
            1)
      << output_;
  EXPECT_THAT(json_, HasSubstr("MISMATCH"));
  EXPECT_EQ(JsonValue(json_, "requests_ok"), 0) << json_;
  EXPECT_GT(JsonValue(json_, "verified"), 0) << json_;
  EXPECT_EQ(Load("--verify=1"), 2);
  EXPECT_THAT(output_, HasSubstr("--verify needs the data of weight"));
  EXPECT_EQ(Load("--random=1"), 2);
  EXPECT_THAT(output_, HasSubstr("serves --verify only"));
  EXPECT_EQ(Load("--api=Grpc"), 2);
  EXPECT_THAT(output_, HasSubstr("use Matmul, MatmulStream, ModelInfer (KServe "
                                 "v2) or Check"));
}

TEST_F(LoadTest, CheckTimesTheHealthRpcWithoutAWeight) {
  ASSERT_EQ(Run("--api=Check --concurrency=1 --duration=1 --warmup=0.2"), 0)
      << output_;
  EXPECT_THAT(output_, HasSubstr("api:         Check"));
  EXPECT_THAT(output_, Not(HasSubstr("weight:")));
  EXPECT_THAT(output_, Not(HasSubstr("kernel:")));
  EXPECT_THAT(json_, HasSubstr("\"api\": \"Check\""));
  EXPECT_THAT(json_, HasSubstr("\"weight\": null"));
  EXPECT_THAT(json_, HasSubstr("\"kernels\": null"));
  EXPECT_EQ(JsonValue(json_, "errors"), 0) << json_;
  // Loopback health checks take well under a millisecond each.
  EXPECT_GT(JsonValue(json_, "requests_ok"), 100) << json_;
  EXPECT_GT(JsonValue(json_, "p50", "latency_us"), 0) << json_;
}

TEST_F(LoadTest, CheckRefusesTheMatmulFlags) {
  EXPECT_EQ(Run("--api=Check --verify=1 --random=1"), 2);
  EXPECT_THAT(output_, HasSubstr("--verify does not go with --api=Check"));
  EXPECT_EQ(Run("--api=Check --name=w"), 2);
  EXPECT_THAT(output_, HasSubstr("--name does not go with --api=Check"));
  EXPECT_EQ(Run("--api=Check --m=4"), 2);
  EXPECT_THAT(output_, HasSubstr("--m does not go with --api=Check"));
  EXPECT_EQ(Run("--concurrency=1"), 2);
  EXPECT_THAT(output_, HasSubstr("--name is required"));
}

// Two servers holding the same shape but different data: replies from the
// second fail verification against the first's data, so the share of
// mismatches shows how the load was spread.
class FleetLoadTest : public LoadTest {
 protected:
  void SetUp() override {
    LoadTest::SetUp();
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, {"--threads=1"});
    ASSERT_TRUE(server.ok()) << server.status();
    second_ = *std::move(server);
    std::string output;
    ASSERT_EQ(testing::RunCommand(
                  absl::StrCat(NIBBLE_CLI_PATH,
                               " upload --target=", second_->target(),
                               " --name=w --format=u4b8 --k=256 --n=256 "
                               "--group=128 --random=2"),
                  &output),
              0)
        << output;
  }

  // Runs nibble-load on `targets` with every reply verified against the
  // first server's weight; the share of replies that were wrong.
  double MismatchShare(const std::string& targets, const std::string& args) {
    testing::RunCommand(
        absl::StrCat(NIBBLE_LOAD_PATH, " --target=", targets,
                     " --name=w --m=1 --json=", json_path_,
                     " --rate=400 --duration=1 --warmup=0.2 --verify=1 "
                     "--random=1 ",
                     args),
        &output_);
    json_ = ReadFile(json_path_);
    const double mismatches = JsonValue(json_, "errors");
    return mismatches / (mismatches + JsonValue(json_, "requests_ok"));
  }

  std::unique_ptr<testing::NibbledProcess> second_;
};

TEST_F(FleetLoadTest, AListOfTargetsSharesTheConnections) {
  EXPECT_NEAR(
      MismatchShare(absl::StrCat(server_->target(), ",", second_->target()),
                    "--connections=2"),
      0.5, 0.05)
      << output_;
  EXPECT_THAT(json_, HasSubstr("\"targets\": [\""));
}

TEST_F(FleetLoadTest, OneNameOfManyAddressesIsBalancedRoundRobin) {
  // What a dns:/// name of a headless Service resolves to, without DNS.
  const std::string name =
      absl::StrCat("ipv4:", server_->target(), ",", second_->target());
  EXPECT_NEAR(MismatchShare(name, "--connections=1"), 0.5, 0.1) << output_;
  EXPECT_NEAR(MismatchShare(absl::StrCat("dns:///", server_->target()),
                            "--connections=1"),
              0, 1e-9)
      << output_;
}

}  // namespace
}  // namespace nibble
