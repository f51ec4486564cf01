#include "kernels/cpu/cpu_kernels.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/fused_avx2.h"
#include "kernels/cpu/reference_kernel.h"

namespace nibble::cpu {

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
  }
  return "unknown";
}

Isa DetectIsa() {
  __builtin_cpu_init();
  Isa isa = Isa::kScalar;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      __builtin_cpu_supports("f16c")) {
    isa = Isa::kAvx2;
  }
  if (const char* cap = std::getenv("NIBBLE_ISA")) {
    for (Isa level : {Isa::kScalar, Isa::kAvx2}) {
      if (IsaName(level) == cap) isa = std::min(isa, level);
    }
  }
  return isa;
}

const std::vector<CpuKernel>& AllCpuKernels() {
  static const std::vector<CpuKernel>* const kernels = [] {
    auto* list = new std::vector<CpuKernel>;
    for (WeightFormat format :
         {WeightFormat::kFp4, WeightFormat::kU4b8, WeightFormat::kU4}) {
      list->push_back({new FusedAvx2Kernel(format), Isa::kAvx2});
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
