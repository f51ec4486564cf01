#include "client/upload_message.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "grpcpp/support/proto_buffer_reader.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

v1::UploadWeightRequest Parsed(grpc::ByteBuffer& buffer) {
  v1::UploadWeightRequest request;
  grpc::ProtoBufferReader reader(&buffer);
  EXPECT_TRUE(request.ParseFromZeroCopyStream(&reader));
  return request;
}

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string bytes(size, '\0');
  for (char& byte : bytes) byte = static_cast<char>(rng());
  return bytes;
}

TEST(UploadChunkMessageTest, ParsesAsTheChunkItDescribes) {
  constexpr uint32_t kSeed = 17;
  // Sizes around the one- and two-byte length varints and an upload's chunk.
  for (size_t size : {size_t{1}, size_t{127}, size_t{128}, size_t{16383},
                      size_t{16384}, size_t{1} << 20, (size_t{1} << 20) + 3}) {
    for (uint64_t offset : {uint64_t{0}, uint64_t{4096}, uint64_t{1} << 40}) {
      SCOPED_TRACE(testing::Message() << "size " << size << ", offset "
                                      << offset << ", seed " << kSeed);
      const std::string data = RandomBytes(size, kSeed);
      grpc::ByteBuffer buffer =
          UploadChunkMessage(v1::WEIGHT_TENSOR_SCALES, offset, data);
      const v1::UploadWeightRequest request = Parsed(buffer);
      ASSERT_TRUE(request.has_chunk());
      EXPECT_EQ(request.chunk().tensor(), v1::WEIGHT_TENSOR_SCALES);
      EXPECT_EQ(request.chunk().offset(), offset);
      EXPECT_EQ(request.chunk().data(), data);
    }
  }
}

TEST(UploadChunkMessageTest, RefersToTheDataWithoutCopyingIt) {
  const std::string data = RandomBytes(4096, 5);
  grpc::ByteBuffer buffer =
      UploadChunkMessage(v1::WEIGHT_TENSOR_QWEIGHT, 0, data);
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(buffer.Dump(&slices).ok());
  ASSERT_EQ(slices.size(), 2u);
  EXPECT_EQ(static_cast<const void*>(slices[1].begin()),
            static_cast<const void*>(data.data()));
  EXPECT_EQ(slices[1].size(), data.size());
}

TEST(UploadChunkMessageTest, CarriesAnEmptyChunk) {
  grpc::ByteBuffer buffer = UploadChunkMessage(v1::WEIGHT_TENSOR_ZEROS, 8, "");
  const v1::UploadWeightRequest request = Parsed(buffer);
  ASSERT_TRUE(request.has_chunk());
  EXPECT_EQ(request.chunk().tensor(), v1::WEIGHT_TENSOR_ZEROS);
  EXPECT_EQ(request.chunk().offset(), 8u);
  EXPECT_TRUE(request.chunk().data().empty());
}

TEST(SerializedMessageTest, ParsesAsTheMessage) {
  v1::UploadWeightRequest header;
  header.mutable_header()->set_name("layer0");
  header.mutable_header()->set_k(4096);
  grpc::ByteBuffer buffer = SerializedMessage(header);
  const v1::UploadWeightRequest parsed = Parsed(buffer);
  EXPECT_EQ(parsed.SerializeAsString(), header.SerializeAsString());
}

}  // namespace
}  // namespace nibble
