// The nvfp4 instantiations of the GEMM kernels (gemm_kernel.cuh,
// wgmma_kernel.cuh): fp4 codes with a scale row per 16 rows of K.
#include "kernels/cuda/gemm_kernel.cuh"
#include "kernels/cuda/wgmma_kernel.cuh"

namespace nibble::cuda::internal {

template KernelChoice ChooseFormatKernel<WeightFormat::kNvfp4>(DType, int, bool,
                                                               bool);

template KernelChoice ChooseWgmmaKernel<WeightFormat::kNvfp4>(DType, int);

}  // namespace nibble::cuda::internal
