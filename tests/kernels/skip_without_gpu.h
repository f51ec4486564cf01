// SKIP_WITHOUT_GPU(): skips the calling test, with a message saying why,
// where no CUDA GPU is present, so that the gpu-labelled tests pass as
// skipped on a machine without one.
//
// Example:
//   TEST(CudaKernelsTest, Something) {
//     SKIP_WITHOUT_GPU();
//     ...
//   }
#ifndef NIBBLE_TESTS_KERNELS_SKIP_WITHOUT_GPU_H_
#define NIBBLE_TESTS_KERNELS_SKIP_WITHOUT_GPU_H_

#include "gtest/gtest.h"
#include "kernels/cuda/cuda_backend.h"

#define SKIP_WITHOUT_GPU()                              \
  if (::nibble::cuda::DeviceCount() == 0) {             \
    GTEST_SKIP() << "no CUDA GPU: this test needs one"; \
  }

#endif  // NIBBLE_TESTS_KERNELS_SKIP_WITHOUT_GPU_H_
