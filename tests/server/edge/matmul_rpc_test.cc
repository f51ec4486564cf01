#include "server/edge/matmul_rpc.h"

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "gtest/gtest.h"
#include "nibble/v1/nibble.pb.h"

namespace nibble::server {
namespace {

// C sizes on both sides of each step in the varint of its length, from one
// inside the string's inline storage to a reply of 64 rows of N = 28672 f16.
constexpr size_t kCBytes[] = {1,     127,     128,     16383,
                              16384, 2097151, 2097152, 64 * 28672 * 2};

TEST(MatmulResponseBytesTest, ParseAsTheResponseWithCNotCopied) {
  const uint64_t seed = 20261126;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const size_t c_bytes : kCBytes) {
    SCOPED_TRACE(::testing::Message() << c_bytes << " bytes of C");
    v1::MatmulResponse want;
    std::string c(c_bytes, '\0');
    for (char& byte : c) byte = static_cast<char>(rng());
    want.set_c(c);
    want.set_m(1 + static_cast<int64_t>(rng() % 64));
    want.set_n(static_cast<int64_t>(c_bytes));
    want.set_dtype(v1::DTYPE_F16);
    want.set_kernel("fused_u4b8_avx512");
    want.set_compute_time_ns(static_cast<int64_t>(rng() >> 1));

    v1::MatmulResponse sent = want;
    const char* sent_c = sent.c().data();
    grpc::ByteBuffer bytes = MatmulResponseBytes(std::move(sent));
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(bytes.Dump(&slices).ok());
    ASSERT_EQ(slices.size(), 2u);
    // Past the string's inline storage, the last slice is C's own memory.
    if (c_bytes > 64) {
      EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), sent_c)
          << "C was copied";
    }

    v1::MatmulResponse got;
    ASSERT_TRUE(
        grpc::SerializationTraits<v1::MatmulResponse>::Deserialize(&bytes, &got)
            .ok());
    EXPECT_TRUE(got.c() == want.c()) << "C differs";
    EXPECT_EQ(got.m(), want.m());
    EXPECT_EQ(got.n(), want.n());
    EXPECT_EQ(got.dtype(), want.dtype());
    EXPECT_EQ(got.kernel(), want.kernel());
    EXPECT_EQ(got.compute_time_ns(), want.compute_time_ns());
  }
}

}  // namespace
}  // namespace nibble::server
