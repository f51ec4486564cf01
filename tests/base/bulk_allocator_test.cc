// Tests that BulkAllocator and ReserveBulk hold what is written, on both
// sides of the huge-page size.
#include "base/bulk_allocator.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace nibble {
namespace {

// Random words from `seed`.
std::vector<uint32_t> RandomWords(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> words(count);
  for (uint32_t& word : words) word = rng();
  return words;
}

class BulkAllocatorTest : public ::testing::TestWithParam<size_t> {};

INSTANTIATE_TEST_SUITE_P(Sizes, BulkAllocatorTest,
                         ::testing::Values(0, 1, 1000, kHugePageBytes / 4 - 1,
                                           kHugePageBytes / 4,
                                           3 * kHugePageBytes / 4 + 5));

TEST_P(BulkAllocatorTest, HoldsWhatIsWrittenThroughResizesAndCopies) {
  const size_t count = GetParam();
  SCOPED_TRACE(::testing::Message() << "seed 7, " << count << " words");
  const std::vector<uint32_t> expected = RandomWords(count, 7);
  std::vector<uint32_t, BulkAllocator<uint32_t>> words;
  words.resize(count);
  std::copy(expected.begin(), expected.end(), words.begin());
  // Growing moves the contents into a new allocation.
  words.resize(count + 3, 9);
  const std::vector<uint32_t, BulkAllocator<uint32_t>> copy = words;
  ASSERT_EQ(copy.size(), count + 3);
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(copy[i], expected[i]) << i;
  for (size_t i = count; i < count + 3; ++i) ASSERT_EQ(copy[i], 9u) << i;
}

TEST_P(BulkAllocatorTest, ReserveBulkGivesRoomAndKeepsTheContents) {
  const size_t count = GetParam();
  SCOPED_TRACE(::testing::Message() << "seed 8, " << count << " words");
  std::vector<uint32_t> words = RandomWords(3, 8);
  const std::vector<uint32_t> before = words;
  ReserveBulk(words, count + 3);
  EXPECT_GE(words.capacity(), count + 3);
  EXPECT_EQ(words, before);
  const uint32_t* data = words.data();
  words.resize(count + 3);
  // The room was made up front: no reallocation while filling.
  EXPECT_EQ(words.data(), data);
}

}  // namespace
}  // namespace nibble
