// The nvfp4 instantiations of the GEMM kernel (gemm_kernel.cuh): fp4 codes
// with a scale row per 16 rows of K.
#include "kernels/cuda/gemm_kernel.cuh"

namespace nibble::cuda::internal {

template KernelChoice ChooseFormatKernel<WeightFormat::kNvfp4>(DType, int,
                                                               bool);

}  // namespace nibble::cuda::internal
