#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/reference_kernel.h"
#include "kernels/cpu/simd_kernels.h"

namespace nibble::cpu {

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAmx:
      return "amx";
  }
  return "unknown";
}

Isa DetectIsa() {
  __builtin_cpu_init();
  Isa isa = Isa::kScalar;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    isa = Isa::kAvx2;
    if (__builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
      isa = Isa::kAvx512;
      if (__builtin_cpu_supports("avx512bf16") &&
          __builtin_cpu_supports("amx-tile") &&
          __builtin_cpu_supports("amx-bf16") && RequestAmxPermission()) {
        isa = Isa::kAmx;
      }
    }
  }
  if (const char* cap = std::getenv("NIBBLE_ISA")) {
    for (Isa level : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAmx}) {
      if (IsaName(level) == cap) isa = std::min(isa, level);
    }
  }
  return isa;
}

const std::vector<CpuKernel>& AllCpuKernels() {
  static const std::vector<CpuKernel>* const kernels = [] {
    auto* list = new std::vector<CpuKernel>;
    for (auto& kernel : MakeAmxKernels()) {
      list->push_back({kernel.release(), Isa::kAmx});
    }
    for (auto& kernel : MakeAvx512Kernels()) {
      list->push_back({kernel.release(), Isa::kAvx512});
    }
    for (auto& kernel : MakeAvx2Kernels()) {
      list->push_back({kernel.release(), Isa::kAvx2});
    }
    for (WeightFormat format :
         {WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4}) {
      list->push_back({new ReferenceKernel(format), Isa::kScalar});
    }
    return list;
  }();
  return *kernels;
}

std::vector<const GemmKernel*> CpuKernels(Isa isa) {
  std::vector<const GemmKernel*> kernels;
  for (const CpuKernel& entry : AllCpuKernels()) {
    if (entry.isa <= isa) kernels.push_back(entry.kernel);
  }
  return kernels;
}

}  // namespace nibble::cpu
