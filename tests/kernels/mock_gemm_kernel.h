// A gMock mock of nibble::GemmKernel, for testing code that picks or runs
// kernels (the scheduler, the server) without doing any arithmetic. Every
// method is mocked; script the ones the code under test calls.
//
// Example:
//   ::testing::NiceMock<nibble::testing::MockGemmKernel> kernel;
//   ON_CALL(kernel, name()).WillByDefault(::testing::Return("fused_mock"));
//   ON_CALL(kernel, variant())
//       .WillByDefault(::testing::Return(nibble::KernelVariant::kFused));
//   ON_CALL(kernel, Supports).WillByDefault(::testing::Return(true));
//   EXPECT_CALL(kernel, Run)
//       .WillOnce(::testing::Return(absl::InternalError("kernel failed")));
#ifndef NIBBLE_TESTS_KERNELS_MOCK_GEMM_KERNEL_H_
#define NIBBLE_TESTS_KERNELS_MOCK_GEMM_KERNEL_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "gmock/gmock.h"
#include "kernels/gemm_kernel.h"

namespace nibble::testing {

class MockGemmKernel : public GemmKernel {
 public:
  MOCK_METHOD(absl::string_view, name, (), (const, override));
  MOCK_METHOD(KernelVariant, variant, (), (const, override));
  MOCK_METHOD(absl::string_view, isa, (), (const, override));
  MOCK_METHOD(bool, Supports, (const GemmProblem& problem), (const, override));
  MOCK_METHOD(bool, QuantizesActivationsToInt8, (), (const, override));
  MOCK_METHOD(absl::Status, Run,
              (const GemmProblem& problem, const GemmOperands& operands,
               ThreadPool& pool),
              (const, override));
};

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_KERNELS_MOCK_GEMM_KERNEL_H_
