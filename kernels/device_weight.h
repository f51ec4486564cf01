// A weight held in an accelerator's memory, in the layout that backend's
// kernels read. It is made once when the weight is uploaded and lives as long
// as the weight; kernels of that backend find it in GemmOperands::device.
//
// Example:
//   absl::StatusOr<std::unique_ptr<nibble::cuda::CudaWeight>> device =
//       nibble::cuda::CudaWeight::Upload(canonical);
//   nibble::GemmOperands operands{&packed, a, c, device->get()};
#ifndef NIBBLE_KERNELS_DEVICE_WEIGHT_H_
#define NIBBLE_KERNELS_DEVICE_WEIGHT_H_

#include <cstdint>

#include "format/weight_format.h"

namespace nibble {

class DeviceWeight {
 public:
  virtual ~DeviceWeight() = default;

  virtual const WeightSpec& spec() const = 0;
  // Bytes of accelerator memory the weight holds.
  virtual int64_t device_bytes() const = 0;
  // Which of the backend's devices holds it: for CUDA, the GPU's device
  // ordinal as this process sees them (CUDA_VISIBLE_DEVICES applied).
  virtual int device() const = 0;
};

}  // namespace nibble

#endif  // NIBBLE_KERNELS_DEVICE_WEIGHT_H_
