#include "format/activation_order.h"

#include <cstring>

namespace nibble {
namespace {

// Elements are moved as raw bits of their width: a gather converts nothing.
template <typename Bits>
void GatherRows(int64_t m, absl::Span<const int32_t> order, const void* a,
                void* out) {
  const int64_t k = order.size();
  const auto* from = static_cast<const Bits*>(a);
  auto* to = static_cast<Bits*>(out);
  for (int64_t row = 0; row < m; ++row, from += k, to += k) {
    for (int64_t r = 0; r < k; ++r) to[r] = from[order[r]];
  }
}

}  // namespace

void GatherActivationColumns(DType dtype, int64_t m,
                             absl::Span<const int32_t> order, const void* a,
                             void* out) {
  if (DTypeSize(dtype) == sizeof(uint32_t)) {
    GatherRows<uint32_t>(m, order, a, out);
  } else {
    GatherRows<uint16_t>(m, order, a, out);
  }
}

}  // namespace nibble
