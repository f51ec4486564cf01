#include "bench/kernels/tuning_writer.h"

#include <algorithm>
#include <cstdint>
#include <utility>

namespace nibble::bench {
namespace {

bool SameKey(const PointResult& a, const PointResult& b) {
  return a.weight == b.weight && a.shape == b.shape && a.threads == b.threads;
}

}  // namespace

TuningTable MeasuredTuningTable(const std::vector<PointResult>& results,
                                absl::string_view isa, double near_tie) {
  std::vector<TuningRule> rules;
  std::vector<bool> done(results.size(), false);
  for (size_t first = 0; first < results.size(); ++first) {
    if (done[first]) continue;
    // The winner at each M measured for this key, ascending in M.
    std::vector<std::pair<int64_t, KernelVariant>> winners;
    for (size_t i = first; i < results.size(); ++i) {
      if (!SameKey(results[first], results[i])) continue;
      done[i] = true;
      const std::vector<KernelTiming>& kernels = results[i].kernels;
      const auto fastest =
          std::min_element(kernels.begin(), kernels.end(),
                           [](const KernelTiming& a, const KernelTiming& b) {
                             return a.timing.median_us < b.timing.median_us;
                           });
      if (fastest == kernels.end()) continue;
      const double near_fastest = fastest->timing.median_us * (1 + near_tie);
      const auto chosen = std::find_if(
          kernels.begin(), kernels.end(), [&](const KernelTiming& kernel) {
            return kernel.timing.median_us <= near_fastest;
          });
      winners.emplace_back(results[i].m, chosen->variant);
    }
    std::stable_sort(
        winners.begin(), winners.end(),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    const PointResult& key = results[first];
    for (size_t i = 0; i < winners.size(); ++i) {
      const bool last = i + 1 == winners.size();
      if (!last && winners[i + 1].second == winners[i].second) continue;
      rules.push_back(TuningRule{.isa = std::string(isa),
                                 .format = key.weight.format,
                                 .group_size = key.weight.group_size,
                                 .k = key.shape.k,
                                 .n = key.shape.n,
                                 .threads = key.threads,
                                 .max_m = last ? 0 : winners[i + 1].first - 1,
                                 .variant = winners[i].second});
    }
  }
  return TuningTable(std::move(rules));
}

}  // namespace nibble::bench
