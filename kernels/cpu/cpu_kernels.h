// The one place that decides which CPU kernels this machine runs, by its
// instruction sets. The environment variable NIBBLE_ISA (scalar, avx2,
// avx512, avx512_vnni, avx512_bf16, amx) caps the level, to test or compare
// the slower paths on a faster CPU. The avx512_bf16 and amx kernels round
// activations to bf16; NIBBLE_ISA=avx512_vnni (or lower) keeps every product
// in fp32. The avx512_vnni kernels quantize activations to int8 and run only
// for problems that accept it (ActivationPrecision::kInt8).
//
// Example:
//   nibble::Scheduler scheduler(nibble::cpu::CpuKernels());
#ifndef NIBBLE_KERNELS_CPU_CPU_KERNELS_H_
#define NIBBLE_KERNELS_CPU_CPU_KERNELS_H_

#include <vector>

#include "absl/strings/string_view.h"
#include "kernels/gemm_kernel.h"

namespace nibble::cpu {

// Ordered: each level includes the ones before it.
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Vnni, kAvx512Bf16, kAmx };

// Every level, slowest first.
inline constexpr Isa kAllIsas[] = {Isa::kScalar,     Isa::kAvx2,
                                   Isa::kAvx512,     Isa::kAvx512Vnni,
                                   Isa::kAvx512Bf16, Isa::kAmx};

absl::string_view IsaName(Isa isa);
// What this CPU supports, capped by NIBBLE_ISA when set.
Isa DetectIsa();

struct CpuKernel {
  const GemmKernel* kernel;
  Isa isa;  // the level the kernel needs
  // The levels that list it: from `isa` up, but for the avx512_bf16 kernels,
  // made once for each bf16 level, as each rounds A from its own rows
  // (cpu_kernels.cc).
  Isa lowest_level = isa;
  Isa highest_level = Isa::kAmx;
};

// Every CPU kernel compiled in, whether or not this CPU can run it. A name
// appears twice where two levels list a kernel made differently.
const std::vector<CpuKernel>& AllCpuKernels();

// The kernels that run at `isa`: the int8 ones first (only problems that
// accept int8 take them, and those take them before any other), then the
// rest fastest ISA first, the references last.
// The kernels live for the whole program.
std::vector<const GemmKernel*> CpuKernels(Isa isa = DetectIsa());

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_CPU_KERNELS_H_
