#include "kernels/cpu/reference_kernel.h"

#include <algorithm>

#include "format/dequant.h"
#include "kernels/cpu/float_operands.h"

namespace nibble::cpu {

absl::Status ReferenceKernel::Run(const GemmProblem& problem,
                                  const GemmOperands& operands,
                                  ThreadPool& pool) const {
  constexpr int64_t kWidth = PackedWeight::kPanelWidth;
  const PackedWeight& b = *operands.b;
  const int64_t k = problem.k;
  const int64_t n = problem.n;
  const int64_t group_size = problem.group_size;
  WithFloatOperands(problem, operands, [&](const float* a, float* c) {
    pool.ParallelFor(
        b.panels(),
        [&](int64_t first_panel, int64_t end_panel) {
          for (int64_t panel = first_panel; panel < end_panel; ++panel) {
            const uint32_t* codes = b.panel_codes(panel);
            const uint16_t* scales = b.panel_scales(panel);
            const uint8_t* zeros = b.panel_zeros(panel);
            const int64_t width = std::min(kWidth, n - panel * kWidth);
            for (int64_t row = 0; row < problem.m; ++row) {
              for (int64_t col = 0; col < width; ++col) {
                float sum = 0.0f;
                for (int64_t kk = 0; kk < k; ++kk) {
                  const uint32_t word =
                      codes[kk / kCodesPerWord * kWidth + col];
                  const uint8_t code =
                      (word >> PackedWeight::CodeShift(kk % kCodesPerWord)) &
                      0xf;
                  const int64_t at = kk / group_size * kWidth + col;
                  const float weight = DequantizeCode(
                      format(), code,
                      PackedWeight::ScaleValue(format(), scales[at]),
                      zeros != nullptr ? zeros[at] : 0);
                  sum += a[row * k + kk] * weight;
                }
                c[row * n + panel * kWidth + col] = sum * b.spec().global_scale;
              }
            }
          }
        },
        problem.threads);
  });
  return absl::OkStatus();
}

}  // namespace nibble::cpu
