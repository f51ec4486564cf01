// DeviceBatchers: requests go to their weight's GPU's batcher, a GPU whose
// dispatcher is busy holds no other GPU's (nor the CPU's) requests, and the
// stats add up over all batchers. A fake backend, whose kernel call for one
// weight can be held, stands in for the kernels.
#include "server/core/device_batchers.h"

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "kernels/device_weight.h"
#include "kernels/packed_weight.h"

namespace nibble::server {
namespace {

// Long enough that nothing in a test waits this long unless it hangs.
constexpr absl::Duration kHang = absl::Seconds(60);
constexpr WeightSpec kSpec{WeightFormat::kU4b8, 32, 8, 32};

// A device copy on GPU `gpu`.
class FakeDeviceWeight final : public nibble::DeviceWeight {
 public:
  explicit FakeDeviceWeight(int gpu) : gpu_(gpu) {}
  const WeightSpec& spec() const override { return spec_; }
  int64_t device_bytes() const override { return 1; }
  int device() const override { return gpu_; }

 private:
  WeightSpec spec_ = kSpec;
  int gpu_;
};

// Weight `name` on GPU `gpu`, or on the CPU for -1.
std::shared_ptr<const ResidentWeight> Weight(const std::string& name, int gpu) {
  return std::make_shared<const ResidentWeight>(ResidentWeight{
      .name = name,
      .packed = *PackedWeight::WithoutPanels(RandomQuantizedWeight(kSpec, 7)),
      .device = gpu < 0 ? nullptr : std::make_shared<FakeDeviceWeight>(gpu)});
}

// One M = 1 f32 request; `answered` is notified with its status.
struct Request {
  std::string a = std::string(kSpec.k * sizeof(float), '\0');
  absl::Notification answered;
  absl::Status status = absl::UnknownError("not answered");

  MatmulWork Work(std::shared_ptr<const ResidentWeight> weight) {
    MatmulWork work;
    work.weight = std::move(weight);
    work.dtype = DType::kF32;
    work.m = 1;
    work.a = a;
    work.done = [this](absl::StatusOr<MatmulResult> result) {
      status = result.status();
      answered.Notify();
    };
    return work;
  }
};

class DeviceBatchersTest : public ::testing::Test {
 protected:
  ~DeviceBatchersTest() override { Release(); }

  // Runs every batch at once, but holds those of the weight named "held"
  // until Release.
  MatmulBackend Backend() {
    MatmulBackend backend;
    backend.run = [this](
                      const ResidentWeight& weight, DType, ActivationPrecision,
                      absl::Span<const RowBlock>) -> absl::StatusOr<MatmulRun> {
      if (weight.name == "held") {
        ++held_runs_;
        release_.WaitForNotificationWithTimeout(kHang);
      }
      return MatmulRun{.kernel = "fake"};
    };
    return backend;
  }

  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }

  absl::Notification release_;
  std::atomic<int> held_runs_ = 0;
};

TEST_F(DeviceBatchersTest, ABusyGpuHoldsNoOtherGpusRequests) {
  // One dispatcher each and nothing inline, so that a shared batcher would
  // make every request below wait for the held one.
  const BatcherOptions one_dispatcher{.dispatchers = 1,
                                      .run_idle_inline = false};
  DeviceBatchers batchers(one_dispatcher, one_dispatcher, {0, 1}, Backend());
  Request held, other_gpu, cpu;
  batchers.Submit(held.Work(Weight("held", 0)));
  while (held_runs_ == 0) absl::SleepFor(absl::Milliseconds(1));
  batchers.Submit(other_gpu.Work(Weight("other_gpu", 1)));
  batchers.Submit(cpu.Work(Weight("cpu", -1)));
  ASSERT_TRUE(other_gpu.answered.WaitForNotificationWithTimeout(kHang));
  ASSERT_TRUE(cpu.answered.WaitForNotificationWithTimeout(kHang));
  EXPECT_TRUE(other_gpu.status.ok()) << other_gpu.status;
  EXPECT_TRUE(cpu.status.ok()) << cpu.status;
  EXPECT_FALSE(held.answered.HasBeenNotified());

  Release();
  ASSERT_TRUE(held.answered.WaitForNotificationWithTimeout(kHang));
  EXPECT_TRUE(held.status.ok()) << held.status;
  const BatcherStats stats = batchers.Stats();
  EXPECT_EQ(stats.requests_run, 3);
  EXPECT_EQ(stats.batches_run, 3);
  EXPECT_EQ(stats.batch_rows.count(), 3);
  EXPECT_EQ(stats.kernel_seconds.count(), 3);
  for (const char* name : {"held", "other_gpu", "cpu"}) {
    EXPECT_EQ(stats.run_by_weight.at(name).requests, 1) << name;
  }
  batchers.ForgetWeight("held");
  EXPECT_FALSE(batchers.Stats().run_by_weight.contains("held"));
  batchers.Shutdown();
}

TEST_F(DeviceBatchersTest, AWeightGetsTheOptionsOfWhereItRuns) {
  DeviceBatchers batchers({.max_batch_rows = 8}, {.max_batch_rows = 64}, {0, 1},
                          Backend());
  EXPECT_EQ(batchers.OptionsFor(*Weight("cpu", -1)).max_batch_rows, 8);
  EXPECT_EQ(batchers.OptionsFor(*Weight("gpu0", 0)).max_batch_rows, 64);
  EXPECT_EQ(batchers.OptionsFor(*Weight("gpu1", 1)).max_batch_rows, 64);
  batchers.Shutdown();
}

TEST(AddStatsTest, SumsCountsHistogramsAndWeights) {
  BatcherStats a;
  a.batches_run = 2;
  a.requests_run = 3;
  a.rows_run = 5;
  a.batch_rows.Record(2);
  a.queue_seconds.Record(1e-3);
  a.run_by_weight["w"].requests = 3;
  a.run_by_weight["w"].rows = 5;
  a.run_by_weight["w"].batches_by_rows[2].batches = 2;
  a.queued_rows_by_weight["w"] = 4;
  a.requests_expired = 1;
  BatcherStats b;
  b.batches_run = 1;
  b.requests_run = 1;
  b.rows_run = 1;
  b.batch_rows.Record(1);
  b.batch_rows.Record(64);
  b.run_by_weight["w"].requests = 1;
  b.run_by_weight["w"].rows = 1;
  b.run_by_weight["w"].batches_by_rows[2].batches = 1;
  b.run_by_weight["v"].requests = 7;
  b.queued_rows_by_weight["w"] = 6;
  b.requests_cancelled = 2;
  AddStats(a, b);
  EXPECT_EQ(b.batches_run, 3);
  EXPECT_EQ(b.requests_run, 4);
  EXPECT_EQ(b.rows_run, 6);
  EXPECT_EQ(b.batch_rows.count(), 3);
  EXPECT_EQ(b.batch_rows.sum(), 67);
  EXPECT_EQ(b.batch_rows.CumulativeCounts()[1], 2);  // <= 2 rows
  EXPECT_EQ(b.queue_seconds.count(), 1);
  EXPECT_EQ(b.run_by_weight["w"].requests, 4);
  EXPECT_EQ(b.run_by_weight["w"].rows, 6);
  EXPECT_EQ(b.run_by_weight["w"].batches_by_rows[2].batches, 3);
  EXPECT_EQ(b.run_by_weight["v"].requests, 7);
  EXPECT_EQ(b.queued_rows_by_weight["w"], 10);
  EXPECT_EQ(b.requests_expired, 1);
  EXPECT_EQ(b.requests_cancelled, 2);
}

}  // namespace
}  // namespace nibble::server
