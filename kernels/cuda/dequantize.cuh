// Dequantization of the CUDA kernels: one 32-bit word of codes in the
// device layout (device_layout.h) into four fp16 or bf16 pair registers, by
// bit tricks instead of conversions. The registers are the B fragments of two
// mma.sync n8 tiles; reordered, they are the A fragment of a 16 x 16 block
// (mma.sync in gemm_kernel.cuh, wgmma with A in registers in
// wgmma_kernel.cuh). DequantizeCodes stops before the scales, for kernels
// that apply them to fp32 sums.
//
// Example:
//   uint32_t b[4];
//   Dequantize<WeightFormat::kU4b8, half>(word, scale, zero, b);
#ifndef NIBBLE_KERNELS_CUDA_DEQUANTIZE_CUH_
#define NIBBLE_KERNELS_CUDA_DEQUANTIZE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "format/weight_format.h"

namespace nibble::cuda::internal {

template <WeightFormat kFormat>
inline constexpr bool kFp4Codes = HasFp4Codes(kFormat);

// Bit-level fp16 / bf16 pairs: the magic-number and fp4 constants, and the
// few pair operations the dequantization needs.
template <typename T>
struct Pair;

template <>
struct Pair<half> {
  static constexpr uint32_t kMagic = 0x64006400u;             // 1024: ulp 1
  static constexpr uint32_t kSixteenth = 0x2c002c00u;         // 1/16
  static constexpr uint32_t kMinusMagicOver16 = 0xd400d400u;  // -64
  static constexpr int kFp4Shift = 9;  // e2m1 -> exponent
  static constexpr uint32_t kFp4Mask = 0x0e000e00u;

  __device__ static uint32_t Sub(uint32_t x, uint32_t y) {
    return Bits(__hsub2(Value(x), Value(y)));
  }
  __device__ static uint32_t Mul(uint32_t x, uint32_t y) {
    return Bits(__hmul2(Value(x), Value(y)));
  }
  __device__ static uint32_t Fma(uint32_t x, uint32_t y, uint32_t z) {
    return Bits(__hfma2(Value(x), Value(y), Value(z)));
  }
  __device__ static uint32_t FromHalfPair(uint32_t h) { return h; }
  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }

 private:
  __device__ static half2 Value(uint32_t x) {
    return *reinterpret_cast<half2*>(&x);
  }
  __device__ static uint32_t Bits(half2 x) {
    return *reinterpret_cast<uint32_t*>(&x);
  }
};

template <>
struct Pair<__nv_bfloat16> {
  static constexpr uint32_t kMagic = 0x43004300u;  // 128: ulp 1
  // 2^112: fp4 codes in bf16's exponent bits read as value * 2^-126, and
  // this brings them to fp16's value * 2^-14, which the scales assume.
  static constexpr uint32_t kFp4Rebias = 0x77807780u;
  static constexpr int kFp4Shift = 6;
  static constexpr uint32_t kFp4Mask = 0x01c001c0u;

  __device__ static uint32_t Sub(uint32_t x, uint32_t y) {
    return Bits(__hsub2(Value(x), Value(y)));
  }
  __device__ static uint32_t Mul(uint32_t x, uint32_t y) {
    return Bits(__hmul2(Value(x), Value(y)));
  }
  // fp16 scale pair to bf16, rounding to nearest.
  __device__ static uint32_t FromHalfPair(uint32_t h) {
    return Bits(
        __float22bfloat162_rn(__half22float2(*reinterpret_cast<half2*>(&h))));
  }
  __device__ static void Mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                             uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
        "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }

 private:
  __device__ static __nv_bfloat162 Value(uint32_t x) {
    return *reinterpret_cast<__nv_bfloat162*>(&x);
  }
  __device__ static uint32_t Bits(__nv_bfloat162 x) {
    return *reinterpret_cast<uint32_t*>(&x);
  }
};

// (x & kMask) | kBits in one LOP3: C++'s & and | with two constants compile
// to two, since an instruction holds only one immediate.
template <uint32_t kMask, uint32_t kBits>
__device__ __forceinline__ uint32_t AndOr(uint32_t x) {
  uint32_t result;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n"
      : "=r"(result)
      : "r"(x), "n"(kMask), "n"(kBits));
  return result;
}

// One word of codes into the four B fragment registers of two n8 tiles,
// before the scales: q - zero exactly, or the fp4 value times 2^-14 exactly
// (fp16's exponent bias over e2m1's, which the device layout's scales carry:
// device_layout.h). The two halves of a register are two rows of one column,
// so each n8 tile takes its column's zero point (in both halves of `zero`).
template <WeightFormat kFormat, typename T>
__device__ __forceinline__ void DequantizeCodes(uint32_t word,
                                                const uint32_t (&zero)[2],
                                                uint32_t (&b)[4]) {
  using P = Pair<T>;
  if constexpr (kFp4Codes<kFormat>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      // Sign to bit 15, exponent and mantissa to the low exponent bits.
      const uint32_t codes = word >> (4 * i);
      const uint32_t value = ((codes << 12) & 0x80008000u) |
                             ((codes << P::kFp4Shift) & P::kFp4Mask);
      if constexpr (std::is_same_v<T, half>) {
        b[i] = value;
      } else {
        b[i] = P::Mul(value, P::kFp4Rebias);
      }
    }
  } else if constexpr (std::is_same_v<T, half>) {
    // Codes i and i + 1 from one shift: (magic | q) - (magic + zero) is
    // q - zero exactly, and (magic | 16 q) / 16 - (magic / 16 + zero) too,
    // in one fused multiply-add, since fp16 has room for q four bits up.
#pragma unroll
    for (int i = 0; i < 4; i += 2) {
      const uint32_t codes = word >> (4 * i);
      const int tile = i / 2;
      b[i] =
          P::Sub(AndOr<0x000f000fu, P::kMagic>(codes), P::kMagic | zero[tile]);
      b[i + 1] = P::Fma(AndOr<0x00f000f0u, P::kMagic>(codes), P::kSixteenth,
                        P::kMinusMagicOver16 | (zero[tile] << 4));
    }
  } else {
    // bf16's 7-bit mantissa has no room above the code: one shift each.
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t codes = word >> (4 * i);
      b[i] =
          P::Sub(AndOr<0x000f000fu, P::kMagic>(codes), P::kMagic | zero[i / 2]);
    }
  }
}

// DequantizeCodes times each n8 tile's column scale (in both halves of
// `scale`).
template <WeightFormat kFormat, typename T>
__device__ __forceinline__ void Dequantize(uint32_t word,
                                           const uint32_t (&scale)[2],
                                           const uint32_t (&zero)[2],
                                           uint32_t (&b)[4]) {
  DequantizeCodes<kFormat, T>(word, zero, b);
#pragma unroll
  for (int i = 0; i < 4; ++i) b[i] = Pair<T>::Mul(b[i], scale[i / 2]);
}

// Both halves of a pair set to its low (0) or high (1) half.
__device__ __forceinline__ uint32_t Broadcast(uint32_t pair, int half) {
  return __byte_perm(pair, pair, half == 0 ? 0x1010 : 0x3232);
}

}  // namespace nibble::cuda::internal

#endif  // NIBBLE_KERNELS_CUDA_DEQUANTIZE_CUH_
