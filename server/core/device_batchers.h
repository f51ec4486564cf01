// One MatmulBatcher per place a weight's matmuls run: the CPU, and each GPU
// nibbled keeps weights on. Each has its own lock, dispatchers and reply
// threads, so that a busy GPU's batches never hold the dispatchers another
// GPU's requests wait for, and requests on different GPUs share no lock. A
// request goes to the batcher of its weight: the GPU holding its device copy,
// else the CPU's.
//
// Example:
//   nibble::server::DeviceBatchers batchers(
//       {.max_batch_rows = 64}, {.max_batch_rows = 64, .dispatchers = 4},
//       /*gpus=*/{0, 1}, nibble::server::BackendOf(&runner));
//   batchers.Submit({.weight = weight, .dtype = nibble::DType::kF16, .m = 1,
//                    .a = a, .done = [](auto c) { ... }});
//   nibble::server::BatcherStats all = batchers.Stats();
#ifndef NIBBLE_SERVER_CORE_DEVICE_BATCHERS_H_
#define NIBBLE_SERVER_CORE_DEVICE_BATCHERS_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/core/batcher.h"
#include "server/core/weight_store.h"

namespace nibble::server {

class DeviceBatchers final {
 public:
  // `cpu` for the weights the CPU serves, `gpu` for each of `gpus` (device
  // ordinals, as DeviceWeight::device names them); `backend` runs them all.
  DeviceBatchers(BatcherOptions cpu, BatcherOptions gpu,
                 const std::vector<int>& gpus, const MatmulBackend& backend);

  // MatmulBatcher::Submit on the batcher of work.weight.
  void Submit(MatmulWork work);
  // Shuts every batcher down; returns once all have.
  void Shutdown();
  // Summed over the batchers (AddStats).
  BatcherStats Stats() const;
  // The options of the batcher that runs `weight`'s matmuls.
  const BatcherOptions& OptionsFor(const ResidentWeight& weight) const;
  // MatmulBatcher::ForgetWeight on every batcher.
  void ForgetWeight(absl::string_view name);

 private:
  MatmulBatcher& For(const ResidentWeight& weight) const;

  std::unique_ptr<MatmulBatcher> cpu_;
  // By device ordinal.
  std::vector<std::pair<int, std::unique_ptr<MatmulBatcher>>> gpus_;
};

}  // namespace nibble::server

#endif  // NIBBLE_SERVER_CORE_DEVICE_BATCHERS_H_
