// The double-buffered kernels for AMX (Intel Sapphire Rapids and later): the
// tile unit multiplies 16 x 32 bf16 by 32 x 16 bf16 into 16 x 16 fp32 in one
// instruction, about 16 times the FMA rate of AVX-512, so for M >= 16 the
// dequantization, not the multiply, sets the pace.
//
// The loop, the dequantization into bf16 pairs and the precision contract are
// kernels/cpu/bf16_pairs.h's. Here A is rounded to bf16 in tile order, and a
// segment's pairs of one panel are B tiles as they lie: 16 rows of
// (k, k + 1) pairs x 16 columns. Each group's sums leave the tile unit through
// a 1 KiB store and are scaled in fp32.
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "format/dequant.h"
#include "format/weight_format.h"
#include "kernels/cpu/float_operands.h"
#include "kernels/cpu/format_kernel.h"
#include "kernels/cpu/simd_kernels.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"

namespace nibble::cpu {

bool RequestAmxPermission() {
  // Linux hands out the tile data state only on request (arch_prctl
  // ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA), once per process.
  constexpr int kArchReqXcompPerm = 0x1023;
  constexpr int kXfeatureXtiledata = 18;
  static const bool granted =
      syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

}  // namespace nibble::cpu

#pragma GCC push_options
#pragma GCC target( \
    "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,f16c")
// clang ignores #pragma GCC target; this is its equivalent.
#ifdef __clang__
#pragma clang attribute push(                                                          \
    __attribute__((target(                                                             \
        "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16,fma,f16c"))), \
    apply_to = function)
#endif
// GCC 12's AVX-512 intrinsics pass an intentionally undefined vector as the
// masked-off source and warn about it when inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include "kernels/cpu/bf16_pairs.h"

namespace nibble::cpu {
namespace {

using bf16::Bf16Context;
using bf16::kPairRowValues;
using bf16::kWidth;

constexpr int64_t kTileRows = 16;
constexpr int64_t kTileK = 32;  // bf16 values per tile row
constexpr int64_t kTileRowBytes = 64;

// Tile registers (literal numbers: the intrinsics paste them into the
// assembly): C(row tile, panel) = 2 * row tile + panel in 0..3, A(row tile)
// = 4 + row tile, B(panel) = 6 + panel.

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// Holds the tile configuration for the calling thread while alive.
class TileScope {
 public:
  TileScope() {
    TileConfig config;
    for (int t = 0; t < 8; ++t) {
      config.bytes_per_row[t] = kTileRowBytes;
      config.rows[t] = kTileRows;
    }
    _tile_loadconfig(&config);
  }
  ~TileScope() { _tile_release(); }
  TileScope(const TileScope&) = delete;
  TileScope& operator=(const TileScope&) = delete;
};

// Two panels (32 columns) per block and two row tiles per step: 4 accumulator
// tiles, 2 A tiles and 2 B tiles use all 8 tile registers.
struct Tiles {
  static constexpr char kIsa[] = "amx";
  static constexpr int64_t kBlockPanels = 2;
  static constexpr int64_t kBlockWidth = kBlockPanels * kWidth;
  static constexpr int64_t kRowStep = 2 * kTileRows;
  using ThreadScope = TileScope;

  // Tiles take K in steps of 32.
  static bool SupportsK(int64_t k) { return k % kTileK == 0; }

  // A rounded to bf16 in tile order: [row tile][k tile][16 rows][32 k], rows
  // past M zero, so each A tile is 1 KiB of contiguous memory.
  static std::vector<uint16_t> RoundActivations(const float* a, int64_t m,
                                                int64_t k) {
    const int64_t row_tiles = (m + kTileRows - 1) / kTileRows;
    const int64_t k_tiles = k / kTileK;
    std::vector<uint16_t> tiles(row_tiles * kTileRows * k);
    for (int64_t row = 0; row < m; ++row) {
      const int64_t row_tile = row / kTileRows;
      for (int64_t k_tile = 0; k_tile < k_tiles; ++k_tile) {
        const float* from = a + row * k + k_tile * kTileK;
        const __m512bh pair = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(from + 16),
                                                  _mm512_loadu_ps(from));
        uint16_t* to =
            tiles.data() +
            ((row_tile * k_tiles + k_tile) * kTileRows + row % kTileRows) *
                kTileK;
        _mm512_storeu_si512(to, reinterpret_cast<const __m512i&>(pair));
      }
    }
    return tiles;
  }

  template <int kRowTiles>
  static void MultiplyTiles(const Bf16Context& ctx, int64_t row_tile,
                            const Segment& segment, const uint16_t* pairs,
                            const float* scales, float* acc) {
    const int64_t k_tiles = ctx.k / kTileK;
    const int64_t segment_pairs = segment.len / 2;
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kRowTiles == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
    for (int64_t t = 0; t < segment.len / kTileK; ++t) {
      const int64_t k_tile = segment.k / kTileK + t;
      const uint16_t* b0 = pairs + t * kTileRows * kPairRowValues;
      _tile_loadd(6, b0, kTileRowBytes);
      _tile_loadd(7, b0 + segment_pairs * kPairRowValues, kTileRowBytes);
      _tile_loadd(4, ctx.a + (row_tile * k_tiles + k_tile) * kTileRows * kTileK,
                  kTileRowBytes);
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      if constexpr (kRowTiles == 2) {
        _tile_loadd(
            5, ctx.a + ((row_tile + 1) * k_tiles + k_tile) * kTileRows * kTileK,
            kTileRowBytes);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
    }
    alignas(64) float sums[kRowTiles * 2][kTileRows * kWidth];
    _tile_stored(0, sums[0], kTileRowBytes);
    _tile_stored(1, sums[1], kTileRowBytes);
    if constexpr (kRowTiles == 2) {
      _tile_stored(2, sums[2], kTileRowBytes);
      _tile_stored(3, sums[3], kTileRowBytes);
    }
    for (int tile = 0; tile < kRowTiles * 2; ++tile) {
      const int panel = tile % 2;
      const __m512 scale = _mm512_loadu_ps(scales + panel * kWidth);
      float* acc_tile =
          acc + tile / 2 * kTileRows * kBlockWidth + panel * kWidth;
      for (int64_t r = 0; r < kTileRows; ++r) {
        float* out = acc_tile + r * kBlockWidth;
        _mm512_storeu_ps(
            out, _mm512_fmadd_ps(_mm512_load_ps(sums[tile] + r * kWidth), scale,
                                 _mm512_loadu_ps(out)));
      }
    }
  }

  // Rows past M multiply as A's zero rows.
  static void Multiply(const Bf16Context& ctx, int64_t row, int64_t rows,
                       const Segment& segment, const uint16_t* pairs,
                       const float* scales, float* acc) {
    if (rows > kTileRows) {
      MultiplyTiles<2>(ctx, row / kTileRows, segment, pairs, scales, acc);
    } else {
      MultiplyTiles<1>(ctx, row / kTileRows, segment, pairs, scales, acc);
    }
  }
};

}  // namespace

std::vector<std::unique_ptr<GemmKernel>> MakeAmxKernels() {
  return bf16::MakeBf16PairKernels<Tiles>(kMinConvertedRows);
}

}  // namespace nibble::cpu

#ifdef __clang__
#pragma clang attribute pop
#endif
#pragma GCC pop_options
