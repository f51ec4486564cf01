// Starts real nibbled processes with --activation_precision and sends
// Matmul requests with and without their own activation_precision: the
// reply's kernel and activation_precision say what ran, an unknown value is
// INVALID_ARGUMENT and a bad flag a usage error.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/proto_conversions.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/gemm_kernel.h"
#include "nibble/v1/nibble.grpc.pb.h"
#include "tests/integration/nibbled_process.h"
#include "tests/integration/upload_messages.h"

namespace nibble {
namespace {

using ::nibble::client::ToProto;
using ::testing::EndsWith;
using ::testing::HasSubstr;
using ::testing::Not;

// Enough rows that the scheduler picks double_buffered, where int8 runs.
constexpr int64_t kRows = 256;
const WeightSpec kSpec{WeightFormat::kU4b8, 256, 64, 64};

class ActivationPrecisionTest : public ::testing::Test {
 protected:
  // Starts nibbled with `flags` and uploads weight "w".
  void Start(const std::vector<std::string>& flags) {
    if (cuda::DeviceCount() > 0) GTEST_SKIP() << "this machine has a GPU";
    std::vector<std::string> all = {"--threads=2", "--backend=cpu"};
    all.insert(all.end(), flags.begin(), flags.end());
    absl::StatusOr<std::unique_ptr<testing::NibbledProcess>> server =
        testing::NibbledProcess::Start(NIBBLED_PATH, all);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    stub_ = v1::NibbleService::NewStub(grpc::CreateChannel(
        server_->target(), grpc::InsecureChannelCredentials()));
    ASSERT_TRUE(
        testing::UploadWeight(*stub_, "w", RandomQuantizedWeight(kSpec, 7))
            .ok());
  }

  void TearDown() override {
    // An open channel would hold nibbled for its shutdown grace period.
    stub_.reset();
    if (server_ != nullptr) {
      EXPECT_EQ(server_->Stop(), 0);
    }
  }

  grpc::Status Matmul(v1::ActivationPrecision precision,
                      v1::MatmulResponse* response) {
    v1::MatmulRequest request;
    request.set_weight_name("w");
    request.set_m(kRows);
    request.set_dtype(ToProto(DType::kF32));
    request.set_a(std::string(kRows * kSpec.k * sizeof(float), '\0'));
    request.set_activation_precision(precision);
    grpc::ClientContext context;
    return stub_->Matmul(&context, request, response);
  }

  // The reply to a request of `precision`.
  v1::MatmulResponse ReplyTo(v1::ActivationPrecision precision) {
    v1::MatmulResponse response;
    const grpc::Status status = Matmul(precision, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response;
  }
  // The kernel a request of `precision` ran on.
  std::string KernelOf(v1::ActivationPrecision precision) {
    return ReplyTo(precision).kernel();
  }

  std::unique_ptr<testing::NibbledProcess> server_;
  std::unique_ptr<v1::NibbleService::Stub> stub_;
};

bool HasVnni() { return cpu::DetectIsa() >= cpu::Isa::kAvx512Vnni; }

TEST_F(ActivationPrecisionTest, TheRequestsFieldOverridesTheServersDefault) {
  Start({});
  EXPECT_THAT(KernelOf(v1::ACTIVATION_PRECISION_UNSPECIFIED),
              Not(EndsWith("_int8")));
  EXPECT_THAT(KernelOf(v1::ACTIVATION_PRECISION_EXACT), Not(HasSubstr("bf16")));
  EXPECT_THAT(KernelOf(v1::ACTIVATION_PRECISION_EXACT), Not(HasSubstr("amx")));
  if (HasVnni()) {
    EXPECT_THAT(KernelOf(v1::ACTIVATION_PRECISION_INT8), EndsWith("_int8"));
  } else {
    // No VNNI: int8 requests run as bf16 ones, as the kernel name says.
    EXPECT_THAT(KernelOf(v1::ACTIVATION_PRECISION_INT8),
                Not(EndsWith("_int8")));
  }
}

// The reply says what its kernel made of the f32 A: rounded to bf16 where the
// CPU has bf16 kernels and the request accepts it, quantized where it accepts
// int8 and the CPU has VNNI, else as sent.
TEST_F(ActivationPrecisionTest, TheReplySaysWhatTheKernelMadeOfA) {
  Start({});
  const v1::ActivationPrecision bf16_or_exact =
      cpu::DetectIsa() >= cpu::Isa::kAvx512Bf16
          ? v1::ACTIVATION_PRECISION_BF16
          : v1::ACTIVATION_PRECISION_EXACT;
  EXPECT_EQ(ReplyTo(v1::ACTIVATION_PRECISION_EXACT).activation_precision(),
            v1::ACTIVATION_PRECISION_EXACT);
  EXPECT_EQ(
      ReplyTo(v1::ACTIVATION_PRECISION_UNSPECIFIED).activation_precision(),
      bf16_or_exact);
  const v1::MatmulResponse int8 = ReplyTo(v1::ACTIVATION_PRECISION_INT8);
  EXPECT_EQ(int8.activation_precision(),
            HasVnni() ? v1::ACTIVATION_PRECISION_INT8 : bf16_or_exact)
      << int8.kernel();
}

TEST_F(ActivationPrecisionTest, TheServersFlagSetsTheDefault) {
  Start({"--activation_precision=int8"});
  EXPECT_EQ(
      absl::EndsWith(KernelOf(v1::ACTIVATION_PRECISION_UNSPECIFIED), "_int8"),
      HasVnni());
  EXPECT_THAT(KernelOf(v1::ACTIVATION_PRECISION_BF16), Not(EndsWith("_int8")));
}

TEST_F(ActivationPrecisionTest, AnUnknownValueIsInvalidArgument) {
  Start({});
  v1::MatmulResponse response;
  const grpc::Status status =
      Matmul(static_cast<v1::ActivationPrecision>(77), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(status.error_message(),
              HasSubstr("activation_precision 77 is not supported: use "
                        "ACTIVATION_PRECISION_EXACT"));
}

TEST(ActivationPrecisionFlagTest, AnUnknownValueIsAUsageError) {
  std::string output;
  EXPECT_EQ(testing::RunCommand(absl::StrCat("timeout 10 ", NIBBLED_PATH,
                                             " --listen=127.0.0.1:0"
                                             " --activation_precision=fp8"),
                                &output),
            2)
      << output;
  EXPECT_THAT(output,
              HasSubstr("--activation_precision: unknown activation precision "
                        "\"fp8\": use exact, bf16 or int8"));
}

}  // namespace
}  // namespace nibble
