// The u4b8 instantiations of the GEMM kernels (gemm_kernel.cuh,
// wgmma_kernel.cuh).
#include "kernels/cuda/gemm_kernel.cuh"
#include "kernels/cuda/wgmma_kernel.cuh"

namespace nibble::cuda::internal {

template KernelChoice ChooseFormatKernel<WeightFormat::kU4b8>(DType, int, bool,
                                                              bool);

template KernelChoice ChooseWgmmaKernel<WeightFormat::kU4b8>(DType, int);

}  // namespace nibble::cuda::internal
