// The vector kernels of each instruction set, every variant for every format.
// Each list comes from its own file, compiled for its own target; call one
// only on a CPU that has the instruction set (see cpu_kernels.h).
//
// Example:
//   for (auto& kernel : nibble::cpu::MakeAvx512Kernels()) { ... }
#ifndef NIBBLE_KERNELS_CPU_SIMD_KERNELS_H_
#define NIBBLE_KERNELS_CPU_SIMD_KERNELS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "kernels/gemm_kernel.h"

namespace nibble::cpu {

// AVX2 with FMA and F16C.
std::vector<std::unique_ptr<GemmKernel>> MakeAvx2Kernels();
// AVX-512 F, BW, VL and DQ.
std::vector<std::unique_ptr<GemmKernel>> MakeAvx512Kernels();
// AVX-512 VNNI int8 dot products (vpdpbusd), on top of MakeAvx512Kernels'
// sets: double-buffered only, one kernel per format whose codes are exact
// int8 and whose groups have at least 32 rows (all but nvfp4). They quantize A
// to int8 per row and group, and support only problems that accept
// ActivationPrecision::kInt8.
std::vector<std::unique_ptr<GemmKernel>> MakeAvx512VnniKernels();
// AVX-512 BF16 dot products (vdpbf16ps), on top of MakeAvx512Kernels' sets:
// double-buffered, for large M, and fused, for small M. Both round f32 and
// f16 A to bf16 from `min_rounded_rows` rows (fp32 accumulation; the 4-bit
// weights stay exact) and take bf16 A, which loses nothing, at any M.
std::vector<std::unique_ptr<GemmKernel>> MakeAvx512Bf16Kernels(
    int64_t min_rounded_rows);
// AMX-BF16 with AVX-512 BF16: double-buffered only, for large M, with the
// precision of MakeAvx512Bf16Kernels, rounding from kMinConvertedRows rows
// (a tile's).
std::vector<std::unique_ptr<GemmKernel>> MakeAmxKernels();

// Asks Linux for the AMX tile state (once per process); false when refused.
bool RequestAmxPermission();

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_SIMD_KERNELS_H_
