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

v1::MatmulResponse RandomResponse(size_t c_bytes, std::mt19937_64& rng) {
  v1::MatmulResponse response;
  std::string c(c_bytes, '\0');
  for (char& byte : c) byte = static_cast<char>(rng());
  response.set_c(std::move(c));
  response.set_m(1 + static_cast<int64_t>(rng() % 64));
  response.set_n(static_cast<int64_t>(c_bytes));
  response.set_dtype(v1::DTYPE_F16);
  response.set_kernel("fused_u4b8_avx512");
  response.set_compute_time_ns(static_cast<int64_t>(rng() >> 1));
  return response;
}

// `bytes`, made from a response whose C was at `sent_c`, parsed as `T`;
// fails the test when C was copied on the way.
template <typename T>
T ParseWithoutCopy(grpc::ByteBuffer bytes, const char* sent_c, size_t c_bytes) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(bytes.Dump(&slices).ok());
  EXPECT_EQ(slices.size(), 2u);
  // Past the string's inline storage, the last slice is C's own memory.
  if (c_bytes > 64 && slices.size() == 2) {
    EXPECT_EQ(reinterpret_cast<const char*>(slices[1].begin()), sent_c)
        << "C was copied";
  }
  T parsed;
  EXPECT_TRUE(grpc::SerializationTraits<T>::Deserialize(&bytes, &parsed).ok());
  return parsed;
}

void ExpectSameResponse(const v1::MatmulResponse& got,
                        const v1::MatmulResponse& want) {
  EXPECT_TRUE(got.c() == want.c()) << "C differs";
  EXPECT_EQ(got.m(), want.m());
  EXPECT_EQ(got.n(), want.n());
  EXPECT_EQ(got.dtype(), want.dtype());
  EXPECT_EQ(got.kernel(), want.kernel());
  EXPECT_EQ(got.compute_time_ns(), want.compute_time_ns());
}

TEST(MatmulResponseBytesTest, ParseAsTheResponseWithCNotCopied) {
  const uint64_t seed = 20261126;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const size_t c_bytes : kCBytes) {
    SCOPED_TRACE(::testing::Message() << c_bytes << " bytes of C");
    const v1::MatmulResponse want = RandomResponse(c_bytes, rng);
    v1::MatmulResponse sent = want;
    const char* sent_c = sent.c().data();
    ExpectSameResponse(
        ParseWithoutCopy<v1::MatmulResponse>(
            MatmulResponseBytes(std::move(sent)), sent_c, c_bytes),
        want);
  }
}

TEST(MatmulResponseBytesTest, StreamRepliesParseWithTheirIdAndCNotCopied) {
  const uint64_t seed = 20261127;
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937_64 rng(seed);
  for (const size_t c_bytes : kCBytes) {
    SCOPED_TRACE(::testing::Message() << c_bytes << " bytes of C");
    const v1::MatmulResponse want = RandomResponse(c_bytes, rng);
    // Ids of one to ten varint bytes.
    const uint64_t id = rng() >> (rng() % 64);
    v1::MatmulResponse sent = want;
    const char* sent_c = sent.c().data();
    const v1::MatmulStreamResponse got =
        ParseWithoutCopy<v1::MatmulStreamResponse>(
            MatmulStreamResponseBytes(id, std::move(sent)), sent_c, c_bytes);
    EXPECT_EQ(got.id(), id);
    ASSERT_TRUE(got.has_response());
    ExpectSameResponse(got.response(), want);
  }
}

}  // namespace
}  // namespace nibble::server
