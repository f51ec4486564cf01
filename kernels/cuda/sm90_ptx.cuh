// The Hopper instructions the wgmma kernel (wgmma_kernel.cuh) issues, one
// small wrapper each: shared-memory barriers (mbarrier) with transaction
// counts, tensor copies (TMA) that complete on them, warpgroup
// MMAs with A in registers, and register reallocation between warpgroups.
// Device code for sm_90a only.
//
// Example (one stage of a producer and its consumers):
//   producer: ArriveExpectBytes(full, bytes); LoadTile2d(dst, map, x, y, full);
//   consumer: WaitBarrier(full, phase); ... wgmma ...; ArriveBarrier(empty);
#ifndef NIBBLE_KERNELS_CUDA_SM90_PTX_CUH_
#define NIBBLE_KERNELS_CUDA_SM90_PTX_CUH_

#include <cuda.h>

#include <cstdint>

#include "kernels/cuda/gemm_common.cuh"

namespace nibble::cuda::internal {

__device__ __forceinline__ void InitBarrier(uint64_t* barrier, int arrivals) {
  asm volatile(
      "mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(SharedAddress(barrier)),
      "r"(arrivals));
}
// Makes initialized barriers visible to the copy engine.
__device__ __forceinline__ void FenceBarrierInit() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
// One arrival that also announces `bytes` to come from copies.
__device__ __forceinline__ void ArriveExpectBytes(uint64_t* barrier,
                                                  uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(
                   SharedAddress(barrier)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void ArriveBarrier(uint64_t* barrier) {
  asm volatile(
      "mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(SharedAddress(barrier))
      : "memory");
}
// Until the phase of parity `parity` has completed.
__device__ __forceinline__ void WaitBarrier(uint64_t* barrier,
                                            uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred complete;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 complete, [%1], %2;\n"
        "selp.u32 %0, 1, 0, complete;\n}\n"
        : "=r"(done)
        : "r"(SharedAddress(barrier)), "r"(parity)
        : "memory");
  } while (done == 0);
}

// The box of `map` at element (x, y) or (x, y, z, w) into shared memory,
// completing on `barrier` with the whole box's bytes (elements outside the
// tensor are 0).
__device__ __forceinline__ void LoadTile2d(void* shared, const CUtensorMap* map,
                                           int x, int y, uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::"
      "bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(SharedAddress(shared)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y),
      "r"(SharedAddress(barrier))
      : "memory");
}
__device__ __forceinline__ void LoadTile4d(void* shared, const CUtensorMap* map,
                                           int x, int y, int z, int w,
                                           uint64_t* barrier) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::"
      "bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          SharedAddress(shared)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(x), "r"(y), "r"(z), "r"(w),
      "r"(SharedAddress(barrier))
      : "memory");
}

// A barrier among the `threads` threads that name barrier `id` (1 to 15; 0
// is __syncthreads').
__device__ __forceinline__ void SyncThreads(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

template <int kRegisters>
__device__ __forceinline__ void RaiseRegisters() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void LowerRegisters() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegisters));
}

// The descriptor of a K-major operand in shared memory laid out as the
// tensor copy's 128-byte swizzle writes it: rows of 64 fp16 values (128
// bytes), 8-row groups 1024 bytes apart, the group 1024-byte aligned. A start
// 32 bytes further on selects the next 16 values of K.
__device__ __forceinline__ uint64_t SwizzledOperand(const void* shared) {
  const uint64_t address = SharedAddress(shared);
  return ((address & 0x3ffff) >> 4) | (uint64_t{1} << 16) |
         (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

// Keeps the compiler from moving accesses of `x` across the asynchronous
// MMAs that read and write it.
__device__ __forceinline__ void FenceRegister(float& x) {
  asm volatile("" : "+f"(x)::"memory");
}
__device__ __forceinline__ void FenceMmaOperands() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void CommitMmas() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void WaitMmas() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(kPending)
               : "memory");
}

// d[64 x N] += a[64 x 16] · b[16 x N] for N = 8, 16, 32, 64, 128 or 256: A from
// registers (the four pair registers of each thread, as mma.sync's m16n8k16
// A fragment per warp), B K-major in shared memory (`b`, a SwizzledOperand
// of N rows), fp32 accumulators. One instruction of width N reads A once for
// all N columns, where N / 64 instructions of width 64 read it N / 64 times.
template <typename T, int N>
__device__ __forceinline__ void MmaM64K16(float (&d)[N / 2],
                                          const uint32_t (&a)[4], uint64_t b);

#define NIBBLE_WGMMA_M64N8K16(type)                                 \
  asm volatile(                                                     \
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %9, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n8k16.f32." type "." type    \
      " {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, "                   \
      "accumulate, 1, 1, 0;\n}\n"                                   \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])              \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define NIBBLE_WGMMA_M64N16K16(type)                                 \
  asm volatile(                                                      \
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %13, 0;\n" \
      "wgmma.mma_async.sync.aligned.m64n16k16.f32." type "." type    \
      " {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, %12, " \
      "accumulate, 1, 1, 0;\n}\n"                                    \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),  \
        "+f"(d[5]), "+f"(d[6]), "+f"(d[7])                           \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define NIBBLE_WGMMA_M64N32K16(type)                                     \
  asm volatile(                                                          \
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %21, 0;\n"     \
      "wgmma.mma_async.sync.aligned.m64n32k16.f32." type "." type        \
      " {"                                                               \
      "%0, %1, %2, %3, %4, %5, %6, %7, "                                 \
      "%8, %9, %10, %11, %12, %13, %14, %15"                             \
      "}, {%16, %17, %18, %19}, %20, accumulate, 1, 1, 0;\n}\n"          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),      \
        "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),      \
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
        "+f"(d[15])                                                      \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define NIBBLE_WGMMA_M64N64K16(type)                                     \
  asm volatile(                                                          \
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %37, 0;\n"     \
      "wgmma.mma_async.sync.aligned.m64n64k16.f32." type "." type        \
      " {"                                                               \
      "%0, %1, %2, %3, %4, %5, %6, %7, "                                 \
      "%8, %9, %10, %11, %12, %13, %14, %15, "                           \
      "%16, %17, %18, %19, %20, %21, %22, %23, "                         \
      "%24, %25, %26, %27, %28, %29, %30, %31"                           \
      "}, {%32, %33, %34, %35}, %36, accumulate, 1, 1, 0;\n}\n"          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),      \
        "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),      \
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
        "+f"(d[30]), "+f"(d[31])                                         \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define NIBBLE_WGMMA_M64N128K16(type)                                    \
  asm volatile(                                                          \
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %69, 0;\n"     \
      "wgmma.mma_async.sync.aligned.m64n128k16.f32." type "." type       \
      " {"                                                               \
      "%0, %1, %2, %3, %4, %5, %6, %7, "                                 \
      "%8, %9, %10, %11, %12, %13, %14, %15, "                           \
      "%16, %17, %18, %19, %20, %21, %22, %23, "                         \
      "%24, %25, %26, %27, %28, %29, %30, %31, "                         \
      "%32, %33, %34, %35, %36, %37, %38, %39, "                         \
      "%40, %41, %42, %43, %44, %45, %46, %47, "                         \
      "%48, %49, %50, %51, %52, %53, %54, %55, "                         \
      "%56, %57, %58, %59, %60, %61, %62, %63"                           \
      "}, {%64, %65, %66, %67}, %68, accumulate, 1, 1, 0;\n}\n"          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),      \
        "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),      \
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), \
        "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])               \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
#define NIBBLE_WGMMA_M64N256K16(type)                                         \
  asm volatile(                                                               \
      "{\n.reg .pred accumulate;\nsetp.ne.b32 accumulate, %133, 0;\n"         \
      "wgmma.mma_async.sync.aligned.m64n256k16.f32." type "." type            \
      " {"                                                                    \
      "%0, %1, %2, %3, %4, %5, %6, %7, "                                      \
      "%8, %9, %10, %11, %12, %13, %14, %15, "                                \
      "%16, %17, %18, %19, %20, %21, %22, %23, "                              \
      "%24, %25, %26, %27, %28, %29, %30, %31, "                              \
      "%32, %33, %34, %35, %36, %37, %38, %39, "                              \
      "%40, %41, %42, %43, %44, %45, %46, %47, "                              \
      "%48, %49, %50, %51, %52, %53, %54, %55, "                              \
      "%56, %57, %58, %59, %60, %61, %62, %63, "                              \
      "%64, %65, %66, %67, %68, %69, %70, %71, "                              \
      "%72, %73, %74, %75, %76, %77, %78, %79, "                              \
      "%80, %81, %82, %83, %84, %85, %86, %87, "                              \
      "%88, %89, %90, %91, %92, %93, %94, %95, "                              \
      "%96, %97, %98, %99, %100, %101, %102, %103, "                          \
      "%104, %105, %106, %107, %108, %109, %110, %111, "                      \
      "%112, %113, %114, %115, %116, %117, %118, %119, "                      \
      "%120, %121, %122, %123, %124, %125, %126, %127"                        \
      "}, {%128, %129, %130, %131}, %132, accumulate, 1, 1, 0;\n}\n"          \
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]),           \
        "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]),           \
        "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]),      \
        "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]),      \
        "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]),      \
        "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),      \
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),      \
        "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),      \
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]),      \
        "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]),      \
        "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]),      \
        "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),      \
        "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]),      \
        "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]),      \
        "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), "+f"(d[74]),      \
        "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),      \
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]),      \
        "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),      \
        "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]),      \
        "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]),      \
        "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), \
        "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), \
        "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), \
        "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), \
        "+f"(d[125]), "+f"(d[126]), "+f"(d[127])                              \
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))

#define NIBBLE_WGMMA_SPECIALIZATIONS(n)                        \
  template <>                                                  \
  __device__ __forceinline__ void MmaM64K16<half, n>(          \
      float(&d)[n / 2], const uint32_t(&a)[4], uint64_t b) {   \
    NIBBLE_WGMMA_M64N##n##K16("f16");                          \
  }                                                            \
  template <>                                                  \
  __device__ __forceinline__ void MmaM64K16<__nv_bfloat16, n>( \
      float(&d)[n / 2], const uint32_t(&a)[4], uint64_t b) {   \
    NIBBLE_WGMMA_M64N##n##K16("bf16");                         \
  }
NIBBLE_WGMMA_SPECIALIZATIONS(8)
NIBBLE_WGMMA_SPECIALIZATIONS(16)
NIBBLE_WGMMA_SPECIALIZATIONS(32)
NIBBLE_WGMMA_SPECIALIZATIONS(64)
NIBBLE_WGMMA_SPECIALIZATIONS(128)
NIBBLE_WGMMA_SPECIALIZATIONS(256)
#undef NIBBLE_WGMMA_SPECIALIZATIONS
#undef NIBBLE_WGMMA_M64N8K16
#undef NIBBLE_WGMMA_M64N16K16
#undef NIBBLE_WGMMA_M64N32K16
#undef NIBBLE_WGMMA_M64N64K16
#undef NIBBLE_WGMMA_M64N128K16
#undef NIBBLE_WGMMA_M64N256K16

}  // namespace nibble::cuda::internal

#endif  // NIBBLE_KERNELS_CUDA_SM90_PTX_CUH_
