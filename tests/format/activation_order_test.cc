// Tests that GatherActivationColumns moves every element of A to its
// gathered column, bit for bit, in every dtype.
#include "format/activation_order.h"

#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "format/dtype.h"
#include "format/weight_format.h"
#include "gtest/gtest.h"

namespace nibble {
namespace {

TEST(GatherActivationColumnsTest, OutColumnRIsAColumnOrderR) {
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (const auto& [m, k] :
         {std::pair<int64_t, int64_t>{1, 8}, {3, 64}, {17, 136}}) {
      const uint64_t seed = 1000 * m + k + static_cast<int>(dtype);
      SCOPED_TRACE(
          absl::StrCat(DTypeName(dtype), " m=", m, " k=", k, " seed=", seed));
      std::mt19937_64 rng(seed);
      std::vector<float> values(m * k);
      std::normal_distribution<float> normal;
      for (float& value : values) value = normal(rng);
      const size_t element_bytes = DTypeSize(dtype);
      std::vector<char> a(m * k * element_bytes);
      ConvertFromFloat(dtype, values.data(), values.size(), a.data());
      const std::vector<int32_t> order = RandomActivationOrder(k, seed);

      std::vector<char> out(a.size(), 0x5a);
      GatherActivationColumns(dtype, m, order, a.data(), out.data());
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t r = 0; r < k; ++r) {
          ASSERT_EQ(std::memcmp(out.data() + (i * k + r) * element_bytes,
                                a.data() + (i * k + order[r]) * element_bytes,
                                element_bytes),
                    0)
              << "row " << i << " column " << r;
        }
      }
      // Gathering by the inverse permutation gives A back.
      std::vector<int32_t> inverse(k);
      for (int64_t r = 0; r < k; ++r) inverse[order[r]] = r;
      std::vector<char> back(a.size());
      GatherActivationColumns(dtype, m, inverse, out.data(), back.data());
      EXPECT_EQ(back, a);
    }
  }
}

}  // namespace
}  // namespace nibble
