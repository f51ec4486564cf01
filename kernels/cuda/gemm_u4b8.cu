// The u4b8 instantiations of the GEMM kernel (gemm_kernel.cuh).
#include "kernels/cuda/gemm_kernel.cuh"

namespace nibble::cuda::internal {

template KernelChoice ChooseFormatKernel<WeightFormat::kU4b8>(DType, int, bool);

}  // namespace nibble::cuda::internal
