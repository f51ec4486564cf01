#include "server/core/device_batchers.h"

#include <memory>
#include <utility>
#include <vector>

namespace nibble::server {

DeviceBatchers::DeviceBatchers(BatcherOptions cpu, BatcherOptions gpu,
                               const std::vector<int>& gpus,
                               const MatmulBackend& backend)
    : cpu_(std::make_unique<MatmulBatcher>(cpu, backend)) {
  for (int device : gpus) {
    gpus_.emplace_back(device, std::make_unique<MatmulBatcher>(gpu, backend));
  }
}

MatmulBatcher& DeviceBatchers::For(const ResidentWeight& weight) const {
  if (weight.device != nullptr) {
    for (const auto& [device, batcher] : gpus_) {
      if (device == weight.device->device()) return *batcher;
    }
  }
  return *cpu_;
}

void DeviceBatchers::Submit(MatmulWork work) {
  MatmulBatcher& batcher = For(*work.weight);
  batcher.Submit(std::move(work));
}

void DeviceBatchers::Shutdown() {
  cpu_->Shutdown();
  for (const auto& [device, batcher] : gpus_) batcher->Shutdown();
}

BatcherStats DeviceBatchers::Stats() const {
  BatcherStats all = cpu_->Stats();
  for (const auto& [device, batcher] : gpus_) AddStats(batcher->Stats(), all);
  return all;
}

const BatcherOptions& DeviceBatchers::OptionsFor(
    const ResidentWeight& weight) const {
  return For(weight).options();
}

void DeviceBatchers::ForgetWeight(absl::string_view name) {
  cpu_->ForgetWeight(name);
  for (const auto& [device, batcher] : gpus_) batcher->ForgetWeight(name);
}

}  // namespace nibble::server
