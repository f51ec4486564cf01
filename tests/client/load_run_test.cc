// RunLoad against an in-process fake server that answers every request after a
// fixed delay: the open loop keeps its rate however slow the replies, the
// closed loop is bound by them, and --verify and --max_in_flight count their
// errors. --api=Check goes to gRPC's own health service instead of Matmul.
#include "client/load_run.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/time/time.h"
#include "client/matrix_bytes.h"
#include "client/request_sender.h"
#include "format/dtype.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "gtest/gtest.h"
#include "nibble/v1/nibble.grpc.pb.h"

namespace nibble::client {
namespace {

using ::testing::Contains;
using ::testing::Key;

// Runs callbacks at their due times on a thread of its own, so that the fake
// server never blocks one of gRPC's.
class Delayer {
 public:
  Delayer() : thread_([this] { Loop(); }) {}
  ~Delayer() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  void After(absl::Duration delay, std::function<void()> callback) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      due_.emplace(
          std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(delay),
          std::move(callback));
    }
    changed_.notify_all();
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!stopping_ || !due_.empty()) {
      if (due_.empty()) {
        changed_.wait(lock);
        continue;
      }
      const auto next = due_.begin();
      if (next->first > std::chrono::steady_clock::now()) {
        changed_.wait_until(lock, next->first);
        continue;
      }
      std::function<void()> callback = std::move(next->second);
      due_.erase(next);
      lock.unlock();
      callback();
      lock.lock();
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::multimap<std::chrono::steady_clock::time_point, std::function<void()>>
      due_;
  bool stopping_ = false;
  std::thread thread_;
};

// Answers each Matmul after `delay` with C = `c`.
class SlowFakeService final : public v1::NibbleService::CallbackService {
 public:
  SlowFakeService(absl::Duration delay, std::string c)
      : delay_(delay), c_(std::move(c)) {}

  grpc::ServerUnaryReactor* Matmul(grpc::CallbackServerContext* context,
                                   const v1::MatmulRequest*,
                                   v1::MatmulResponse* response) override {
    response->set_c(c_);
    response->set_kernel("fake_kernel");
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    delayer_.After(delay_, [reactor] { reactor->Finish(grpc::Status::OK); });
    return reactor;
  }

 private:
  const absl::Duration delay_;
  const std::string c_;
  Delayer delayer_;
};

constexpr int64_t kK = 8;
constexpr int64_t kN = 4;

class LoadRunTest : public ::testing::Test {
 protected:
  // Starts the fake server answering after `delay` with C of random values;
  // with `health`, gRPC's default health service too.
  void StartServer(absl::Duration delay, bool health = false) {
    c_ = RandomMatrixBytes(1, kN, DType::kF32, /*seed=*/7);
    service_ = std::make_unique<SlowFakeService>(delay, c_);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    // The switch is process-wide and read when the server is built.
    grpc::EnableDefaultHealthCheckService(health);
    server_ = builder.BuildAndStart();
    grpc::EnableDefaultHealthCheckService(false);
    ASSERT_NE(server_, nullptr);
    config_.targets = {absl::StrCat("127.0.0.1:", port)};
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  LoadReport Run() {
    LoadTarget target;
    target.channels = ConnectChannels(config_);
    target.request.set_weight_name("w");
    target.request.set_m(1);
    target.request.set_dtype(v1::DTYPE_F32);
    target.request.set_a(RandomMatrixBytes(1, kK, DType::kF32, /*seed=*/3));
    target.expected_c = expected_c_;
    return RunLoad(config_, target);
  }

  LoadConfig config_ = [] {
    LoadConfig config;
    config.name = "w";
    config.connections = 2;
    config.duration = absl::Seconds(2);
    config.warmup = absl::Milliseconds(200);
    config.timeout = absl::Seconds(10);
    return config;
  }();
  std::string c_;
  std::vector<double> expected_c_;
  std::unique_ptr<SlowFakeService> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(LoadRunTest, OpenLoopKeepsItsRateAgainstASlowServer) {
  StartServer(absl::Milliseconds(200));
  config_.open_loop = true;
  config_.rate = 500;
  config_.max_in_flight = 10000;
  const LoadReport report = Run();
  // Bounds that hold on a busy machine, where the sender and the replies
  // run late, yet far from what waiting for replies would give: a closed
  // loop of 200 ms calls sends 5 a second per chain, and its latencies grow
  // with the queue.
  EXPECT_EQ(report.sent, 1000);
  EXPECT_GT(report.sent_rps, 350);
  EXPECT_LE(report.sent_rps, 505);
  EXPECT_TRUE(report.total.errors.empty());
  EXPECT_EQ(report.total.latencies.count(), 1000);
  // The window's replies over the window and the 200 ms of draining after it
  // (1000 / 2.2 s on an idle machine).
  EXPECT_GT(report.throughput_rps, 250);
  EXPECT_LE(report.throughput_rps, 1000 / 2.2 + 30);
  // Each reply takes the server's 200 ms, whatever the load.
  EXPECT_GE(report.total.latencies.ValueAtQuantile(0.01), 199000);
  EXPECT_LT(report.total.latencies.ValueAtQuantile(0.5), 1000000);
  EXPECT_THAT(report.total.kernels, Contains(Key("fake_kernel")));
  ASSERT_GE(report.series.size(), 2u);
  EXPECT_GT(report.series[0].sent, 350);
  EXPECT_LE(report.series[0].sent, 505);
  EXPECT_GE(report.series[1].p50_us, 199000);
}

TEST_F(LoadRunTest, ClosedLoopIsBoundByTheServer) {
  StartServer(absl::Milliseconds(100));
  config_.concurrency = 4;
  config_.duration = absl::Seconds(1);
  const LoadReport report = Run();
  // Four chains of 100 ms requests: at most 40 replies a second, and more
  // than two chains could give even on a loaded machine.
  EXPECT_LE(report.throughput_rps, 42);
  EXPECT_GT(report.throughput_rps, 20);
  EXPECT_TRUE(report.total.errors.empty());
  EXPECT_GE(report.total.latencies.ValueAtQuantile(0.01), 99000);
}

TEST_F(LoadRunTest, OpenLoopCountsSendsBeyondMaxInFlightAsClientErrors) {
  StartServer(absl::Milliseconds(500));
  config_.open_loop = true;
  config_.rate = 200;
  config_.max_in_flight = 10;
  config_.duration = absl::Seconds(1);
  const LoadReport report = Run();
  ASSERT_THAT(report.total.errors,
              Contains(Key(std::string(kClientInFlightError))));
  // About 10 in flight every 500 ms: 20 a second get through.
  EXPECT_LT(report.total.latencies.count(), 40);
  EXPECT_GT(report.total.errors.at(std::string(kClientInFlightError)), 150);
}

TEST_F(LoadRunTest, VerifyCountsWrongRepliesAsErrors) {
  StartServer(absl::Milliseconds(1));
  config_.concurrency = 2;
  config_.duration = absl::Milliseconds(500);
  config_.verify_every = 1;
  config_.tolerance = 1e-6;
  expected_c_ = MatrixBytesToDoubles(DType::kF32, c_);
  const LoadReport right = Run();
  EXPECT_TRUE(right.total.errors.empty());
  EXPECT_GT(right.verified, 10);

  expected_c_[kN - 1] *= 1.01;
  const LoadReport wrong = Run();
  EXPECT_EQ(wrong.total.latencies.count(), 0);
  ASSERT_THAT(wrong.total.errors,
              Contains(Key(std::string(kVerifyMismatchError))));
  EXPECT_EQ(wrong.total.errors.at(std::string(kVerifyMismatchError)),
            wrong.verified);
}

TEST(LoadApiTest, ParsesCheckInAnyCase) {
  EXPECT_EQ(ParseLoadApi("check").value_or(LoadApi::kMatmul), LoadApi::kCheck);
  EXPECT_EQ(LoadApiName(LoadApi::kCheck), "Check");
  EXPECT_FALSE(ParseLoadApi("Health").ok());
}

TEST_F(LoadRunTest, CheckCountsOnlyServingRepliesAsSuccesses) {
  // Matmul would take 200 ms a reply; health checks come back at once.
  StartServer(absl::Milliseconds(200), /*health=*/true);
  config_.api = LoadApi::kCheck;
  config_.concurrency = 2;
  config_.duration = absl::Milliseconds(500);
  const LoadReport serving = Run();
  EXPECT_TRUE(serving.total.errors.empty());
  EXPECT_GT(serving.total.latencies.count(), 20);
  EXPECT_LT(serving.total.latencies.ValueAtQuantile(0.5), 100000);

  server_->GetHealthCheckService()->SetServingStatus(false);
  const LoadReport not_serving = Run();
  EXPECT_EQ(not_serving.total.latencies.count(), 0);
  ASSERT_THAT(not_serving.total.errors, Contains(Key("UNAVAILABLE")));
  EXPECT_GT(not_serving.total.errors.at("UNAVAILABLE"), 20);
}

}  // namespace
}  // namespace nibble::client
