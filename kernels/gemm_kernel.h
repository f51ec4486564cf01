// The interface every GEMM kernel implements, whatever its backend: it says
// what it is called, which problems it can solve, and solves them.
//
// A kernel computes C [M, N] = A [M, K] · dequant(B), with A and C in the
// problem's dtype (row-major, little-endian) and fp32 accumulation.
//
// Example:
//   nibble::GemmProblem problem{.m = 4, .n = w.spec().n, .k = w.spec().k,
//                               .format = w.spec().format,
//                               .group_size = w.spec().group_size,
//                               .dtype = nibble::DType::kF32, .threads = 2};
//   if (kernel.Supports(problem)) {
//     absl::Status s = kernel.Run(problem, {&w, a.data(), c.data()}, pool);
//   }
#ifndef NIBBLE_KERNELS_GEMM_KERNEL_H_
#define NIBBLE_KERNELS_GEMM_KERNEL_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "base/thread_pool.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "kernels/device_weight.h"
#include "kernels/packed_weight.h"

namespace nibble {

// The kernel family of the design documents, plus the scalar reference.
enum class KernelVariant {
  kReference,       // plain scalar loops; always correct, never fast
  kFused,           // dequantize in registers straight into the FMAs
  kDoubleBuffered,  // dequantize a panel into a buffer while multiplying the
                    // previous one; for large M
  kStriped,         // split K across threads, reduce partial sums at the end
};

// "reference", "fused", "double_buffered" or "striped".
absl::string_view KernelVariantName(KernelVariant variant);

// What a kernel makes of A before multiplying, least lossy first; a problem
// names the lossiest one its caller accepts.
enum class ActivationPrecision {
  kExact,  // A as its dtype gives it, fp32 products
  kBf16,   // A rounded to bf16 (tile and dot-product units)
  kInt8,   // A quantized to int8 per row and group with an fp32 scale
};

// Every precision, least lossy first.
inline constexpr ActivationPrecision kAllActivationPrecisions[] = {
    ActivationPrecision::kExact, ActivationPrecision::kBf16,
    ActivationPrecision::kInt8};

// "exact", "bf16" or "int8".
absl::string_view ActivationPrecisionName(ActivationPrecision precision);
// The nibble.v1.ActivationPrecision value (ACTIVATION_PRECISION_<NAME>), so
// that the server and the client each translate by it instead of a switch of
// their own; 0 there is UNSPECIFIED.
int ActivationPrecisionWireValue(ActivationPrecision precision);
// INVALID_ARGUMENT listing the valid names for any other.
absl::StatusOr<ActivationPrecision> ParseActivationPrecision(
    absl::string_view name);

// The largest MaxRelativeError (format/reference.h) against the float64
// reference that C of `dtype` may show from a kernel that made `precision`
// of A: 1e-4 for fp32 products of f32 A, 1e-2 once A or C has bf16's or
// fp16's precision, 5e-2 for A quantized to int8 (docs/performance.md
// measures each).
double MatmulErrorBound(ActivationPrecision precision, DType dtype);

struct GemmProblem {
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
  WeightFormat format = WeightFormat::kU4b8;
  int64_t group_size = 0;
  DType dtype = DType::kF32;
  int threads = 1;
  // Whether B has the CPU kernels' panels: false for a weight that an
  // accelerator serves whole (PackedWeight::WithoutPanels).
  bool cpu_panels = true;
  // The lossiest treatment of A the caller accepts: kBf16 lets the
  // scheduler pick bf16 kernels where they are faster, kInt8 int8 ones too.
  ActivationPrecision activation_precision = ActivationPrecision::kBf16;

  // e.g. "m=4 n=4096 k=4096 u4b8 group=128 f32 threads=2".
  std::string DebugString() const;
};

// The problem of multiplying `m` rows of `dtype` by `weight`.
GemmProblem MakeGemmProblem(const PackedWeight& weight, int64_t m, DType dtype,
                            int threads);

struct GemmOperands {
  const PackedWeight* b = nullptr;
  const void* a = nullptr;  // [M, K]
  void* c = nullptr;        // [M, N]
  // The weight in the backend's memory; accelerator kernels need it.
  const DeviceWeight* device = nullptr;
};

// The rows of one request in a batch that runs as one problem: its A, read,
// and its C, written, both row-major in the problem's dtype.
struct RowBlock {
  const void* a = nullptr;  // [rows, K]
  void* c = nullptr;        // [rows, N]
  int64_t rows = 0;
};

class GemmKernel {
 public:
  virtual ~GemmKernel() = default;

  // Variant, format and ISA, e.g. "fused_u4b8_avx2".
  virtual absl::string_view name() const = 0;
  virtual KernelVariant variant() const = 0;
  // The CPU instruction-set level whose tuning-table rules apply to the
  // kernel (cpu::IsaName, e.g. "avx2"); empty for kernels that have none.
  virtual absl::string_view isa() const { return {}; }
  virtual bool Supports(const GemmProblem& problem) const = 0;
  // Whether A of `dtype` loses precision to bf16 (8 significant bits) before
  // multiplying, as tile and dot-product units take it; accumulation stays
  // fp32.
  virtual bool RoundsActivationsToBf16(DType /*dtype*/) const { return false; }
  // Whether A is quantized to int8 (with an fp32 scale per row and group)
  // before multiplying, whatever its dtype; accumulation is int32 per group.
  virtual bool QuantizesActivationsToInt8() const { return false; }
  // Requires Supports(problem) and operands matching the problem.
  virtual absl::Status Run(const GemmProblem& problem,
                           const GemmOperands& operands,
                           ThreadPool& pool) const = 0;
  // Runs `blocks`, whose rows add up to problem.m, as one problem: A
  // gathered from the blocks in order, C scattered back into them. `b` and
  // `device` as in GemmOperands. This concatenates A, runs and splits C (a
  // single block runs in place); kernels that copy A and C anyway, as the
  // GPU's do, gather and scatter on the way instead.
  virtual absl::Status RunBlocks(const GemmProblem& problem,
                                 const PackedWeight* b,
                                 const DeviceWeight* device,
                                 absl::Span<const RowBlock> blocks,
                                 ThreadPool& pool) const;
};

// What `kernel` makes of A of `dtype`.
ActivationPrecision ActivationPrecisionOf(const GemmKernel& kernel,
                                          DType dtype);

}  // namespace nibble

#endif  // NIBBLE_KERNELS_GEMM_KERNEL_H_
