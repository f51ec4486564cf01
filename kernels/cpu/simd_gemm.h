// The fused, double-buffered and striped GEMM loops, written once over a
// vector-ISA traits type V and compiled once per ISA: kernels/cpu/avx2.cc and
// kernels/cpu/avx512.cc include this file after their `#pragma GCC target`,
// with V defined in their anonymous namespace, so every instantiation is local
// to its file and built for its instruction set. Include it nowhere else.
//
// V provides, for V::kLanes fp32 lanes (kPanelWidth / kLanes vectors cover a
// panel): F (float vector) and I (int32 vector); Zero, Load, Store,
// StoreFirst(p, v, count), Set1, Broadcast, Add, Mul, ReduceAdd,
// Fma(a, b, c) = a * b + c, Fms = a * b - c, Fnma = c - a * b;
// LoadWords (uint32), ShiftRight<bits>; Table, MakeTable(16 floats) and
// Lookup(table, words), which maps the low 4 bits of every lane through the
// table; LoadHalves (fp16), LoadBf16 (bf16: each 16-bit value shifted into
// the top half of its fp32 lane) and LoadBytes (uint8) widened to fp32. And
// the register blocking: kFusedMaxRows and FusedPanels(rows) for the fused
// tile, kBufferedRows and kBufferedPanels for the double-buffered microkernel.
//
// Dequantization is one table lookup per vector: the 16 values a code can
// take (built by the bitwise steps of format/dequant.h) sit in registers, and
// a lane-wise permute maps codes to values. Group scales multiply a whole
// group's partial sums at once (fused) or the buffered panel (double-buffered);
// LoadGroupScale reads them as the packed weight stores them (fp16, or bf16
// where PackedScalesAreBf16); a global scale is folded into the value table.
//
// Example (in kernels/cpu/avx512.cc):
//   #pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,fma,f16c")
//   struct Avx512 { ... };
//   #include "kernels/cpu/simd_gemm.h"
//   return simd::MakeSimdKernels<Avx512>("avx512");
#ifndef NIBBLE_KERNELS_CPU_SIMD_GEMM_H_
#define NIBBLE_KERNELS_CPU_SIMD_GEMM_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "base/thread_pool.h"
#include "format/dequant.h"
#include "format/weight_format.h"
#include "kernels/cpu/float_operands.h"
#include "kernels/cpu/format_kernel.h"
#include "kernels/cpu/shared_work.h"
#include "kernels/gemm_kernel.h"
#include "kernels/packed_weight.h"

namespace nibble::cpu::simd {

constexpr int64_t kWidth = PackedWeight::kPanelWidth;
// Rows of K per double-buffered chunk: two chunks of a 48-column block stay
// in L2 while a block of A rows stays in L1.
constexpr int64_t kChunkRows = 256;
// How far ahead of the words it reads the fused loop prefetches its panels:
// a core alone cannot keep enough lines in flight to reach DRAM bandwidth.
// 16 words (1 KiB a panel) rather than 8, with FusedTile's second set of
// sums, took 3-8 % off M = 1 on two threads of the 2-core Xeon VM
// (docs/performance.md, "M = 1 on the development machine").
constexpr int64_t kPrefetchWords = 16;

template <class V>
constexpr int kVecsPerPanel = kWidth / V::kLanes;

// Calls fn(std::integral_constant<int, j>) for the 8 codes of a word, so
// that shifts are immediates.
template <typename Fn>
inline void ForEachCode(Fn&& fn) {
  [&]<int... J>(std::integer_sequence<int, J...>) {
    (fn(std::integral_constant<int, J>()), ...);
  }
  (std::make_integer_sequence<int, kCodesPerWord>());
}

// What each code stands for before the group scale: the FP4 value for FP4
// codes, q - 8 where the zero point is 8, and q where each group has its own
// (which the loops apply per group); times the weight's `global_scale`, so
// that the loops never apply it.
template <class V>
typename V::Table FormatTable(WeightFormat format, float global_scale) {
  float values[16];
  for (uint8_t code = 0; code < 16; ++code) {
    values[code] = global_scale *
                   (HasFp4Codes(format)
                        ? Fp4CodeToFloat(code)
                        : Int4CodeMinusZero(code, EffectiveZero(format, 0)));
  }
  return V::MakeTable(values);
}

// a[0] + ... + a[len - 1].
template <class V>
float SegmentSum(const float* a, int64_t len) {
  typename V::F sum = V::Zero();
  int64_t i = 0;
  for (; i + V::kLanes <= len; i += V::kLanes)
    sum = V::Add(sum, V::Load(a + i));
  float total = V::ReduceAdd(sum);
  for (; i < len; ++i) total += a[i];
  return total;
}

// The inputs every loop shares. A is [m, k] fp32, row-major.
template <class V>
struct Context {
  const PackedWeight& b;
  typename V::Table table;
  const float* a;
  int64_t m;
  int64_t k;
  int64_t n;
};

// The scales of V::kLanes columns of one group, read from the packed layout:
// bf16 or fp16 (PackedScalesAreBf16).
template <class V, WeightFormat kFormat>
inline typename V::F LoadGroupScale(const uint16_t* scales) {
  if constexpr (PackedScalesAreBf16(kFormat)) {
    return V::LoadBf16(scales);
  } else {
    return V::LoadHalves(scales);
  }
}

// Stores the first `columns` values of `count` vectors at `out`.
template <class V, int kCount>
inline void StoreColumns(float* out, const typename V::F (&values)[kCount],
                         int64_t columns) {
  for (int v = 0; v < kCount; ++v) {
    const int64_t column = v * V::kLanes;
    if (column + V::kLanes <= columns) {
      V::Store(out + column, values[v]);
    } else if (column < columns) {
      V::StoreFirst(out + column, values[v],
                    static_cast<int>(columns - column));
    }
  }
}

// out[kRows][columns] = A[row .. row + kRows) [k_begin, k_end) · dequant(B)
// for kPanels panels from first_panel, dequantizing in registers. The k range
// is split where the group changes, so each group's sums are scaled once.
template <class V, WeightFormat kFormat, int kRows, int kPanels>
void FusedTile(const Context<V>& ctx, int64_t row, int64_t first_panel,
               int64_t k_begin, int64_t k_end, float* out, int64_t ldo,
               int64_t columns) {
  using F = typename V::F;
  using I = typename V::I;
  constexpr int kVecs = kPanels * kVecsPerPanel<V>;
  // One row gives only kVecs chains of dependent FMAs, too few to cover their
  // latency while the loads wait on DRAM: there the odd codes add into a
  // second set of sums, which halves each chain.
  constexpr int kSumSets = kRows == 1 ? 2 : 1;
  const int64_t group_size = ctx.b.spec().group_size;
  const float* a = ctx.a + row * ctx.k;

  F acc[kRows][kVecs];
  for (auto& acc_row : acc) {
    for (F& value : acc_row) value = V::Zero();
  }
  for (int64_t begin = k_begin; begin < k_end;) {
    const int64_t group = begin / group_size;
    const int64_t end = std::min(k_end, (group + 1) * group_size);
    F sums[kSumSets][kRows][kVecs];
    for (auto& set : sums) {
      for (auto& sum_row : set) {
        for (F& value : sum_row) value = V::Zero();
      }
    }
    for (int64_t word = begin / kCodesPerWord; word < end / kCodesPerWord;
         ++word) {
      I words[kVecs];
      for (int p = 0; p < kPanels; ++p) {
        __builtin_prefetch(ctx.b.panel_codes(first_panel + p) +
                           (word + kPrefetchWords) * kWidth);
      }
      for (int vec = 0; vec < kVecs; ++vec) {
        words[vec] = V::LoadWords(
            ctx.b.panel_codes(first_panel + vec / kVecsPerPanel<V>) +
            word * kWidth + vec % kVecsPerPanel<V> * V::kLanes);
      }
      const float* a_word = a + word * kCodesPerWord;
      ForEachCode([&](auto j) {
        F(&sum)[kRows][kVecs] = sums[j % kSumSets];
        for (int vec = 0; vec < kVecs; ++vec) {
          const F value = V::Lookup(
              ctx.table,
              V::template ShiftRight<PackedWeight::CodeShift(j)>(words[vec]));
          for (int r = 0; r < kRows; ++r) {
            sum[r][vec] = V::Fma(V::Broadcast(a_word + r * ctx.k + j), value,
                                 sum[r][vec]);
          }
        }
      });
    }
    F(&sum)[kRows][kVecs] = sums[0];
    for (int set = 1; set < kSumSets; ++set) {
      for (int r = 0; r < kRows; ++r) {
        for (int vec = 0; vec < kVecs; ++vec) {
          sum[r][vec] = V::Add(sum[r][vec], sums[set][r][vec]);
        }
      }
    }
    // Zero points: sum(a (q - z)) s = sum(a q) s - z s sum(a), so the inner
    // loop is the same as for the other formats.
    F a_sum[kRows];
    if constexpr (HasZeros(kFormat)) {
      for (int r = 0; r < kRows; ++r) {
        a_sum[r] = V::Set1(SegmentSum<V>(a + r * ctx.k + begin, end - begin));
      }
    }
    for (int vec = 0; vec < kVecs; ++vec) {
      const int64_t panel = first_panel + vec / kVecsPerPanel<V>;
      const int64_t at = group * kWidth + vec % kVecsPerPanel<V> * V::kLanes;
      const F scale =
          LoadGroupScale<V, kFormat>(ctx.b.panel_scales(panel) + at);
      for (int r = 0; r < kRows; ++r) {
        acc[r][vec] = V::Fma(sum[r][vec], scale, acc[r][vec]);
      }
      if constexpr (HasZeros(kFormat)) {
        const F zero_times_scale =
            V::Mul(V::LoadBytes(ctx.b.panel_zeros(panel) + at), scale);
        for (int r = 0; r < kRows; ++r) {
          acc[r][vec] = V::Fnma(zero_times_scale, a_sum[r], acc[r][vec]);
        }
      }
    }
    begin = end;
  }
  for (int r = 0; r < kRows; ++r) {
    StoreColumns<V>(out + r * ldo, acc[r], columns);
  }
}

// FusedTile for a run-time row count 1..kRows.
template <class V, WeightFormat kFormat, int kPanels,
          int kRows = V::kFusedMaxRows>
void FusedRows(int rows, const Context<V>& ctx, int64_t row,
               int64_t first_panel, int64_t k_begin, int64_t k_end, float* out,
               int64_t ldo, int64_t columns) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      FusedTile<V, kFormat, kRows, kPanels>(ctx, row, first_panel, k_begin,
                                            k_end, out, ldo, columns);
    } else {
      FusedRows<V, kFormat, kPanels, kRows - 1>(
          rows, ctx, row, first_panel, k_begin, k_end, out, ldo, columns);
    }
  }
}

// All rows of A over [k_begin, k_end) for panels [first_panel, end_panel),
// kPanels at a time; `out` is the first panel's column 0 of row 0.
template <class V, WeightFormat kFormat, int kPanels>
void FusedPanels(const Context<V>& ctx, int64_t first_panel, int64_t end_panel,
                 int64_t k_begin, int64_t k_end, float* out, int64_t ldo,
                 int64_t columns) {
  for (int64_t panel = first_panel; panel < end_panel;) {
    const bool whole = panel + kPanels <= end_panel;
    const int64_t offset = (panel - first_panel) * kWidth;
    const int64_t tile_columns =
        std::min(columns - offset, (whole ? kPanels : 1) * kWidth);
    for (int64_t row = 0; row < ctx.m; row += V::kFusedMaxRows) {
      const int rows =
          static_cast<int>(std::min<int64_t>(V::kFusedMaxRows, ctx.m - row));
      float* tile_out = out + row * ldo + offset;
      if (whole) {
        FusedRows<V, kFormat, kPanels>(rows, ctx, row, panel, k_begin, k_end,
                                       tile_out, ldo, tile_columns);
      } else {
        FusedRows<V, kFormat, 1>(rows, ctx, row, panel, k_begin, k_end,
                                 tile_out, ldo, tile_columns);
      }
    }
    panel += whole ? kPanels : 1;
  }
}

// The panels a fused tile covers when M has `rows` or more rows.
template <class V>
constexpr int FusedTilePanels(int64_t m) {
  return V::FusedPanels(static_cast<int>(
      std::min<int64_t>(m, static_cast<int64_t>(V::kFusedMaxRows))));
}

// Calls fn(std::integral_constant<int, panels>) with the fused tile width for
// M rows, as a compile-time constant.
template <class V, typename Fn>
void WithFusedTilePanels(int64_t m, Fn&& fn) {
  switch (FusedTilePanels<V>(m)) {
    case 4:
      fn(std::integral_constant<int, 4>());
      break;
    case 2:
      fn(std::integral_constant<int, 2>());
      break;
    default:
      fn(std::integral_constant<int, 1>());
      break;
  }
}

template <class V, WeightFormat kFormat>
void RunFused(const Context<V>& ctx, float* c, ThreadPool& pool, int threads) {
  WithFusedTilePanels<V>(ctx.m, [&](auto panels_tag) {
    constexpr int kPanels = decltype(panels_tag)::value;
    const int64_t panels = ctx.b.panels();
    const int64_t tiles = (panels + kPanels - 1) / kPanels;
    ParallelForShared(
        pool, tiles, threads, [&](int64_t first_tile, int64_t end_tile) {
          const int64_t first_panel = first_tile * kPanels;
          const int64_t end_panel = std::min(panels, end_tile * kPanels);
          FusedPanels<V, kFormat, kPanels>(ctx, first_panel, end_panel, 0,
                                           ctx.k, c + first_panel * kWidth,
                                           ctx.n, ctx.n - first_panel * kWidth);
        });
  });
}

// Splits K into stripes so that (tile, stripe) pieces keep every thread busy
// when N has too few panels; each piece writes its own partial sums, and a
// last pass adds the stripes into C.
template <class V, WeightFormat kFormat>
void RunStriped(const Context<V>& ctx, float* c, ThreadPool& pool,
                int threads) {
  WithFusedTilePanels<V>(ctx.m, [&](auto panels_tag) {
    constexpr int kPanels = decltype(panels_tag)::value;
    const int64_t panels = ctx.b.panels();
    const int64_t tiles = (panels + kPanels - 1) / kPanels;
    // Stripes start on group boundaries, or on 64-row boundaries within one
    // per-channel group, so most of them scale their sums once per group.
    const int64_t group_size = ctx.b.spec().group_size;
    const int64_t unit =
        group_size < ctx.k ? group_size : std::min<int64_t>(64, ctx.k);
    const int64_t units = (ctx.k + unit - 1) / unit;
    const int64_t wanted =
        std::max<int64_t>(1, (2 * threads + tiles - 1) / tiles);
    const int64_t units_per_stripe = (units + wanted - 1) / wanted;
    const int64_t stripes = (units + units_per_stripe - 1) / units_per_stripe;
    const int64_t stride = panels * kWidth;
    std::vector<float> partial(stripes * ctx.m * stride);
    ParallelForShared(
        pool, tiles * stripes, threads,
        [&](int64_t first_piece, int64_t end_piece) {
          for (int64_t piece = first_piece; piece < end_piece; ++piece) {
            const int64_t tile = piece / stripes;
            const int64_t stripe = piece % stripes;
            const int64_t k_begin = stripe * units_per_stripe * unit;
            const int64_t k_end =
                std::min(ctx.k, (stripe + 1) * units_per_stripe * unit);
            const int64_t first_panel = tile * kPanels;
            const int64_t end_panel = std::min(panels, first_panel + kPanels);
            FusedPanels<V, kFormat, kPanels>(
                ctx, first_panel, end_panel, k_begin, k_end,
                partial.data() + stripe * ctx.m * stride + first_panel * kWidth,
                stride, (end_panel - first_panel) * kWidth);
          }
        });
    pool.ParallelFor(
        ctx.m,
        [&](int64_t first_row, int64_t end_row) {
          for (int64_t row = first_row; row < end_row; ++row) {
            float* c_row = c + row * ctx.n;
            std::copy_n(partial.data() + row * stride, ctx.n, c_row);
            for (int64_t stripe = 1; stripe < stripes; ++stripe) {
              const float* from =
                  partial.data() + (stripe * ctx.m + row) * stride;
              for (int64_t col = 0; col < ctx.n; ++col) c_row[col] += from[col];
            }
          }
        },
        threads);
  });
}

// Double-buffered: a block of kBufferedPanels panels is dequantized chunk by
// chunk (kChunkRows rows of K) into an fp32 buffer [chunk rows][block width];
// a register-blocked microkernel multiplies every row block of A by the
// buffered chunk, and between row blocks a slice of the next chunk is
// dequantized into the other buffer, so the integer and permute work of one
// chunk interleaves with the FMAs of the other.
template <class V, WeightFormat kFormat>
void DequantizeChunk(const Context<V>& ctx, int64_t first_panel, int64_t panels,
                     int64_t chunk_first_word, int64_t first_word,
                     int64_t end_word, float* buffer) {
  using F = typename V::F;
  constexpr int64_t kBlockWidth = V::kBufferedPanels * kWidth;
  const int64_t group_size = ctx.b.spec().group_size;
  for (int64_t p = 0; p < panels; ++p) {
    const int64_t panel = first_panel + p;
    const uint32_t* codes = ctx.b.panel_codes(panel);
    const uint16_t* scales = ctx.b.panel_scales(panel);
    for (int v = 0; v < kVecsPerPanel<V>; ++v) {
      const int64_t lane = v * V::kLanes;
      for (int64_t word = first_word; word < end_word; ++word) {
        const int64_t group = word * kCodesPerWord / group_size;
        const F scale =
            LoadGroupScale<V, kFormat>(scales + group * kWidth + lane);
        // (q - zero) * scale = q * scale - zero * scale.
        F zero_times_scale = V::Zero();
        if constexpr (HasZeros(kFormat)) {
          zero_times_scale = V::Mul(
              V::LoadBytes(ctx.b.panel_zeros(panel) + group * kWidth + lane),
              scale);
        }
        const typename V::I words = V::LoadWords(codes + word * kWidth + lane);
        float* out = buffer +
                     (word - chunk_first_word) * kCodesPerWord * kBlockWidth +
                     p * kWidth + lane;
        ForEachCode([&](auto j) {
          const F value = V::Lookup(
              ctx.table,
              V::template ShiftRight<PackedWeight::CodeShift(j)>(words));
          V::Store(out + j * kBlockWidth,
                   V::Fms(value, scale, zero_times_scale));
        });
      }
    }
  }
}

// acc [kRows][block width] (+)= A rows · buffer over `rows_k` rows of K.
template <class V, int kRows>
void MultiplyChunk(const float* a, int64_t lda, const float* buffer,
                   int64_t rows_k, bool first_chunk, float* acc_out,
                   int64_t ldacc) {
  using F = typename V::F;
  constexpr int kVecs = V::kBufferedPanels * kVecsPerPanel<V>;
  constexpr int64_t kBlockWidth = V::kBufferedPanels * kWidth;
  F acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) {
      acc[r][v] = first_chunk ? V::Zero()
                              : V::Load(acc_out + r * ldacc + v * V::kLanes);
    }
  }
  for (int64_t kk = 0; kk < rows_k; ++kk) {
    F b[kVecs];
    for (int v = 0; v < kVecs; ++v) {
      b[v] = V::Load(buffer + kk * kBlockWidth + v * V::kLanes);
    }
    for (int r = 0; r < kRows; ++r) {
      const F x = V::Broadcast(a + r * lda + kk);
      for (int v = 0; v < kVecs; ++v) acc[r][v] = V::Fma(x, b[v], acc[r][v]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < kVecs; ++v) {
      V::Store(acc_out + r * ldacc + v * V::kLanes, acc[r][v]);
    }
  }
}

template <class V, int kRows = V::kBufferedRows>
void MultiplyChunkRows(int rows, const float* a, int64_t lda,
                       const float* buffer, int64_t rows_k, bool first_chunk,
                       float* acc_out, int64_t ldacc) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      MultiplyChunk<V, kRows>(a, lda, buffer, rows_k, first_chunk, acc_out,
                              ldacc);
    } else {
      MultiplyChunkRows<V, kRows - 1>(rows, a, lda, buffer, rows_k, first_chunk,
                                      acc_out, ldacc);
    }
  }
}

template <class V, WeightFormat kFormat>
void RunDoubleBuffered(const Context<V>& ctx, float* c, ThreadPool& pool,
                       int threads) {
  constexpr int64_t kBlockPanels = V::kBufferedPanels;
  constexpr int64_t kBlockWidth = kBlockPanels * kWidth;
  const int64_t panels = ctx.b.panels();
  const int64_t blocks = (panels + kBlockPanels - 1) / kBlockPanels;
  const int64_t words = ctx.k / kCodesPerWord;
  const int64_t chunk_words = kChunkRows / kCodesPerWord;
  const int64_t chunks = (words + chunk_words - 1) / chunk_words;
  const int64_t row_blocks = (ctx.m + V::kBufferedRows - 1) / V::kBufferedRows;
  pool.ParallelFor(
      blocks,
      [&](int64_t first_block, int64_t end_block) {
        // Zeroed so that the columns past the last panel hold no garbage.
        std::vector<float> buffers(2 * kChunkRows * kBlockWidth);
        std::vector<float> acc(ctx.m * kBlockWidth);
        for (int64_t block = first_block; block < end_block; ++block) {
          const int64_t first_panel = block * kBlockPanels;
          const int64_t block_panels =
              std::min(kBlockPanels, panels - first_panel);
          DequantizeChunk<V, kFormat>(ctx, first_panel, block_panels, 0, 0,
                                      std::min(words, chunk_words),
                                      buffers.data());
          for (int64_t chunk = 0; chunk < chunks; ++chunk) {
            const float* current =
                buffers.data() + chunk % 2 * kChunkRows * kBlockWidth;
            float* next =
                buffers.data() + (chunk + 1) % 2 * kChunkRows * kBlockWidth;
            const int64_t first_word = chunk * chunk_words;
            const int64_t next_first = first_word + chunk_words;
            const int64_t next_words = std::max<int64_t>(
                0, std::min(words, next_first + chunk_words) - next_first);
            const int64_t rows_k =
                (std::min(words, first_word + chunk_words) - first_word) *
                kCodesPerWord;
            for (int64_t rb = 0; rb < row_blocks; ++rb) {
              const int64_t row = rb * V::kBufferedRows;
              MultiplyChunkRows<V>(
                  static_cast<int>(
                      std::min<int64_t>(V::kBufferedRows, ctx.m - row)),
                  ctx.a + row * ctx.k + first_word * kCodesPerWord, ctx.k,
                  current, rows_k, chunk == 0, acc.data() + row * kBlockWidth,
                  kBlockWidth);
              DequantizeChunk<V, kFormat>(
                  ctx, first_panel, block_panels, next_first,
                  next_first + next_words * rb / row_blocks,
                  next_first + next_words * (rb + 1) / row_blocks, next);
            }
          }
          StoreBlockColumns(acc.data(), kBlockWidth, ctx.m, ctx.n,
                            first_panel * kWidth, c);
        }
      },
      threads);
}

template <class V, WeightFormat kFormat>
void RunVariant(KernelVariant variant, const Context<V>& ctx, float* c,
                ThreadPool& pool, int threads) {
  // The small-M variants stream the weight once: on a small weight a second
  // thread costs more to wake than it saves.
  const int streaming_threads =
      ThreadsForWork(ctx.b.resident_bytes() * ctx.m, threads);
  switch (variant) {
    case KernelVariant::kDoubleBuffered:
      RunDoubleBuffered<V, kFormat>(ctx, c, pool, threads);
      break;
    case KernelVariant::kStriped:
      RunStriped<V, kFormat>(ctx, c, pool, streaming_threads);
      break;
    default:
      RunFused<V, kFormat>(ctx, c, pool, streaming_threads);
      break;
  }
}

// One variant for one format, named "<variant>_<format>_<isa>".
template <class V>
class SimdKernel final : public FormatKernel {
 public:
  SimdKernel(KernelVariant variant, WeightFormat format, absl::string_view isa)
      : FormatKernel(variant, format, isa) {}

  absl::Status Run(const GemmProblem& problem, const GemmOperands& operands,
                   ThreadPool& pool) const override {
    WithFloatOperands(problem, operands, [&](const float* a, float* c) {
      const Context<V> ctx{
          *operands.b,
          FormatTable<V>(format(), operands.b->spec().global_scale),
          a,
          problem.m,
          problem.k,
          problem.n};
      WithFormatConstant(format(), [&](auto format_tag) {
        RunVariant<V, decltype(format_tag)::value>(variant(), ctx, c, pool,
                                                   problem.threads);
      });
    });
    return absl::OkStatus();
  }
};

// Every variant for every format, named with `isa`.
template <class V>
std::vector<std::unique_ptr<GemmKernel>> MakeSimdKernels(
    absl::string_view isa) {
  std::vector<std::unique_ptr<GemmKernel>> kernels;
  for (KernelVariant variant :
       {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
        KernelVariant::kStriped}) {
    for (WeightFormat format : kAllWeightFormats) {
      kernels.push_back(std::make_unique<SimdKernel<V>>(variant, format, isa));
    }
  }
  return kernels;
}

}  // namespace nibble::cpu::simd

#endif  // NIBBLE_KERNELS_CPU_SIMD_GEMM_H_
