#include "server/core/batcher.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/thread_name.h"

namespace nibble::server {

void AddStats(const BatcherStats& from, BatcherStats& to) {
  to.batches_run += from.batches_run;
  to.requests_run += from.requests_run;
  to.rows_run += from.rows_run;
  to.batch_rows.Add(from.batch_rows);
  to.queue_seconds.Add(from.queue_seconds);
  to.compute_seconds.Add(from.compute_seconds);
  to.kernel_seconds.Add(from.kernel_seconds);
  to.reply_seconds.Add(from.reply_seconds);
  for (const auto& [name, counts] : from.run_by_weight) {
    WeightMatmulCounts& into = to.run_by_weight[name];
    into.requests += counts.requests;
    into.rows += counts.rows;
    into.batches += counts.batches;
    into.failed_requests += counts.failed_requests;
    into.failed_rows += counts.failed_rows;
    into.queue_time += counts.queue_time;
    into.compute_time += counts.compute_time;
    into.failed_time += counts.failed_time;
    into.last_run = std::max(into.last_run, counts.last_run);
    for (const auto& [rows, size] : counts.batches_by_rows) {
      into.batches_by_rows[rows].batches += size.batches;
      into.batches_by_rows[rows].compute_time += size.compute_time;
    }
  }
  to.requests_refused_queue_full += from.requests_refused_queue_full;
  to.requests_refused_shutting_down += from.requests_refused_shutting_down;
  to.requests_expired += from.requests_expired;
  to.requests_cancelled += from.requests_cancelled;
  for (const auto& [name, rows] : from.queued_rows_by_weight) {
    to.queued_rows_by_weight[name] += rows;
  }
}

MatmulBackend BackendOf(const MatmulRunner* runner) {
  return {.run =
              [runner](const ResidentWeight& weight, DType dtype,
                       ActivationPrecision precision,
                       absl::Span<const RowBlock> blocks) {
                return runner->RunBlocks(weight.packed, dtype, precision,
                                         blocks, weight.device.get());
              },
          .loses_precision =
              [runner](const ResidentWeight& weight, int64_t m, DType dtype,
                       ActivationPrecision precision) {
                return runner->LosesPrecision(weight.packed, m, dtype,
                                              precision);
              }};
}

MatmulBatcher::MatmulBatcher(BatcherOptions options, MatmulBackend backend)
    : options_(std::move(options)),
      backend_(std::move(backend)),
      reply_pool_(std::max(options_.reply_threads, 1), "nibble-reply") {
  for (int i = 0; i < std::max(options_.dispatchers, 1); ++i) {
    dispatchers_.emplace_back([this] {
      NameCurrentThread("nibble-batch");
      DispatchLoop();
    });
  }
}

MatmulBatcher::~MatmulBatcher() { Shutdown(); }

void MatmulBatcher::Submit(MatmulWork work) {
  const ResidentWeight& weight = *work.weight;
  if (!work.activation_precision.has_value()) {
    work.activation_precision = options_.activation_precision;
  }
  if (absl::Status status =
          CheckMatmulShape(weight.packed.spec(), weight.name, work.m, work.k,
                           work.dtype, work.a.size());
      !status.ok()) {
    work.done(status);
    return;
  }
  if (work.m > options_.max_request_rows) {
    work.done(absl::InvalidArgumentError(absl::StrCat(
        "M=", work.m, " rows is more than this server takes per request (",
        options_.max_request_rows,
        ", nibbled --max_request_rows); split A into smaller requests")));
    return;
  }
  const absl::Time now = absl::Now();
  if (work.deadline <= now) {
    work.done(absl::DeadlineExceededError(
        absl::StrCat("the deadline passed before the matmul on weight \"",
                     weight.name, "\" was queued")));
    return;
  }
  absl::Status refusal;
  mu_.Lock();
  const auto found = queues_.find(&weight);
  const int64_t queued_rows = found == queues_.end() ? 0 : found->second.rows;
  if (stopping_) {
    refusal = absl::UnavailableError(
        "the server is shutting down and takes no new matmuls; retry on "
        "another replica");
    ++stats_.requests_refused_shutting_down;
  } else if (queued_rows + work.m > options_.max_queue_rows) {
    refusal = absl::ResourceExhaustedError(
        absl::StrCat("the queue of weight \"", weight.name, "\" holds ",
                     queued_rows, " rows of A and ", work.m,
                     " more would pass its limit of ", options_.max_queue_rows,
                     " rows (max_queue_rows); retry later or send fewer rows"));
    ++stats_.requests_refused_queue_full;
  }
  if (!refusal.ok()) {
    mu_.Unlock();
    work.done(refusal);
    return;
  }
  WeightQueue& queue = queues_[&weight];
  if (queue.weight == nullptr) queue.weight = work.weight;
  if (RunsInline(queue, work)) {
    stats_.queue_seconds.Record(0);
    RunInline(queue, std::move(work));
    return;
  }
  queue.rows += work.m;
  queue.requests.push_back({std::move(work), now});
  work_changed_.Signal();
  mu_.Unlock();
}

bool MatmulBatcher::RunsInline(const WeightQueue& queue,
                               const MatmulWork& work) const {
  return options_.run_idle_inline && queue.running == 0 &&
         queue.requests.empty() &&
         options_.max_batch_delay == absl::ZeroDuration() &&
         work.m <= kMaxInlineRows;
}

void MatmulBatcher::RunInline(WeightQueue& queue, MatmulWork work) {
  ++queue.running;
  Batch batch;
  batch.queue = &queue;
  batch.run.push_back(std::move(work));
  mu_.Unlock();
  RunBatch(std::move(batch));
}

void MatmulBatcher::EndRunning(WeightQueue& queue) {
  --queue.running;
  const bool queued = !queue.requests.empty();
  // Another batch of it may still be running (max_running_batches).
  if (!queued && queue.running == 0) queues_.erase(queue.weight.get());
  // What queued is the dispatchers' now, as is the end. Otherwise they sleep
  // on: waking one would only delay this batch's replies.
  if (queued || stopping_) work_changed_.SignalAll();
}

void MatmulBatcher::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_changed_.SignalAll();
  }
  std::call_once(joined_, [this] {
    for (std::thread& dispatcher : dispatchers_) dispatcher.join();
  });
}

BatcherStats MatmulBatcher::Stats() const {
  absl::MutexLock lock(&mu_);
  BatcherStats stats = stats_;
  for (const auto& [weight, queue] : queues_) {
    if (queue.rows > 0) stats.queued_rows_by_weight[weight->name] += queue.rows;
  }
  return stats;
}

void MatmulBatcher::ForgetWeight(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  stats_.run_by_weight.erase(std::string(name));
  for (auto& [weight, queue] : queues_) {
    if (weight->name == name) queue.forgotten = true;
  }
}

void MatmulBatcher::DispatchLoop() {
  mu_.Lock();
  while (true) {
    absl::Time wake = absl::InfiniteFuture();
    WeightQueue* queue = NextReadyQueue(absl::Now(), &wake);
    if (queue == nullptr) {
      if (stopping_ && queues_.empty()) break;
      work_changed_.WaitWithDeadline(&mu_, wake);
      continue;
    }
    Batch batch = TakeBatch(*queue, absl::Now());
    mu_.Unlock();
    RunBatch(std::move(batch));
    mu_.Lock();
  }
  mu_.Unlock();
}

MatmulBatcher::WeightQueue* MatmulBatcher::NextReadyQueue(absl::Time now,
                                                          absl::Time* wake) {
  WeightQueue* oldest = nullptr;
  for (auto& [weight, queue] : queues_) {
    if (queue.running >= std::max(options_.max_running_batches, 1) ||
        queue.requests.empty()) {
      continue;
    }
    // Beside a running batch of the weight only a full one starts (or one
    // of rows_beside_running rows): a part of one would cost a pass over
    // the weight for a few rows, which wait for the running batch to end
    // instead.
    if (!stopping_ && queue.running > 0 &&
        queue.rows <
            options_.rows_beside_running.value_or(options_.max_batch_rows)) {
      continue;
    }
    const absl::Time enqueued = queue.requests.front().enqueued;
    const absl::Time ready_at = enqueued + options_.max_batch_delay;
    if (!stopping_ && queue.rows < options_.max_batch_rows && ready_at > now) {
      *wake = std::min(*wake, ready_at);
      continue;
    }
    if (oldest == nullptr || enqueued < oldest->requests.front().enqueued) {
      oldest = &queue;
    }
  }
  return oldest;
}

MatmulBatcher::Batch MatmulBatcher::TakeBatch(WeightQueue& queue,
                                              absl::Time now) {
  Batch batch;
  batch.queue = &queue;
  ++queue.running;
  const ResidentWeight& weight = *queue.weight;
  int64_t rows = 0;
  // Whether every request taken would lose precision alone too, so that the
  // batch may.
  bool all_lose_precision = true;
  for (auto it = queue.requests.begin(); it != queue.requests.end();) {
    MatmulWork& work = it->work;
    const int64_t m = work.m;
    if (work.deadline <= now) {
      ++stats_.requests_expired;
      batch.dropped.emplace_back(
          std::move(work),
          absl::DeadlineExceededError(absl::StrCat(
              "the deadline passed while the matmul waited in the queue of "
              "weight \"",
              queue.weight->name, "\"; allow more time or send less load")));
    } else if (work.is_cancelled && work.is_cancelled()) {
      ++stats_.requests_cancelled;
      batch.dropped.emplace_back(
          std::move(work),
          absl::CancelledError("the client cancelled the matmul while it was "
                               "queued; it was not run"));
    } else if (batch.run.empty() ||
               (work.dtype == batch.run.front().dtype &&
                work.activation_precision ==
                    batch.run.front().activation_precision &&
                rows + m <= options_.max_batch_rows)) {
      const ActivationPrecision precision = *work.activation_precision;
      const bool alone_loses = LosesPrecision(weight, m, work.dtype, precision);
      if (!batch.run.empty() &&
          LosesPrecision(weight, rows + m, work.dtype, precision) &&
          !(all_lose_precision && alone_loses)) {
        break;  // the batch is as large as it can be without rounding
      }
      all_lose_precision = all_lose_precision && alone_loses;
      rows += m;
      stats_.queue_seconds.Record(absl::ToDoubleSeconds(now - it->enqueued));
      batch.queue_time += now - it->enqueued;
      batch.run.push_back(std::move(work));
    } else {
      ++it;
      continue;
    }
    queue.rows -= m;
    it = queue.requests.erase(it);
    if (rows >= options_.max_batch_rows) break;
  }
  return batch;
}

bool MatmulBatcher::LosesPrecision(const ResidentWeight& weight, int64_t m,
                                   DType dtype,
                                   ActivationPrecision precision) const {
  return backend_.loses_precision &&
         backend_.loses_precision(weight, m, dtype, precision);
}

void MatmulBatcher::RunBatch(Batch batch) {
  for (auto& [work, status] : batch.dropped) work.done(status);
  if (batch.run.empty()) {
    absl::MutexLock lock(&mu_);
    EndRunning(*batch.queue);
    return;
  }
  const ResidentWeight& weight = *batch.queue->weight;
  const DType dtype = batch.run.front().dtype;
  // Each request's C is written in place by the kernel call, from which it
  // goes to the reply as it is.
  const size_t row_bytes = weight.packed.spec().n * DTypeSize(dtype);
  std::vector<MatmulResult> results(batch.run.size());
  std::vector<RowBlock> blocks;
  blocks.reserve(batch.run.size());
  int64_t rows = 0;
  for (size_t i = 0; i < batch.run.size(); ++i) {
    const MatmulWork& work = batch.run[i];
    results[i].c.resize(work.m * row_bytes);
    blocks.push_back(
        {.a = work.a.data(), .c = results[i].c.data(), .rows = work.m});
    rows += work.m;
  }
  const absl::Time compute_start = absl::Now();
  absl::StatusOr<MatmulRun> run = backend_.run(
      weight, dtype, *batch.run.front().activation_precision, blocks);
  const absl::Time compute_end = absl::Now();
  const absl::Duration compute_time = compute_end - compute_start;
  {
    const int64_t requests = static_cast<int64_t>(batch.run.size());
    absl::MutexLock lock(&mu_);
    ++stats_.batches_run;
    stats_.requests_run += requests;
    stats_.rows_run += rows;
    stats_.batch_rows.Record(static_cast<double>(rows));
    stats_.compute_seconds.Record(absl::ToDoubleSeconds(compute_time));
    for (int64_t i = 0; i < requests; ++i) {
      stats_.kernel_seconds.Record(absl::ToDoubleSeconds(compute_time));
    }
    if (!batch.queue->forgotten) {
      WeightMatmulCounts& counts = stats_.run_by_weight[weight.name];
      counts.requests += requests;
      counts.rows += rows;
      ++counts.batches;
      if (!run.ok()) {
        counts.failed_requests += requests;
        counts.failed_rows += rows;
        counts.failed_time += batch.queue_time + compute_time * requests;
      }
      counts.queue_time += batch.queue_time;
      counts.compute_time += compute_time * requests;
      counts.last_run = compute_end;
      BatchSizeCounts& size = counts.batches_by_rows[rows];
      ++size.batches;
      size.compute_time += compute_time;
    }
    EndRunning(*batch.queue);
    batch.queue = nullptr;
  }
  // When each reply was handed over, recorded after the last one so that
  // none waits for the lock.
  std::vector<absl::Time> replied(batch.run.size());
  reply_pool_.ParallelFor(
      static_cast<int64_t>(batch.run.size()), [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          if (run.ok()) {
            results[i].kernel = run->kernel;
            results[i].activation_precision = run->activation_precision;
            results[i].compute_time_ns = run->compute_time_ns;
            batch.run[i].done(std::move(results[i]));
          } else {
            batch.run[i].done(run.status());
          }
          replied[i] = absl::Now();
        }
      });
  absl::MutexLock lock(&mu_);
  for (const absl::Time time : replied) {
    stats_.reply_seconds.Record(absl::ToDoubleSeconds(time - compute_end));
  }
}

}  // namespace nibble::server
