// MatmulBatcher with the real CPU kernels behind a recording gate: the first
// kernel call can be held, so that requests queue behind it and the batches
// they form are known exactly. Results are checked against the float64
// reference per request. The last test runs many unary clients against an
// in-process server and checks that their requests shared kernel calls.
#include "server/core/batcher.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "base/thread_pool.h"
#include "client/nibble_client.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/reference.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/packed_weight.h"
#include "kernels/scheduler.h"
#include "server/core/matmul_runner.h"
#include "server/edge/nibble_server.h"
#include "server/operations/metrics_histogram.h"

namespace nibble::server {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// Long enough that nothing in a test waits this long unless it hangs.
constexpr absl::Duration kHang = absl::Seconds(60);

constexpr DType kDTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

// Batches of at most `rows` rows, which must be a bucket bound.
int64_t BatchesOfAtMost(const BatcherStats& stats, double rows) {
  const std::span<const double> bounds = stats.batch_rows.upper_bounds();
  const auto bound = std::find(bounds.begin(), bounds.end(), rows);
  EXPECT_NE(bound, bounds.end()) << rows << " rows is no bucket bound";
  if (bound == bounds.end()) return -1;
  return stats.batch_rows.CumulativeCounts()[bound - bounds.begin()];
}

// A weight as the server holds it, with its canonical form for the
// reference.
struct TestWeight {
  QuantizedWeight canonical;
  std::shared_ptr<const ResidentWeight> resident;
};

TestWeight MakeWeight(const std::string& name, const WeightSpec& spec,
                      uint64_t seed) {
  TestWeight weight{.canonical = RandomQuantizedWeight(spec, seed),
                    .resident = nullptr};
  absl::StatusOr<PackedWeight> packed = PackedWeight::Pack(weight.canonical);
  EXPECT_TRUE(packed.ok()) << packed.status();
  weight.resident = std::make_shared<const ResidentWeight>(ResidentWeight{
      .name = name, .packed = *std::move(packed), .device = nullptr});
  return weight;
}

// Activations in [-1, 1) as `dtype` bytes, and the values those bytes hold.
std::pair<std::string, std::vector<double>> RandomActivations(
    int64_t m, int64_t k, DType dtype, std::mt19937_64& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> floats(m * k);
  for (float& value : floats) value = uniform(rng);
  std::string bytes(floats.size() * DTypeSize(dtype), '\0');
  ConvertFromFloat(dtype, floats.data(), floats.size(), bytes.data());
  ConvertToFloat(dtype, bytes.data(), floats.size(), floats.data());
  return {std::move(bytes), std::vector<double>(floats.begin(), floats.end())};
}

std::vector<double> Values(const std::string& bytes, DType dtype) {
  std::vector<float> floats(bytes.size() / DTypeSize(dtype));
  ConvertToFloat(dtype, bytes.data(), floats.size(), floats.data());
  return std::vector<double>(floats.begin(), floats.end());
}

// One submitted request: what it must return, and what it did.
struct Submitted {
  const TestWeight* weight = nullptr;
  DType dtype = DType::kF32;
  int64_t m = 0;
  std::string a;             // the request's A, alive until answered
  std::vector<double> want;  // C by the reference

  absl::Mutex mu;
  int answers ABSL_GUARDED_BY(mu) = 0;
  absl::StatusOr<MatmulResult> result ABSL_GUARDED_BY(mu) =
      absl::UnknownError("not answered");
  absl::Notification answered;

  void Answer(absl::StatusOr<MatmulResult> got) {
    absl::MutexLock lock(&mu);
    if (++answers == 1) {
      result = std::move(got);
      answered.Notify();
    }
  }
  // The answer, after waiting for it; fails the test when there was none or
  // more than one.
  absl::StatusOr<MatmulResult> Wait() {
    EXPECT_TRUE(answered.WaitForNotificationWithTimeout(kHang))
        << "never answered";
    absl::MutexLock lock(&mu);
    EXPECT_EQ(answers, 1) << "answered more than once";
    return result;
  }
  // Waits, and checks the answer against the reference.
  void ExpectCorrect() {
    absl::StatusOr<MatmulResult> got = Wait();
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->c.size(), m * weight->canonical.spec.n * DTypeSize(dtype));
    EXPECT_LE(MaxRelativeError(Values(got->c, dtype), want),
              MatmulErrorBound(got->activation_precision, dtype))
        << DTypeName(dtype) << " m=" << m << " on " << weight->resident->name
        << " by " << got->kernel;
  }
};

// The rows of one kernel call.
struct KernelCall {
  const ResidentWeight* weight = nullptr;
  DType dtype = DType::kF32;
  int64_t m = 0;
  ActivationPrecision precision = ActivationPrecision::kBf16;
};

class BatcherTest : public ::testing::Test {
 protected:
  BatcherTest()
      : pool_(2), scheduler_(cpu::CpuKernels()), runner_(&scheduler_, &pool_) {}

  // Every kernel call is recorded; with `hold_first` the first one waits
  // until Release(), so that requests queue behind it. Precision loss is the
  // runner's unless `loses_precision` is given.
  std::unique_ptr<MatmulBatcher> Start(
      BatcherOptions options, bool hold_first = true,
      std::function<bool(const ResidentWeight&, int64_t, DType,
                         ActivationPrecision)>
          loses_precision = nullptr) {
    hold_first_ = hold_first;
    // The gate holds kernel calls on a dispatcher, never on the test thread.
    if (hold_first) options.run_idle_inline = false;
    if (loses_precision == nullptr) {
      loses_precision = [this](const ResidentWeight& weight, int64_t m,
                               DType dtype, ActivationPrecision precision) {
        return runner_.LosesPrecision(weight.packed, m, dtype, precision);
      };
    }
    MatmulBackend backend{
        .run =
            [this](const ResidentWeight& weight, DType dtype,
                   ActivationPrecision precision,
                   absl::Span<const RowBlock> blocks) {
              int64_t m = 0;
              for (const RowBlock& block : blocks) m += block.rows;
              bool hold = false;
              {
                absl::MutexLock lock(&mu_);
                hold = hold_first_ && calls_.empty();
                calls_.push_back({&weight, dtype, m, precision});
              }
              if (hold) {
                held_.Notify();
                // Bounded, so that a failed test ends instead of hanging here.
                release_.WaitForNotificationWithTimeout(kHang);
              }
              return runner_.RunBlocks(weight.packed, dtype, precision, blocks);
            },
        .loses_precision = std::move(loses_precision)};
    return std::make_unique<MatmulBatcher>(options, std::move(backend));
  }

  // Submits m random rows for `weight`.
  std::shared_ptr<Submitted> Submit(
      MatmulBatcher& batcher, const TestWeight& weight, int64_t m, DType dtype,
      absl::Time deadline = absl::InfiniteFuture(),
      std::function<bool()> is_cancelled = nullptr,
      std::optional<ActivationPrecision> precision = std::nullopt) {
    auto submitted = std::make_shared<Submitted>();
    submitted->weight = &weight;
    submitted->dtype = dtype;
    submitted->m = m;
    {
      absl::MutexLock lock(&mu_);
      auto [bytes, values] =
          RandomActivations(m, weight.canonical.spec.k, dtype, rng_);
      submitted->a = std::move(bytes);
      submitted->want = ReferenceMatmul(values, m, weight.canonical);
    }
    batcher.Submit({.weight = weight.resident,
                    .dtype = dtype,
                    .m = m,
                    .a = submitted->a,
                    .activation_precision = precision,
                    .deadline = deadline,
                    .is_cancelled = std::move(is_cancelled),
                    .done = [submitted](absl::StatusOr<MatmulResult> result) {
                      submitted->Answer(std::move(result));
                    }});
    return submitted;
  }

  // Submits `m` rows and waits until their kernel call is held.
  std::shared_ptr<Submitted> SubmitHeld(MatmulBatcher& batcher, int64_t m = 1) {
    std::shared_ptr<Submitted> held =
        Submit(batcher, weight_a_, m, DType::kF32);
    EXPECT_TRUE(held_.WaitForNotificationWithTimeout(kHang));
    return held;
  }

  // Submits one f32 row of `a` (zeros) for weight_a_, answered to `done`.
  void SubmitRow(MatmulBatcher& batcher, const std::string& a,
                 std::function<void(absl::StatusOr<MatmulResult>)> done) {
    batcher.Submit({.weight = weight_a_.resident,
                    .dtype = DType::kF32,
                    .m = 1,
                    .a = a,
                    .activation_precision = std::nullopt,
                    .deadline = absl::InfiniteFuture(),
                    .is_cancelled = nullptr,
                    .done = std::move(done)});
  }

  void Release() { release_.Notify(); }

  // With a held batch of weight_a_ running, submits requests of 2 rows
  // until they hold `rows`: before that they wait for the held batch, then
  // the second dispatcher runs them beside it (max_running_batches = 2).
  void ExpectSecondBatchStartsAt(MatmulBatcher& batcher, int rows) {
    std::shared_ptr<Submitted> held = SubmitHeld(batcher);
    std::vector<std::shared_ptr<Submitted>> submitted;
    for (int i = 0; i < rows / 2 - 1; ++i) {
      submitted.push_back(Submit(batcher, weight_a_, 2, DType::kF16));
    }
    EXPECT_FALSE(submitted[0]->answered.WaitForNotificationWithTimeout(
        absl::Milliseconds(200)));
    submitted.push_back(Submit(batcher, weight_a_, 2, DType::kF16));
    for (const auto& request : submitted) request->ExpectCorrect();
    EXPECT_FALSE(held->answered.HasBeenNotified());
    Release();
    held->ExpectCorrect();
    EXPECT_THAT(CallRows(), ElementsAre(1, rows));
  }

  std::vector<KernelCall> Calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  std::vector<int64_t> CallRows() {
    std::vector<int64_t> rows;
    for (const KernelCall& call : Calls()) rows.push_back(call.m);
    return rows;
  }

  static constexpr uint64_t kSeed = 20261122;

  ThreadPool pool_;
  Scheduler scheduler_;
  MatmulRunner runner_;
  const TestWeight weight_a_ =
      MakeWeight("batch-a", {WeightFormat::kU4b8, 256, 48, 64}, 11);
  const TestWeight weight_b_ =
      MakeWeight("batch-b", {WeightFormat::kU4, 128, 40, 32}, 12);

  absl::Mutex mu_;
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_) = std::mt19937_64(kSeed);
  std::vector<KernelCall> calls_ ABSL_GUARDED_BY(mu_);
  bool hold_first_ = true;
  absl::Notification held_;
  absl::Notification release_;
};

TEST_F(BatcherTest, MergesQueuedRequestsIntoFullBatches) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 16});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  std::vector<std::shared_ptr<Submitted>> submitted(40);
  std::vector<std::thread> clients;
  for (int client = 0; client < 8; ++client) {
    clients.emplace_back([&, client] {
      for (int i = client; i < 40; i += 8) {
        submitted[i] = Submit(*batcher, weight_a_, 1, DType::kBF16);
      }
    });
  }
  for (std::thread& client : clients) client.join();
  EXPECT_EQ(batcher->Stats().queued_rows_by_weight["batch-a"], 40);
  Release();
  held->ExpectCorrect();
  for (const auto& request : submitted) request->ExpectCorrect();
  EXPECT_THAT(CallRows(), ElementsAre(1, 16, 16, 8));
  const BatcherStats stats = batcher->Stats();
  EXPECT_EQ(stats.batches_run, 4);
  EXPECT_EQ(stats.requests_run, 41);
  EXPECT_EQ(stats.rows_run, 41);
  EXPECT_EQ(stats.batch_rows.count(), 4);
  EXPECT_EQ(stats.batch_rows.sum(), 41);
  EXPECT_EQ(BatchesOfAtMost(stats, 16) - BatchesOfAtMost(stats, 8), 2);
  EXPECT_TRUE(stats.queued_rows_by_weight.empty());
}

TEST_F(BatcherTest, FullSecondBatchOfAWeightRunsWhileTheFirstIsHeld) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 8, .dispatchers = 2, .max_running_batches = 2});
  ExpectSecondBatchStartsAt(*batcher, 8);
}

TEST_F(BatcherTest, SecondBatchOfRowsBesideRunningRunsWhileTheFirstIsHeld) {
  SCOPED_TRACE(::testing::Message() << "seed " << kSeed);
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 8,
                                                  .dispatchers = 2,
                                                  .max_running_batches = 2,
                                                  .rows_beside_running = 4});
  ExpectSecondBatchStartsAt(*batcher, 4);
}

TEST_F(BatcherTest, OneRunningBatchPerWeightByDefault) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 8, .dispatchers = 2});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  std::shared_ptr<Submitted> queued =
      Submit(*batcher, weight_a_, 2, DType::kF16);
  // The second dispatcher is free, but the weight has its one batch.
  EXPECT_FALSE(
      queued->answered.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  Release();
  held->ExpectCorrect();
  queued->ExpectCorrect();
}

TEST_F(BatcherTest, EveryRequestGetsItsOwnRowsAndBatchesNeverMix) {
  const uint64_t seed = 303;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 12});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  std::vector<std::shared_ptr<Submitted>> submitted;
  for (int i = 0; i < 60; ++i) {
    const TestWeight& weight = rng() % 2 == 0 ? weight_a_ : weight_b_;
    const int64_t m = std::uniform_int_distribution<int64_t>(1, 5)(rng);
    submitted.push_back(Submit(*batcher, weight, m, kDTypes[rng() % 3]));
  }
  Release();
  for (const auto& request : submitted) request->ExpectCorrect();
  // Six weight and dtype pairs, at most 12 rows per call, so at least six
  // merged calls; fewer than the 60 requests.
  const std::vector<KernelCall> calls = Calls();
  EXPECT_GE(calls.size(), 1u + 6u);
  EXPECT_LT(calls.size(), 1u + 60u);
  for (const KernelCall& call : calls) EXPECT_LE(call.m, 12);
}

TEST_F(BatcherTest, StatsCountEveryRequestRowAndBatchByWeight) {
  const uint64_t seed = 404;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 8});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher, 2);
  std::map<std::string, WeightMatmulCounts> want_by_weight;
  want_by_weight["batch-a"].requests = 1;
  want_by_weight["batch-a"].rows = 2;
  std::vector<std::shared_ptr<Submitted>> submitted;
  for (int i = 0; i < 50; ++i) {
    const TestWeight& weight = rng() % 2 == 0 ? weight_a_ : weight_b_;
    const int64_t m = std::uniform_int_distribution<int64_t>(1, 6)(rng);
    submitted.push_back(Submit(*batcher, weight, m, kDTypes[rng() % 3]));
    WeightMatmulCounts& want = want_by_weight[weight.resident->name];
    ++want.requests;
    want.rows += m;
  }
  Release();
  held->ExpectCorrect();
  for (const auto& request : submitted) request->ExpectCorrect();
  // A reply is counted once it has been handed over, so after its answer:
  // Shutdown waits for the dispatchers to finish.
  batcher->Shutdown();

  const BatcherStats stats = batcher->Stats();
  const int64_t calls = static_cast<int64_t>(Calls().size());
  EXPECT_EQ(stats.batches_run, calls);
  EXPECT_EQ(stats.requests_run, 51);
  ASSERT_EQ(stats.run_by_weight.size(), want_by_weight.size());
  int64_t weight_batches = 0;
  for (const auto& [name, want] : want_by_weight) {
    const WeightMatmulCounts& got = stats.run_by_weight.at(name);
    EXPECT_EQ(got.requests, want.requests) << name;
    EXPECT_EQ(got.rows, want.rows) << name;
    EXPECT_EQ(got.failed_requests, 0) << name;
    EXPECT_EQ(got.failed_rows, 0) << name;
    EXPECT_GT(got.compute_time, absl::ZeroDuration()) << name;
    EXPECT_NE(got.last_run, absl::InfinitePast()) << name;
    // The kernel calls by size add up to the weight's calls and rows.
    int64_t batches = 0;
    int64_t rows = 0;
    for (const auto& [size, counts] : got.batches_by_rows) {
      EXPECT_LE(size, 8) << name;
      batches += counts.batches;
      rows += size * counts.batches;
    }
    EXPECT_EQ(batches, got.batches) << name;
    EXPECT_EQ(rows, got.rows) << name;
    weight_batches += got.batches;
  }
  EXPECT_EQ(weight_batches, calls);
  // Everything queued behind the held call on batch-a waited for it.
  EXPECT_GT(stats.run_by_weight.at("batch-a").queue_time +
                stats.run_by_weight.at("batch-b").queue_time,
            absl::ZeroDuration());
  // One batch-rows and one compute observation per kernel call, one queue
  // observation per request run.
  EXPECT_EQ(stats.batch_rows.count(), calls);
  EXPECT_EQ(stats.batch_rows.sum(), stats.rows_run);
  EXPECT_EQ(stats.compute_seconds.count(), calls);
  EXPECT_GT(stats.compute_seconds.sum(), 0);
  EXPECT_EQ(stats.queue_seconds.count(), 51);
  // Everything queued behind the held call waited for it.
  EXPECT_GT(stats.queue_seconds.sum(), 0);
  // One kernel and one reply observation per request run, a request's kernel
  // time being its batch's.
  EXPECT_EQ(stats.kernel_seconds.count(), 51);
  EXPECT_EQ(stats.reply_seconds.count(), 51);
  absl::Duration compute_time_by_request;
  for (const auto& [name, counts] : stats.run_by_weight) {
    compute_time_by_request += counts.compute_time;
  }
  EXPECT_NEAR(stats.kernel_seconds.sum(),
              absl::ToDoubleSeconds(compute_time_by_request), 1e-6);
  EXPECT_EQ(BatchesOfAtMost(stats, 8), calls) << "a batch passed 8 rows";
  for (const Histogram* histogram :
       {&stats.batch_rows, &stats.compute_seconds, &stats.queue_seconds,
        &stats.kernel_seconds, &stats.reply_seconds}) {
    int64_t total = 0;
    for (const int64_t count : histogram->bucket_counts()) total += count;
    EXPECT_EQ(total, histogram->count());
    EXPECT_EQ(histogram->CumulativeCounts().back(), histogram->count());
  }
}

TEST_F(BatcherTest,
       ForgottenWeightLosesItsCountsAndRunningBatchesAreNotCounted) {
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 8});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher, 2);
  std::shared_ptr<Submitted> queued =
      Submit(*batcher, weight_a_, 4, DType::kF32);
  EXPECT_EQ(batcher->Stats().queued_rows_by_weight.at("batch-a"), 4);

  batcher->ForgetWeight("batch-a");
  Release();
  held->ExpectCorrect();
  queued->ExpectCorrect();
  Submit(*batcher, weight_b_, 3, DType::kF32)->ExpectCorrect();
  const BatcherStats stats = batcher->Stats();
  EXPECT_FALSE(stats.run_by_weight.contains("batch-a"));
  ASSERT_TRUE(stats.run_by_weight.contains("batch-b"));
  EXPECT_EQ(stats.run_by_weight.at("batch-b").rows, 3);
  // The totals still count every request run.
  EXPECT_EQ(stats.requests_run, 3);
  EXPECT_EQ(stats.rows_run, 2 + 4 + 3);

  // A weight uploaded again under the name counts afresh.
  Submit(*batcher, weight_a_, 5, DType::kF32)->ExpectCorrect();
  EXPECT_EQ(batcher->Stats().run_by_weight.at("batch-a").rows, 5);
}

TEST_F(BatcherTest, RequestsNeverJoinABatchThatLosesTheirPrecision) {
  // As if batches of 4 rows and more ran on a kernel that rounds A.
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 16}, /*hold_first=*/true,
            [](const ResidentWeight&, int64_t m, DType, ActivationPrecision) {
              return m >= 4;
            });
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  std::vector<std::shared_ptr<Submitted>> submitted;
  for (int i = 0; i < 7; ++i) {
    submitted.push_back(Submit(*batcher, weight_a_, 1, DType::kF32));
  }
  // Requests that are rounded alone anyway may share a rounding batch.
  submitted.push_back(Submit(*batcher, weight_a_, 5, DType::kF32));
  submitted.push_back(Submit(*batcher, weight_a_, 4, DType::kF32));
  Release();
  for (const auto& request : submitted) request->ExpectCorrect();
  EXPECT_THAT(CallRows(), ElementsAre(1, 3, 3, 1, 9));
}

// A request without a precision takes the server's; requests of different
// precisions never share a kernel call, which runs at theirs.
TEST_F(BatcherTest, RequestsOfOtherActivationPrecisionsNeverShareABatch) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 16,
             .activation_precision = ActivationPrecision::kExact});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  const auto submit = [&](std::optional<ActivationPrecision> precision) {
    return Submit(*batcher, weight_a_, 1, DType::kF32, absl::InfiniteFuture(),
                  nullptr, precision);
  };
  std::vector<std::shared_ptr<Submitted>> exact = {submit(std::nullopt),
                                                   submit(std::nullopt)};
  std::vector<std::shared_ptr<Submitted>> int8 = {
      submit(ActivationPrecision::kInt8), submit(ActivationPrecision::kInt8)};
  exact.push_back(submit(ActivationPrecision::kExact));
  Release();
  for (const auto& request : exact) request->ExpectCorrect();
  for (const auto& request : int8) EXPECT_TRUE(request->Wait().ok());
  const std::vector<KernelCall> calls = Calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].precision, ActivationPrecision::kExact);  // held
  EXPECT_EQ(calls[1].m, 3);
  EXPECT_EQ(calls[1].precision, ActivationPrecision::kExact);
  EXPECT_EQ(calls[2].m, 2);
  EXPECT_EQ(calls[2].precision, ActivationPrecision::kInt8);
}

TEST_F(BatcherTest, ReplyStageTimesEachRequestsHandOver) {
  std::unique_ptr<MatmulBatcher> batcher = Start({}, /*hold_first=*/false);
  constexpr absl::Duration kHandOver = absl::Milliseconds(20);
  const std::string a(weight_a_.canonical.spec.k * sizeof(float), '\0');
  int answers = 0;
  // An idle weight: it runs inline, so its stats are in before Submit
  // returns.
  SubmitRow(*batcher, a,
            [&answers, kHandOver](absl::StatusOr<MatmulResult> result) {
              EXPECT_TRUE(result.ok()) << result.status();
              ++answers;
              absl::SleepFor(kHandOver);
            });
  EXPECT_EQ(answers, 1);
  const BatcherStats stats = batcher->Stats();
  EXPECT_EQ(stats.kernel_seconds.count(), 1);
  EXPECT_GT(stats.kernel_seconds.sum(), 0);
  ASSERT_EQ(stats.reply_seconds.count(), 1);
  // The reply stage holds the whole hand-over, and a sleep is never shorter.
  EXPECT_GE(stats.reply_seconds.sum(), absl::ToDoubleSeconds(kHandOver));
}

// With reply_threads, a batch's replies are handed over from several threads
// at once: the first reply's callback waits for another to begin, which a
// single thread handing them over in turn would never do.
TEST_F(BatcherTest, ReplyThreadsHandABatchsRepliesOverAtOnce) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 8, .reply_threads = 2});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  const std::string a(weight_a_.canonical.spec.k * sizeof(float), '\0');
  absl::Mutex mu;
  int begun = 0;
  int met = 0;
  absl::BlockingCounter answered(8);
  for (int i = 0; i < 8; ++i) {
    SubmitRow(*batcher, a, [&](absl::StatusOr<MatmulResult> result) {
      EXPECT_TRUE(result.ok()) << result.status();
      {
        absl::MutexLock lock(&mu);
        ++begun;
        if (mu.AwaitWithTimeout(absl::Condition(
                                    +[](int* n) { return *n >= 2; }, &begun),
                                kHang)) {
          ++met;
        }
      }
      answered.DecrementCount();
    });
  }
  Release();
  held->ExpectCorrect();
  answered.Wait();
  EXPECT_THAT(CallRows(), ElementsAre(1, 8));
  absl::MutexLock lock(&mu);
  EXPECT_EQ(met, 8) << "the first reply's hand-over never overlapped another";
}

// A batch stops running once its kernel call returns, before its replies
// are handed over: the first request's reply waits for the answer of a
// request queued meanwhile, which a second dispatcher can run only then.
TEST_F(BatcherTest, NextBatchOfAWeightRunsWhileTheLastHandsItsRepliesOver) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 8, .dispatchers = 2, .run_idle_inline = false},
            /*hold_first=*/false);
  const std::string a(weight_a_.canonical.spec.k * sizeof(float), '\0');
  absl::Notification first_replying;
  absl::Notification first_answered;
  absl::Notification second_answered;
  bool overlapped = false;
  SubmitRow(*batcher, a, [&](absl::StatusOr<MatmulResult> result) {
    EXPECT_TRUE(result.ok()) << result.status();
    first_replying.Notify();
    overlapped = second_answered.WaitForNotificationWithTimeout(kHang);
    first_answered.Notify();
  });
  ASSERT_TRUE(first_replying.WaitForNotificationWithTimeout(kHang));
  SubmitRow(*batcher, a, [&](absl::StatusOr<MatmulResult> result) {
    EXPECT_TRUE(result.ok()) << result.status();
    second_answered.Notify();
  });
  ASSERT_TRUE(first_answered.WaitForNotificationWithTimeout(kHang));
  EXPECT_TRUE(overlapped) << "the next batch waited for the last one's replies";
  EXPECT_THAT(CallRows(), ElementsAre(1, 1));
}

TEST_F(BatcherTest, IdleWeightRunsASmallRequestOnTheSubmittingThread) {
  std::unique_ptr<MatmulBatcher> batcher = Start({}, /*hold_first=*/false);
  std::shared_ptr<Submitted> small =
      Submit(*batcher, weight_a_, MatmulBatcher::kMaxInlineRows, DType::kBF16);
  // Answered before Submit returned: no dispatcher was involved.
  EXPECT_TRUE(small->answered.HasBeenNotified());
  small->ExpectCorrect();
  const BatcherStats inline_stats = batcher->Stats();
  EXPECT_EQ(inline_stats.queue_seconds.count(), 1);
  EXPECT_EQ(inline_stats.queue_seconds.sum(), 0)
      << "it ran inline, so it never queued";

  std::unique_ptr<MatmulBatcher> delayed =
      Start({.max_batch_delay = absl::Milliseconds(1)}, /*hold_first=*/false);
  std::shared_ptr<Submitted> waits =
      Submit(*delayed, weight_a_, 1, DType::kBF16);
  waits->ExpectCorrect();
  std::shared_ptr<Submitted> large = Submit(
      *batcher, weight_a_, MatmulBatcher::kMaxInlineRows + 1, DType::kBF16);
  large->ExpectCorrect();
  EXPECT_EQ(batcher->Stats().requests_run, 2);
}

TEST_F(BatcherTest, OneRowBatchesTurnMergingOff) {
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 1});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  std::vector<std::shared_ptr<Submitted>> submitted;
  for (int i = 0; i < 5; ++i) {
    submitted.push_back(Submit(*batcher, weight_a_, 1, DType::kF32));
  }
  Release();
  for (const auto& request : submitted) request->ExpectCorrect();
  EXPECT_THAT(CallRows(), ElementsAre(1, 1, 1, 1, 1, 1));
}

TEST_F(BatcherTest, RequestLargerThanABatchRunsAlone) {
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 4});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  std::shared_ptr<Submitted> large =
      Submit(*batcher, weight_a_, 6, DType::kF32);
  std::shared_ptr<Submitted> small1 =
      Submit(*batcher, weight_a_, 1, DType::kF32);
  std::shared_ptr<Submitted> small2 =
      Submit(*batcher, weight_a_, 2, DType::kF32);
  Release();
  large->ExpectCorrect();
  small1->ExpectCorrect();
  small2->ExpectCorrect();
  EXPECT_THAT(CallRows(), ElementsAre(1, 6, 3));
}

TEST_F(BatcherTest, FullQueueRefusesAtOnceNamingTheWeightAndLimit) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 4, .max_queue_rows = 8});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  std::shared_ptr<Submitted> first =
      Submit(*batcher, weight_a_, 3, DType::kF32);
  std::shared_ptr<Submitted> second =
      Submit(*batcher, weight_a_, 5, DType::kF32);
  std::shared_ptr<Submitted> refused =
      Submit(*batcher, weight_a_, 1, DType::kF32);
  // Answered inside Submit, while the kernel is still held.
  ASSERT_TRUE(refused->answered.HasBeenNotified());
  const absl::Status status = refused->Wait().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
  EXPECT_THAT(status.message(), HasSubstr("\"batch-a\""));
  EXPECT_THAT(status.message(), HasSubstr("8"));
  // Other weights have queues of their own.
  std::shared_ptr<Submitted> other =
      Submit(*batcher, weight_b_, 8, DType::kF32);
  EXPECT_FALSE(other->answered.HasBeenNotified());
  Release();
  first->ExpectCorrect();
  second->ExpectCorrect();
  other->ExpectCorrect();
  EXPECT_EQ(batcher->Stats().requests_refused_queue_full, 1);
  EXPECT_EQ(batcher->Stats().requests_refused_shutting_down, 0);
}

TEST_F(BatcherTest, RequestOfTooManyRowsIsInvalidAndNamesTheLimit) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 4, .max_request_rows = 5}, /*hold_first=*/false);
  std::shared_ptr<Submitted> refused =
      Submit(*batcher, weight_a_, 6, DType::kF32);
  ASSERT_TRUE(refused->answered.HasBeenNotified());
  const absl::Status status = refused->Wait().status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_THAT(status.message(), HasSubstr("--max_request_rows"));
  Submit(*batcher, weight_a_, 5, DType::kF32)->ExpectCorrect();
  EXPECT_THAT(CallRows(), ElementsAre(5));
}

TEST_F(BatcherTest, ExpiredAndCancelledRequestsNeverReachTheKernel) {
  std::unique_ptr<MatmulBatcher> batcher = Start({.max_batch_rows = 16});
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher);
  const absl::Time deadline = absl::Now() + absl::Milliseconds(50);
  std::shared_ptr<Submitted> expiring =
      Submit(*batcher, weight_a_, 3, DType::kF32, deadline);
  auto cancelled_flag = std::make_shared<std::atomic<bool>>(false);
  std::shared_ptr<Submitted> cancelled =
      Submit(*batcher, weight_a_, 4, DType::kF32, absl::InfiniteFuture(),
             [cancelled_flag] { return cancelled_flag->load(); });
  std::shared_ptr<Submitted> live = Submit(*batcher, weight_a_, 2, DType::kF32);
  std::shared_ptr<Submitted> already_expired = Submit(
      *batcher, weight_a_, 1, DType::kF32, absl::Now() - absl::Seconds(1));
  EXPECT_TRUE(already_expired->answered.HasBeenNotified());
  EXPECT_EQ(already_expired->Wait().status().code(),
            absl::StatusCode::kDeadlineExceeded);
  while (absl::Now() <= deadline) absl::SleepFor(absl::Milliseconds(10));
  *cancelled_flag = true;
  Release();
  EXPECT_EQ(expiring->Wait().status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(cancelled->Wait().status().code(), absl::StatusCode::kCancelled);
  live->ExpectCorrect();
  // The held row, then the live request alone.
  EXPECT_THAT(CallRows(), ElementsAre(1, 2));
  const BatcherStats stats = batcher->Stats();
  EXPECT_EQ(stats.requests_expired, 1);
  EXPECT_EQ(stats.requests_cancelled, 1);
}

TEST_F(BatcherTest, DelayWaitsForCompanyButNoLonger) {
  const absl::Duration delay = absl::Milliseconds(500);
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 8, .max_batch_delay = delay},
            /*hold_first=*/false);
  const absl::Time start = absl::Now();
  std::shared_ptr<Submitted> first =
      Submit(*batcher, weight_a_, 1, DType::kF32);
  std::shared_ptr<Submitted> company =
      Submit(*batcher, weight_a_, 2, DType::kF32);
  first->ExpectCorrect();
  company->ExpectCorrect();
  // Nothing filled the batch, so it ran when the delay was over: not before,
  // and (generously) not much after.
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, delay);
  EXPECT_LT(waited, delay + absl::Seconds(20));
  EXPECT_THAT(CallRows(), ElementsAre(3));
}

TEST_F(BatcherTest, FullBatchDoesNotWaitForTheDelay) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 4, .max_batch_delay = absl::Hours(1)},
            /*hold_first=*/false);
  std::vector<std::shared_ptr<Submitted>> submitted;
  for (int i = 0; i < 4; ++i) {
    submitted.push_back(Submit(*batcher, weight_a_, 1, DType::kF32));
  }
  for (const auto& request : submitted) request->ExpectCorrect();
  EXPECT_THAT(CallRows(), ElementsAre(4));
}

TEST_F(BatcherTest, ShutdownRunsQueuedWorkAndRefusesNewWork) {
  std::unique_ptr<MatmulBatcher> batcher =
      Start({.max_batch_rows = 4, .max_batch_delay = absl::Hours(1)});
  // A full batch, which runs without waiting out the delay.
  std::shared_ptr<Submitted> held = SubmitHeld(*batcher, 4);
  std::vector<std::shared_ptr<Submitted>> queued;
  for (int i = 0; i < 3; ++i) {
    queued.push_back(Submit(*batcher, weight_b_, 1, DType::kF32));
  }
  std::thread stopper([&] { batcher->Shutdown(); });
  // Requests sent before Shutdown took effect are queued; the first one
  // after is refused.
  std::shared_ptr<Submitted> refused;
  const absl::Time give_up = absl::Now() + kHang;
  while (refused == nullptr && absl::Now() < give_up) {
    std::shared_ptr<Submitted> probe =
        Submit(*batcher, weight_b_, 1, DType::kF32);
    if (probe->answered.HasBeenNotified()) {
      refused = probe;
    } else {
      queued.push_back(probe);
      absl::SleepFor(absl::Milliseconds(1));
    }
  }
  ASSERT_NE(refused, nullptr);
  EXPECT_EQ(refused->Wait().status().code(), absl::StatusCode::kUnavailable);
  Release();
  stopper.join();
  // Run without waiting out the hour-long delay.
  held->ExpectCorrect();
  for (const auto& request : queued) request->ExpectCorrect();
  EXPECT_EQ(batcher->Stats().requests_refused_shutting_down, 1);
  batcher->Shutdown();  // again: returns at once
}

// Many unary clients of M = 1 on one weight through an in-process server.
TEST(BatchingServerTest, ConcurrentClientsGetCorrectResultsInSharedBatches) {
  const uint64_t seed = 404;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.threads = 2;
  // The delay makes merging certain even if the kernel were instant.
  options.batching = {.max_batch_rows = 16,
                      .max_batch_delay = absl::Milliseconds(200)};
  absl::StatusOr<std::unique_ptr<NibbleServer>> server =
      NibbleServer::Start(options, cpu::CpuKernels());
  ASSERT_TRUE(server.ok()) << server.status();
  NibbleClient client(
      CreateChannel(absl::StrCat("127.0.0.1:", (*server)->port())), kHang);
  const QuantizedWeight weight =
      RandomQuantizedWeight({WeightFormat::kU4b8, 512, 96, 128}, seed);
  ASSERT_TRUE(client.Upload(weight, "shared").ok());

  constexpr int kClients = 48;
  constexpr int kRequestsPerClient = 4;
  std::atomic<int> correct = 0;
  std::vector<std::thread> clients;
  for (int c = 0; c < kClients; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937_64 rng(seed + c);
      for (int i = 0; i < kRequestsPerClient; ++i) {
        const DType dtype = kDTypes[(c + i) % 3];
        auto [a, values] = RandomActivations(1, weight.spec.k, dtype, rng);
        absl::StatusOr<v1::MatmulResponse> response =
            client.Matmul("shared", 1, dtype, a);
        if (!response.ok()) {
          ADD_FAILURE() << "client " << c << ": " << response.status();
          continue;
        }
        const double error = MaxRelativeError(
            Values(response->c(), dtype), ReferenceMatmul(values, 1, weight));
        const double tolerance = client::ErrorBoundOf(*response);
        EXPECT_LE(error, tolerance) << "client " << c << " request " << i;
        if (error <= tolerance) ++correct;
      }
    });
  }
  for (std::thread& thread : clients) thread.join();
  EXPECT_EQ(correct, kClients * kRequestsPerClient);
  const BatcherStats stats = (*server)->batcher_stats();
  EXPECT_EQ(stats.requests_run, kClients * kRequestsPerClient);
  EXPECT_EQ(stats.rows_run, kClients * kRequestsPerClient);
  EXPECT_LT(stats.batches_run, stats.requests_run) << "nothing was merged";
  EXPECT_EQ(BatchesOfAtMost(stats, 16), stats.batches_run)
      << "a batch passed max_batch_rows";
  (*server)->Shutdown();
}

}  // namespace
}  // namespace nibble::server
