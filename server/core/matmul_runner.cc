#include "server/core/matmul_runner.h"

#include <chrono>
#include <memory>

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
  const int64_t element_bytes = DTypeSize(dtype);
  const GemmProblem problem =
      MakeGemmProblem(weight, m, dtype, pool_->threads());
  absl::StatusOr<const GemmKernel*> kernel = scheduler_->Pick(problem);
  if (!kernel.ok()) return kernel.status();

  MatmulResult result;
  result.c.resize(m * spec.n * element_bytes);
  result.kernel = std::string((*kernel)->name());
  const auto start = std::chrono::steady_clock::now();
  // An act-order weight's rows were regrouped at import: every kernel, CPU
  // or CUDA, reads A with its columns gathered the same way.
  std::unique_ptr<char[]> gathered;
  const char* kernel_a = a.data();
  if (!weight.activation_order().empty()) {
    gathered = std::make_unique_for_overwrite<char[]>(a.size());
    const int64_t row_bytes = spec.k * element_bytes;
    pool_->ParallelFor(m, [&](int64_t begin, int64_t end) {
      GatherActivationColumns(dtype, end - begin, weight.activation_order(),
                              a.data() + begin * row_bytes,
                              gathered.get() + begin * row_bytes);
    });
    kernel_a = gathered.get();
  }
  if (absl::Status status = (*kernel)->Run(problem,
                                           GemmOperands{.b = &weight,
                                                        .a = kernel_a,
                                                        .c = result.c.data(),
                                                        .device = device},
                                           *pool_);
      !status.ok()) {
    return status;
  }
  result.compute_time_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                               std::chrono::steady_clock::now() - start)
                               .count();
  return result;
}

bool MatmulRunner::LosesPrecision(const PackedWeight& weight, int64_t m,
                                  DType dtype) const {
  absl::StatusOr<const GemmKernel*> kernel =
      scheduler_->Pick(MakeGemmProblem(weight, m, dtype, pool_->threads()));
  return kernel.ok() && (*kernel)->RoundsActivationsToBf16(dtype);
}

}  // namespace nibble::server
