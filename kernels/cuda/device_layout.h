// The layout the CUDA kernels read. The GPU makes it from the canonical
// layout (arrange_weight.h); this plain C++ reference makes it on the host, so
// that it is tested where there is no GPU and the GPU's is tested against it.
//
// The unit is a 16 x 16 block of B (16 rows of K, 16 columns of N): one
// 32-bit word per lane of a warp holds exactly the eight codes that lane
// feeds to two m16n8k16 MMAs as its B fragments. With t = lane % 4 and
// g = lane / 4, code i of the word (bits 4i..4i+3) is B[k][n] at
//   i = 0: (2t, g)      i = 4: (2t + 1, g)        first n8 tile, b0
//   i = 1: (2t + 8, g)  i = 5: (2t + 9, g)        first n8 tile, b1
//   i = 2: (2t, g + 8)  i = 6: (2t + 1, g + 8)    second n8 tile, b0
//   i = 3: (2t + 8, g + 8) i = 7: (2t + 9, g + 8) second n8 tile, b1
// so ((word >> 4i) & 0x000f000f) puts one fragment register's two codes in
// the low bits of its two 16-bit halves.
//
// Words are ordered [N/256][K/64][16][lane][4]: a lane's 16-byte load brings
// its words for four consecutive 16-row blocks (64 rows of K), a warp's load
// is 512 contiguous bytes, and the sixteen 16-column blocks of a span of
// kTileN columns follow each other for every 64 rows of K, so that a thread
// block's share of a K step is 8 KB in one piece rather than sixteen 512-byte
// pieces, which DRAM serves at 0.93x the rate (a read of 117 MB on an H100).
// N is padded to kTileN with code 0 and scale 0.
//
// Scales are [groups][N/16][8] pairs (fp16 bits of column g, then of column
// g + 8), one 32-bit load per lane; zero points likewise as byte pairs.
// The 8-bit scales become fp16 so that the kernels read one scale type, and
// a global scale is left to multiply C with (output_scale). The kernels read
// fp4 codes as their values times 2^-14 (dequantize.cuh): one multiply per
// pair of values fewer than rebiasing them. So the scales of formats with
// fp4 codes carry 2^14 / 2^shift, and output_scale 2^shift, with shift the
// exponent of the weight's largest scale less one, which keeps the largest
// scale below 2^16 and every stored scale exact while it is a normal fp16
// value. E4M3 scales then make exact fp16 products with every fp4 value;
// E8M0 scales do while they lie within 2^24 of the weight's largest, and
// smaller ones lose bits or flush to zero.
//
// Example:
//   nibble::cuda::DeviceLayout layout = nibble::cuda::MakeDeviceLayout(w);
//   uint8_t q = nibble::cuda::CodeAt(layout, w.spec.k, /*row=*/5, /*col=*/9);
#ifndef NIBBLE_KERNELS_CUDA_DEVICE_LAYOUT_H_
#define NIBBLE_KERNELS_CUDA_DEVICE_LAYOUT_H_

#include <array>
#include <cstdint>
#include <vector>

#include "format/weight_format.h"

namespace nibble::cuda {

// N is padded to a multiple of kTileN, the widest tile a thread block covers;
// K is laid out in steps of kTileK rows.
inline constexpr int64_t kTileN = 256;
inline constexpr int64_t kTileK = 64;
// 16-column blocks in a span of kTileN columns (see above).
inline constexpr int64_t kSpanBlocks = kTileN / 16;
// Lanes per 16-column block, and words of one lane per kTileK rows.
inline constexpr int64_t kLanes = 32;
inline constexpr int64_t kWordsPerLane = kTileK / 16;

// Where lane `lane`'s word `word` (its 16-row block of the step) of 64-row
// step `step` of 16-column block `col_block` lies in the codes of a weight
// of `k_steps` steps: the order above, for the host's layout and the GPU's.
constexpr int64_t CodeWordIndex(int64_t k_steps, int64_t col_block,
                                int64_t step, int lane, int word) {
  return (((col_block / kSpanBlocks * k_steps + step) * kSpanBlocks +
           col_block % kSpanBlocks) *
              kLanes +
          lane) *
             kWordsPerLane +
         word;
}

// Position of code (row, col) of a 16 x 16 block: the lane that holds it and
// the code's index within the lane's word (see above).
struct FragmentSlot {
  int lane;
  int code;
};
FragmentSlot FragmentSlotOf(int row, int col);

struct DeviceLayout {
  int64_t padded_n = 0;          // N rounded up to kTileN
  float output_scale = 1.0f;     // what the kernels multiply C by
  std::vector<uint32_t> codes;   // [padded_n/256][K/64][16][32][4]
  std::vector<uint32_t> scales;  // [groups][padded_n/16][8] fp16 pairs
  std::vector<uint16_t> zeros;   // [groups][padded_n/16][8] byte pairs
};

// How a weight's canonical scale slots become the fp16 bits the kernels
// read (see above), shared by the host layout and the GPU's (arrange_weight.h).
struct ScaleConversion {
  float output_scale = 1.0f;
  // Whether scales go through `half_of_code` (8-bit scale codes) or are
  // fp16 scales times `half_factor` (a power of two), rounded to nearest.
  bool by_table = false;
  std::array<uint16_t, 256> half_of_code{};
  float half_factor = 1.0f;
};
// A fp16 scale through `conversion` (by_table false).
uint16_t ConvertHalfScale(const ScaleConversion& conversion, uint16_t scale);
// Requires a weight that passes Validate().
ScaleConversion MakeScaleConversion(const QuantizedWeight& canonical);

// N rounded up to kTileN.
int64_t PaddedN(int64_t n);

// The reference layout, made on the host one code at a time: what the GPU's
// (arrange_weight.h) is tested against. Requires a weight that passes
// Validate() with K a multiple of kTileK.
DeviceLayout MakeDeviceLayout(const QuantizedWeight& canonical);

// Code (row, col) read back from `layout`; the tests' inverse of the above.
uint8_t CodeAt(const DeviceLayout& layout, int64_t k, int64_t row, int64_t col);

}  // namespace nibble::cuda

#endif  // NIBBLE_KERNELS_CUDA_DEVICE_LAYOUT_H_
