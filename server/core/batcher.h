// Dynamic batching per weight: Matmul requests on the same resident weight and
// dtype that wait at the same time are merged into one kernel call (their rows
// of A gathered, C written back into each request's reply), so that many
// clients of M = 1 share one pass over the weight instead of streaming it once
// each.
//
// Example:
//   nibble::server::MatmulBatcher batcher(
//       {.max_batch_rows = 64}, nibble::server::BackendOf(&runner));
//   batcher.Submit({.weight = weight, .dtype = nibble::DType::kF32, .m = 1,
//                   .a = a,  // alive until done is called
//                   .done = [](absl::StatusOr<MatmulResult> c) { ... }});
//
// Threads: Submit only queues and never waits for kernels, so gRPC's callback
// threads stay free. `dispatchers` threads each take the next ready batch and
// run it; a weight has at most max_running_batches batches in its kernel
// call (one by default), so that requests arriving meanwhile gather into its
// next one. With more, a batch starts beside a running one of its weight
// only once it is full (max_batch_rows) or has rows_beside_running rows. A
// batch's replies are handed to their callers by reply_threads threads, its
// dispatcher among them, after its kernel call: meanwhile another
// dispatcher may run the weight's next batch.
// Queueing: one FIFO per weight, bounded by max_queue_rows rows of A. A queue
// is ready once it holds max_batch_rows rows or its oldest request has waited
// max_batch_delay. A batch takes the oldest request and then, in order, every
// queued request of the same dtype and activation precision that still fits;
// a request of more than max_batch_rows rows runs alone.
// Precision: a request never joins a batch whose kernel would round A to
// bf16 (or quantize it to int8, where the request accepts that) unless it
// would be alone too (see MatmulBackend), so that an
// f32 result does not depend on the load; with AMX this caps f32 and f16
// batches below the size at which the scheduler picks an AMX kernel.
// Fairness: among ready weights the one whose oldest request has waited
// longest goes first, so a busy weight cannot starve a quiet one.
// Deadlines and cancellation: checked when a batch is formed; a request past
// its deadline or cancelled is answered DEADLINE_EXCEEDED or CANCELLED and
// never reaches the kernel.
// Shutdown: new requests get UNAVAILABLE; queued ones still run (without
// waiting for company). They were admitted, the queue is bounded, and the
// caller (gRPC's shutdown grace) decides how long work may take: it cancels
// calls past the grace period, and cancelled requests are dropped cheaply.
#ifndef NIBBLE_SERVER_CORE_BATCHER_H_
#define NIBBLE_SERVER_CORE_BATCHER_H_

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "format/dtype.h"
#include "kernels/gemm_kernel.h"
#include "server/core/matmul_runner.h"
#include "server/core/weight_store.h"
#include "server/operations/metrics_histogram.h"

namespace nibble::server {

struct BatcherOptions {
  // Rows of A per kernel call; 1 turns merging off.
  int64_t max_batch_rows = 64;
  // How long the oldest queued request may wait for others to join it; zero
  // merges only what queued while the previous batch ran.
  absl::Duration max_batch_delay = absl::ZeroDuration();
  // Rows of A that may wait per weight; more are refused.
  int64_t max_queue_rows = 4096;
  // Rows of A one request may have; larger ones are refused as invalid.
  int64_t max_request_rows = 4096;
  // Threads running batches.
  int dispatchers = 1;
  // Batches of one weight that may run at once, all but one of them of at
  // least rows_beside_running rows. One lets the most requests gather; on a
  // GPU two let one batch's copies overlap another's kernel.
  int max_running_batches = 1;
  // Rows a batch needs to start beside a running batch of its weight; empty
  // for a full batch (max_batch_rows).
  std::optional<int64_t> rows_beside_running = std::nullopt;
  // A request of at most kMaxInlineRows on an idle weight runs at once on
  // the submitting thread; off, every request goes through a dispatcher.
  bool run_idle_inline = true;
  // Threads that hand a batch's replies to their callers, the dispatcher
  // that ran it among them: with many requests per batch, each reply's
  // hand-over to gRPC (which may write it to the socket) otherwise waits
  // for all before it.
  int reply_threads = 1;
  // For requests that name none (nibbled --activation_precision).
  ActivationPrecision activation_precision = ActivationPrecision::kBf16;
};

// One request to multiply `m` rows of A by a weight.
struct MatmulWork {
  std::shared_ptr<const ResidentWeight> weight;
  DType dtype = DType::kF32;
  int64_t m = 0;
  // The request's K, 0 for the weight's.
  int64_t k = 0;
  // [m, K] in dtype. Not copied: the bytes (the RPC's request message)
  // must stay alive and unchanged until `done` has been called.
  absl::string_view a;
  // The lossiest treatment of A the request accepts; empty for
  // BatcherOptions::activation_precision.
  std::optional<ActivationPrecision> activation_precision;
  absl::Time deadline = absl::InfiniteFuture();
  // Whether the caller has gone away; empty for never. Called with the
  // batcher's lock held, so it must be cheap and must not call the batcher.
  std::function<bool()> is_cancelled;
  // Called exactly once: from a batcher thread, or inside Submit for a
  // request refused at once. Gets this request's rows of C.
  std::function<void(absl::StatusOr<MatmulResult>)> done;
};

// What the batcher runs batches with.
struct MatmulBackend {
  // Multiplies the rows of `blocks`, one per request, by `weight` as one
  // kernel call, reading each request's A and writing its C in place (see
  // MatmulRunner::RunBlocks); called once per batch.
  std::function<absl::StatusOr<MatmulRun>(
      const ResidentWeight& weight, DType dtype, ActivationPrecision precision,
      absl::Span<const RowBlock> blocks)>
      run;
  // Whether `m` rows, at most as lossy as `precision`, would run with A
  // below the precision of dtype; empty for never. Called with the
  // batcher's lock held.
  std::function<bool(const ResidentWeight& weight, int64_t m, DType dtype,
                     ActivationPrecision precision)>
      loses_precision;
};

// The server's backend: `runner` must outlive the batcher.
MatmulBackend BackendOf(const MatmulRunner* runner);

// Kernel calls of one size run on one weight.
struct BatchSizeCounts {
  int64_t batches = 0;
  absl::Duration compute_time;
};

// Matmuls run on one weight, by name.
struct WeightMatmulCounts {
  // Requests run, failed ones included, and their rows of A.
  int64_t requests = 0;
  int64_t rows = 0;
  // Kernel calls (batches) run.
  int64_t batches = 0;
  // Requests whose kernel call failed, and their rows.
  int64_t failed_requests = 0;
  int64_t failed_rows = 0;
  // Summed over requests: the wait from Submit to the batch starting, and
  // the kernel call of the request's batch; over all requests and over the
  // failed ones.
  absl::Duration queue_time;
  absl::Duration compute_time;
  absl::Duration failed_time;
  // When the last kernel call ended.
  absl::Time last_run = absl::InfinitePast();
  // Kernel calls by their rows of A.
  std::map<int64_t, BatchSizeCounts> batches_by_rows;
};

// Counters since the batcher started, for metrics.
struct BatcherStats {
  int64_t batches_run = 0;
  int64_t requests_run = 0;
  int64_t rows_run = 0;
  // Rows of A per kernel call, one observation per batch.
  Histogram batch_rows{kBatchRowsBuckets};
  // Per request run: from Submit to its batch starting; 0 for one run inline.
  Histogram queue_seconds{kLatencyBucketsSeconds};
  // Per batch: how long the kernel call took.
  Histogram compute_seconds{kLatencyBucketsSeconds};
  // Per request run, the stages after queue_seconds: its batch's kernel call
  // (the backend's whole run, on a GPU with the copies in and out), then
  // from that call's end to its reply handed to the RPC layer (built and,
  // for a unary call, serialized; a batch's replies go in turn on each of
  // BatcherOptions::reply_threads).
  Histogram kernel_seconds{kLatencyBucketsSeconds};
  Histogram reply_seconds{kLatencyBucketsSeconds};
  // Requests and rows run, by weight name, until the weight is deleted
  // (ForgetWeight).
  std::map<std::string, WeightMatmulCounts> run_by_weight;
  int64_t requests_refused_queue_full = 0;
  int64_t requests_refused_shutting_down = 0;
  // Past their deadline or cancelled while queued, so never run.
  int64_t requests_expired = 0;
  int64_t requests_cancelled = 0;
  // Rows of A waiting, by weight name; weights with none are left out.
  std::map<std::string, int64_t> queued_rows_by_weight;
};

// Adds the counts of `from` into `to`, as if one batcher had run both's work.
void AddStats(const BatcherStats& from, BatcherStats& to);

class MatmulBatcher final {
 public:
  // Rows up to which a request on an idle weight (nothing queued or running,
  // no batch delay) runs at once on the submitting thread: a hand-off to a
  // dispatcher costs more than such a matmul, and requests that arrive
  // meanwhile still queue and merge. Larger ones keep gRPC's threads free.
  static constexpr int64_t kMaxInlineRows = 16;

  // Starts the dispatcher threads.
  MatmulBatcher(BatcherOptions options, MatmulBackend backend);
  // Shutdown().
  ~MatmulBatcher();
  MatmulBatcher(const MatmulBatcher&) = delete;
  MatmulBatcher& operator=(const MatmulBatcher&) = delete;

  // Queues `work`, or answers it at once: INVALID_ARGUMENT for a shape that
  // does not fit the weight or more rows than max_request_rows,
  // DEADLINE_EXCEEDED when the deadline has passed, RESOURCE_EXHAUSTED when the
  // weight's queue is full, UNAVAILABLE after Shutdown.
  void Submit(MatmulWork work) ABSL_LOCKS_EXCLUDED(mu_);

  // Refuses new work, runs what is queued and stops the threads. Idempotent.
  void Shutdown() ABSL_LOCKS_EXCLUDED(mu_);

  BatcherStats Stats() const ABSL_LOCKS_EXCLUDED(mu_);
  // What it was started with.
  const BatcherOptions& options() const { return options_; }

  // Drops the counts of weight `name`, deleted from the store, so that
  // weights uploaded and deleted under ever new names do not grow the stats
  // without end. Batches of it still running are not counted.
  void ForgetWeight(absl::string_view name) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Queued {
    MatmulWork work;
    absl::Time enqueued;
  };
  struct WeightQueue {
    std::shared_ptr<const ResidentWeight> weight;
    std::list<Queued> requests;
    int64_t rows = 0;
    int running = 0;  // batches
    // Set by ForgetWeight: what runs from now on is not counted.
    bool forgotten = false;
  };
  // Requests taken off a queue: those to run together, and those to answer
  // with `status` instead.
  struct Batch {
    WeightQueue* queue = nullptr;
    std::vector<MatmulWork> run;
    std::vector<std::pair<MatmulWork, absl::Status>> dropped;
    // Summed over `run`: the wait from Submit to now.
    absl::Duration queue_time;
  };

  bool RunsInline(const WeightQueue& queue, const MatmulWork& work) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Called with mu_ held; returns with it released.
  void RunInline(WeightQueue& queue, MatmulWork work) ABSL_UNLOCK_FUNCTION(mu_);
  void DispatchLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // The queue to take a batch from now, or null; in that case `wake` is when
  // one may become ready.
  WeightQueue* NextReadyQueue(absl::Time now, absl::Time* wake)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Batch TakeBatch(WeightQueue& queue, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool LosesPrecision(const ResidentWeight& weight, int64_t m, DType dtype,
                      ActivationPrecision precision) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs the batch and answers every request in it; the requests are
  // destroyed here too, outside the lock. The batch stops counting as
  // running on its queue (EndRunning) once its kernel call has returned,
  // before the replies are handed over.
  void RunBatch(Batch batch) ABSL_LOCKS_EXCLUDED(mu_);
  // One batch of `queue` less is running: drops the queue once it is idle
  // and wakes the dispatchers when it has more work or the batcher stops.
  // `queue` may be gone after it.
  void EndRunning(WeightQueue& queue) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const BatcherOptions options_;
  const MatmulBackend backend_;

  mutable absl::Mutex mu_;
  absl::CondVar work_changed_;
  // By weight identity, so that a weight deleted and uploaded again under the
  // same name never shares a batch with the old one.
  std::map<const ResidentWeight*, WeightQueue> queues_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  BatcherStats stats_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> dispatchers_;
  // Hands over the replies of batches (BatcherOptions::reply_threads).
  ThreadPool reply_pool_;
  // Lets concurrent Shutdown calls all wait for the one that joins.
  std::once_flag joined_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_BATCHER_H_
