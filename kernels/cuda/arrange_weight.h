// Lays a weight out in GPU memory in the layout the CUDA kernels read
// (device_layout.h). The host copies the canonical arrays as they are, a
// staging buffer at a time, and the GPU moves every code and scale to its
// place: on the host, the same work one code at a time (MakeDeviceLayout)
// took 3 to 12 s per GB, ten times the time to read the weight from disk.
//
// Example:
//   const nibble::cuda::ScaleConversion conversion =
//       nibble::cuda::MakeScaleConversion(canonical);
//   nibble::cuda::ArrangedArrays to{codes, scales, zeros};  // device memory
//   absl::Status s = nibble::cuda::ArrangeOnDevice(canonical, conversion, to);
#ifndef NIBBLE_KERNELS_CUDA_ARRANGE_WEIGHT_H_
#define NIBBLE_KERNELS_CUDA_ARRANGE_WEIGHT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "format/fp4_columns.h"
#include "format/weight_format.h"
#include "kernels/cuda/device_layout.h"

namespace nibble::cuda {

// Device arrays sized as DeviceLayout's for the weight: codes and scales
// always, zeros only for formats with zero points (nullptr otherwise).
struct ArrangedArrays {
  uint32_t* codes = nullptr;
  uint32_t* scales = nullptr;
  uint16_t* zeros = nullptr;
};

// Canonical bytes staged on the GPU at a time: enough to keep the copies
// long, little next to the weights themselves.
inline constexpr int64_t kStagingBytes = int64_t{64} << 20;

// Fills `to` with what MakeDeviceLayout(canonical) holds, padding included,
// and returns once the GPU is done. Requires a weight that passes Validate()
// with K a multiple of kTileK, and `conversion` made from it. The staging
// buffer holds at least one 64-row step of codes or one group of scales
// whatever `staging_bytes` says. Errors as CudaStatus, naming the step.
absl::Status ArrangeOnDevice(const QuantizedWeight& canonical,
                             const ScaleConversion& conversion,
                             const ArrangedArrays& to,
                             int64_t staging_bytes = kStagingBytes);

// ArrangeOnDevice for a weight (HasColumnLayout) whose codes come in the
// column layout its checkpoints store: they are copied as they are, a run of
// whole columns at a time, and never transposed on the host. `scales` holds
// the weight's spec and canonical scale slots (ScaleSlotsFromColumns), its
// qweight unused, and passes ValidateAllButCodes; `conversion` is made from
// it. Fills `to` with what MakeDeviceLayout(CanonicalFromColumns(columns))
// holds.
absl::Status ArrangeOnDevice(const Fp4Columns& columns,
                             const QuantizedWeight& scales,
                             const ScaleConversion& conversion,
                             const ArrangedArrays& to,
                             int64_t staging_bytes = kStagingBytes);

}  // namespace nibble::cuda

#endif  // NIBBLE_KERNELS_CUDA_ARRANGE_WEIGHT_H_
