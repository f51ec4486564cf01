#include "server/core/matmul_runner.h"

#include <chrono>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "format/activation_order.h"

namespace nibble::server {

MatmulRunner::MatmulRunner(const Scheduler* scheduler, ThreadPool* pool)
    : scheduler_(scheduler), pool_(pool) {}

absl::Status CheckMatmulShape(const WeightSpec& spec,
                              absl::string_view weight_name, int64_t m,
                              int64_t k, DType dtype, size_t a_bytes) {
  if (m <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("m=", m, ": A needs at least one row"));
  }
  if (k != 0 && k != spec.k) {
    return absl::InvalidArgumentError(
        absl::StrCat("k=", k, " does not match weight \"", weight_name,
                     "\", which has k=", spec.k));
  }
  const int64_t element_bytes = DTypeSize(dtype);
  const int64_t row_bytes = spec.k * element_bytes;
  // Checked before multiplying, so that a huge m cannot overflow.
  if (m > static_cast<int64_t>(a_bytes) / row_bytes ||
      m * row_bytes != static_cast<int64_t>(a_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "A has ", a_bytes, " bytes but m=", m, " rows of k=", spec.k, " ",
        DTypeName(dtype), " values need ", absl::StrCat(m, " x ", row_bytes),
        " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<MatmulResult> MatmulRunner::Run(
    const PackedWeight& weight, absl::string_view weight_name, int64_t m,
    int64_t k, DType dtype, absl::string_view a,
    const nibble::DeviceWeight* device) const {
  const WeightSpec& spec = weight.spec();
  if (absl::Status status =
          CheckMatmulShape(spec, weight_name, m, k, dtype, a.size());
      !status.ok()) {
    return status;
  }
  MatmulResult result;
  result.c.resize(m * spec.n * DTypeSize(dtype));
  const RowBlock block{.a = a.data(), .c = result.c.data(), .rows = m};
  absl::StatusOr<MatmulRun> run =
      RunBlocks(weight, dtype, ActivationPrecision::kBf16, {block}, device);
  if (!run.ok()) return run.status();
  result.kernel = std::move(run->kernel);
  result.activation_precision = run->activation_precision;
  result.compute_time_ns = run->compute_time_ns;
  return result;
}

absl::StatusOr<MatmulRun> MatmulRunner::RunBlocks(
    const PackedWeight& weight, DType dtype, ActivationPrecision precision,
    absl::Span<const RowBlock> blocks,
    const nibble::DeviceWeight* device) const {
  int64_t m = 0;
  for (const RowBlock& block : blocks) m += block.rows;
  if (m <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("m=", m, ": A needs at least one row"));
  }
  GemmProblem problem = MakeGemmProblem(weight, m, dtype, pool_->threads());
  problem.activation_precision = precision;
  absl::StatusOr<const GemmKernel*> kernel = scheduler_->Pick(problem);
  if (!kernel.ok()) return kernel.status();

  MatmulRun run{.kernel = std::string((*kernel)->name()),
                .activation_precision = ActivationPrecisionOf(**kernel, dtype)};
  const auto start = std::chrono::steady_clock::now();
  // An act-order weight's rows were regrouped at import: every kernel, CPU
  // or CUDA, reads A with its columns gathered the same way, here into one
  // buffer that the blocks then read from.
  std::unique_ptr<char[]> gathered;
  std::vector<RowBlock> gathered_blocks;
  if (!weight.activation_order().empty()) {
    const int64_t row_bytes = problem.k * DTypeSize(dtype);
    gathered = std::make_unique_for_overwrite<char[]>(m * row_bytes);
    int64_t row = 0;
    for (const RowBlock& block : blocks) {
      gathered_blocks.push_back({.a = gathered.get() + row * row_bytes,
                                 .c = block.c,
                                 .rows = block.rows});
      pool_->ParallelFor(block.rows, [&](int64_t begin, int64_t end) {
        GatherActivationColumns(
            dtype, end - begin, weight.activation_order(),
            static_cast<const char*>(block.a) + begin * row_bytes,
            gathered.get() + (row + begin) * row_bytes);
      });
      row += block.rows;
    }
    blocks = gathered_blocks;
  }
  if (absl::Status status =
          (*kernel)->RunBlocks(problem, &weight, device, blocks, *pool_);
      !status.ok()) {
    return status;
  }
  run.compute_time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now() - start)
                            .count();
  return run;
}

bool MatmulRunner::LosesPrecision(const PackedWeight& weight, int64_t m,
                                  DType dtype,
                                  ActivationPrecision precision) const {
  GemmProblem problem = MakeGemmProblem(weight, m, dtype, pool_->threads());
  problem.activation_precision = precision;
  absl::StatusOr<const GemmKernel*> kernel = scheduler_->Pick(problem);
  return kernel.ok() &&
         ActivationPrecisionOf(**kernel, dtype) != ActivationPrecision::kExact;
}

}  // namespace nibble::server
