// Gathers the columns of activations A by a weight's activation order, the
// permutation of K that GPTQ act-order checkpoints need (see
// QuantizedWeight::activation_order): a weight whose rows were regrouped at
// import multiplies A' with A'[:, r] = A[:, order[r]], so C = A' · dequant(B)
// equals the checkpoint's A · B. Costs one pass over A's M·K elements.
//
// Example:
//   std::string gathered(a.size(), '\0');
//   nibble::GatherActivationColumns(nibble::DType::kF16, m,
//                                   packed.activation_order(), a.data(),
//                                   gathered.data());
#ifndef NIBBLE_FORMAT_ACTIVATION_ORDER_H_
#define NIBBLE_FORMAT_ACTIVATION_ORDER_H_

#include <cstdint>

#include "absl/types/span.h"
#include "format/dtype.h"

namespace nibble {

// out[i, r] = a[i, order[r]] for i < m, r < K = order.size(); both are
// [m, K] row-major arrays of `dtype` that do not overlap. `order` must pass
// ValidateActivationOrder for K.
void GatherActivationColumns(DType dtype, int64_t m,
                             absl::Span<const int32_t> order, const void* a,
                             void* out);

}  // namespace nibble

#endif  // NIBBLE_FORMAT_ACTIVATION_ORDER_H_
