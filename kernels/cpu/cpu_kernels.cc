#include "kernels/cpu/cpu_kernels.h"

#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "kernels/cpu/format_kernel.h"
#include "kernels/cpu/reference_kernel.h"
#include "kernels/cpu/simd_kernels.h"

namespace nibble::cpu {
namespace {

// F16C and the AMX features are read from CPUID because clang's
// __builtin_cpu_supports does not know their names (only GCC's does).
bool HasF16c() {
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
}

bool HasAmxTileAndBf16() {
  constexpr unsigned kAmxBf16 = 1u << 22, kAmxTile = 1u << 24;  // leaf 7 EDX
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) &&
         (edx & (kAmxBf16 | kAmxTile)) == (kAmxBf16 | kAmxTile);
}

}  // namespace

absl::string_view IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Vnni:
      return "avx512_vnni";
    case Isa::kAvx512Bf16:
      return "avx512_bf16";
    case Isa::kAmx:
      return "amx";
  }
  return "unknown";
}

Isa DetectIsa() {
  __builtin_cpu_init();
  Isa isa = Isa::kScalar;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
      HasF16c()) {
    isa = Isa::kAvx2;
    if (__builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") &&
        __builtin_cpu_supports("avx512dq")) {
      isa = Isa::kAvx512;
      // Every CPU with AVX-512 BF16 so far has VNNI too.
      if (__builtin_cpu_supports("avx512vnni")) {
        isa = Isa::kAvx512Vnni;
        if (__builtin_cpu_supports("avx512bf16")) {
          isa = Isa::kAvx512Bf16;
          if (HasAmxTileAndBf16() && RequestAmxPermission()) isa = Isa::kAmx;
        }
      }
    }
  }
  if (const char* cap = std::getenv("NIBBLE_ISA")) {
    for (Isa level : kAllIsas) {
      if (IsaName(level) == cap) isa = std::min(isa, level);
    }
  }
  return isa;
}

const std::vector<CpuKernel>& AllCpuKernels() {
  static const std::vector<CpuKernel>* const kernels = [] {
    auto* list = new std::vector<CpuKernel>;
    for (auto& kernel : MakeAvx512VnniKernels()) {
      list->push_back({kernel.release(), Isa::kAvx512Vnni});
    }
    for (auto& kernel : MakeAmxKernels()) {
      list->push_back({kernel.release(), Isa::kAmx});
    }
    // The fewest rows of f32 or f16 A each bf16 level rounds. On Zen 4 the
    // fused bf16 kernel with A rounded takes 0.43-0.76x the exact fp32 loop's
    // time at M = 1-8 (u4b8 and fp4 g128, 4096 x 4096 and 8192 x 28672,
    // 2026-11-27), so avx512_bf16 rounds from one row. The amx level keeps
    // its tiles' 16 rows: its rules were measured on exact kernels below
    // them, and on the Xeon that wrote them the fused bf16 kernel runs at
    // 0.7x the fp32 kernels' speed (docs/performance.md).
    for (auto& kernel : MakeAvx512Bf16Kernels(kMinConvertedRows)) {
      list->push_back({.kernel = kernel.release(),
                       .isa = Isa::kAvx512Bf16,
                       .lowest_level = Isa::kAmx});
    }
    for (auto& kernel : MakeAvx512Bf16Kernels(/*min_rounded_rows=*/1)) {
      list->push_back({.kernel = kernel.release(),
                       .isa = Isa::kAvx512Bf16,
                       .highest_level = Isa::kAvx512Bf16});
    }
    for (auto& kernel : MakeAvx512Kernels()) {
      list->push_back({kernel.release(), Isa::kAvx512});
    }
    for (auto& kernel : MakeAvx2Kernels()) {
      list->push_back({kernel.release(), Isa::kAvx2});
    }
    for (WeightFormat format : kAllWeightFormats) {
      list->push_back({new ReferenceKernel(format), Isa::kScalar});
    }
    return list;
  }();
  return *kernels;
}

std::vector<const GemmKernel*> CpuKernels(Isa isa) {
  std::vector<const GemmKernel*> kernels;
  for (const CpuKernel& entry : AllCpuKernels()) {
    if (entry.lowest_level <= isa && isa <= entry.highest_level) {
      kernels.push_back(entry.kernel);
    }
  }
  return kernels;
}

}  // namespace nibble::cpu
