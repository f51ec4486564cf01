// The pieces of K that the double-buffered CPU kernels take at once: whole
// groups of at most kMaxSegment rows, or pieces of a larger group, so that a
// segment never crosses a group and its codes stay in the L1 cache while
// every row of A passes over them.
//
// Example:
//   for (const nibble::cpu::Segment& s : nibble::cpu::Segments(k, 128)) {
//     // rows [s.k, s.k + s.len) of B, all in group s.k / 128
//   }
#ifndef NIBBLE_KERNELS_CPU_SEGMENTS_H_
#define NIBBLE_KERNELS_CPU_SEGMENTS_H_

#include <algorithm>
#include <cstdint>
#include <vector>

namespace nibble::cpu {

// Rows of K in a segment, at most.
inline constexpr int64_t kMaxSegment = 512;

struct Segment {
  int64_t k;
  int64_t len;
};

// The segments of K for groups of `group_size` rows, in order.
inline std::vector<Segment> Segments(int64_t k, int64_t group_size) {
  std::vector<Segment> segments;
  for (int64_t group_k = 0; group_k < k; group_k += group_size) {
    const int64_t group_end = std::min(k, group_k + group_size);
    for (int64_t s = group_k; s < group_end; s += kMaxSegment) {
      segments.push_back({s, std::min(kMaxSegment, group_end - s)});
    }
  }
  return segments;
}

}  // namespace nibble::cpu

#endif  // NIBBLE_KERNELS_CPU_SEGMENTS_H_
