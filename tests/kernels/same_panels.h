// A gtest predicate for two PackedWeights holding the same panels byte for
// byte, for tests of the ways a weight gets packed (Pack, PackColumns, an
// import that packs checkpoint columns straight away).
//
// Example:
//   EXPECT_TRUE(nibble::testing::SamePanels(*got, *want));
#ifndef NIBBLE_TESTS_KERNELS_SAME_PANELS_H_
#define NIBBLE_TESTS_KERNELS_SAME_PANELS_H_

#include <algorithm>
#include <cstdint>

#include "format/weight_format.h"
#include "gtest/gtest.h"
#include "kernels/packed_weight.h"

namespace nibble::testing {

inline ::testing::AssertionResult SamePanels(const PackedWeight& got,
                                             const PackedWeight& want) {
  if (!(got.spec() == want.spec())) {
    return ::testing::AssertionFailure()
           << "spec " << got.spec().DebugString() << ", want "
           << want.spec().DebugString();
  }
  if (got.resident_bytes() != want.resident_bytes()) {
    return ::testing::AssertionFailure()
           << got.resident_bytes() << " resident bytes, want "
           << want.resident_bytes();
  }
  const int64_t words =
      got.spec().k / kCodesPerWord * PackedWeight::kPanelWidth;
  const int64_t scales = got.spec().groups() * PackedWeight::kPanelWidth;
  for (int64_t panel = 0; panel < got.panels(); ++panel) {
    if (!std::equal(got.panel_codes(panel), got.panel_codes(panel) + words,
                    want.panel_codes(panel))) {
      return ::testing::AssertionFailure() << "codes of panel " << panel;
    }
    if (!std::equal(got.panel_scales(panel), got.panel_scales(panel) + scales,
                    want.panel_scales(panel))) {
      return ::testing::AssertionFailure() << "scales of panel " << panel;
    }
    const uint8_t* got_zeros = got.panel_zeros(panel);
    if (got_zeros != nullptr &&
        !std::equal(got_zeros, got_zeros + scales, want.panel_zeros(panel))) {
      return ::testing::AssertionFailure() << "zeros of panel " << panel;
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace nibble::testing

#endif  // NIBBLE_TESTS_KERNELS_SAME_PANELS_H_
