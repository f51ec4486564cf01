// Which kernel variant wins for which problem shape, as measured by
// nibble-bench on one machine or nibble-gpu-bench on one GPU. The scheduler
// asks it for a variant; nibbled loads one from a file (--tuning_table) or
// uses the built-in default.
//
// The text form has one rule per line, '#' starts a comment:
//   # isa format group k n threads max_m variant
//   avx512_bf16 u4b8 128 4096 14336 2 7 fused
//   avx512_bf16 u4b8 128 4096 14336 2 0 double_buffered
//   sm90 u4b8 128 4096 14336 132 0 double_buffered
// The first column names the level the rule was measured at: a CPU kernels'
// ISA level (cpu::IsaName), or a GPU's, "sm" and its compute capability
// (cuda::GpuLevelName), whose rules hold the GPU's SM count in the threads
// column. A line of the 7 other columns alone holds at every CPU level
// (ForGpu keeps a GPU level's own rules only).
// A table answers with the rules of one level, isa(): the first a table
// lists, until ForIsas picks the nearest of the levels a scheduler's kernels
// have, or ForGpu the GPU's own. A rule covers problems with m <= max_m (0:
// any m) of its format. A lookup takes the rules of the problem's format
// measured at the nearest group size, then the nearest shape (k, n) and
// thread count (on a GPU: SM count), then the first of those rules whose
// max_m admits the problem's m, a level's own rule before one of every level
// with the same bound. A table without rules for a block format (FP4 codes
// with 8-bit scales) answers with the kFp4 rules: the same FP4 codes, only
// the scales differ.
//
// Example:
//   absl::StatusOr<nibble::TuningTable> table =
//       nibble::TuningTable::Load("/etc/nibble/tuning.txt");
//   nibble::TuningTable mine = table->ForIsas({"avx512_bf16", "avx512"});
//   std::optional<nibble::KernelVariant> variant = mine.Lookup(problem);
//   nibble::TuningTable gpu = table->ForGpu("sm90", /*sm_count=*/132);
#ifndef NIBBLE_KERNELS_TUNING_TABLE_H_
#define NIBBLE_KERNELS_TUNING_TABLE_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"
#include "kernels/gemm_kernel.h"

namespace nibble {

struct TuningRule {
  // The level measured at, e.g. "avx512_bf16" or "sm90"; empty: every level.
  std::string isa;
  WeightFormat format = WeightFormat::kU4b8;
  int64_t group_size = 0;
  int64_t k = 0;
  int64_t n = 0;
  int threads = 1;    // a GPU's rules: its SM count
  int64_t max_m = 0;  // 0: no upper bound
  KernelVariant variant = KernelVariant::kFused;

  friend bool operator==(const TuningRule&, const TuningRule&) = default;
};

class TuningTable {
 public:
  TuningTable() = default;
  explicit TuningTable(std::vector<TuningRule> rules);

  // The tables measured for each CPU ISA level and GPU level, compiled in.
  static const TuningTable& Default();

  // INVALID_ARGUMENT naming the line and what is wrong with it.
  static absl::StatusOr<TuningTable> Parse(absl::string_view text);
  // NOT_FOUND or INVALID_ARGUMENT naming the file.
  static absl::StatusOr<TuningTable> Load(const std::string& path);
  // The text form, which Parse reads back to an equal table.
  std::string Serialize() const;

  // The same rules answering at the first of `levels` (nearest first) that
  // has rules; at none of them (only rules without a level answer) when no
  // level has any. Unchanged for no levels.
  TuningTable ForIsas(std::span<const absl::string_view> levels) const;

  // The rules of GPU level `level` alone (none for an empty level), answering
  // at that level, and looked up at `sm_count` in place of a problem's
  // thread count: a GPU's rules are measured at its SM count, whatever
  // threads the host runs. ForIsas keeps the SM count.
  TuningTable ForGpu(absl::string_view level, int sm_count) const;

  // The level whose rules Lookup takes, besides those without a level; empty
  // for none.
  const std::string& isa() const { return isa_; }

  // nullopt when no rule of isa() or of every level has the problem's format
  // (or, for a block format, kFp4).
  std::optional<KernelVariant> Lookup(const GemmProblem& problem) const;

  const std::vector<TuningRule>& rules() const { return rules_; }

 private:
  // Whether Lookup takes `rule`.
  bool Answers(const TuningRule& rule) const {
    return rule.isa.empty() || rule.isa == isa_;
  }

  std::vector<TuningRule> rules_;
  std::string isa_;
  int sm_count_ = 0;  // 0: the problem's thread count
};

}  // namespace nibble

#endif  // NIBBLE_KERNELS_TUNING_TABLE_H_
