// Which kernel variant wins for which problem shape, as measured by
// nibble-bench on one machine. The scheduler asks it for a variant; nibbled
// loads one from a file (--tuning_table) or uses the built-in default.
//
// The text form has one rule per line, '#' starts a comment:
//   # format group k n threads max_m variant
//   u4b8 128 4096 14336 2 4 fused
//   u4b8 128 4096 14336 2 0 double_buffered
// A rule covers problems with m <= max_m (0: any m) of its format. A lookup
// takes the rules of the problem's format measured at the nearest group size,
// then the nearest shape (k, n) and thread count, then the first of those
// rules whose max_m admits the problem's m. A table without rules for a
// block format (FP4 codes with 8-bit scales) answers with the kFp4 rules:
// the same FP4 codes, only the scales differ.
//
// Example:
//   absl::StatusOr<nibble::TuningTable> table =
//       nibble::TuningTable::Load("/etc/nibble/tuning.txt");
//   std::optional<nibble::KernelVariant> variant = table->Lookup(problem);
#ifndef NIBBLE_KERNELS_TUNING_TABLE_H_
#define NIBBLE_KERNELS_TUNING_TABLE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "format/weight_format.h"
#include "kernels/gemm_kernel.h"

namespace nibble {

struct TuningRule {
  WeightFormat format = WeightFormat::kU4b8;
  int64_t group_size = 0;
  int64_t k = 0;
  int64_t n = 0;
  int threads = 1;
  int64_t max_m = 0;  // 0: no upper bound
  KernelVariant variant = KernelVariant::kFused;

  friend bool operator==(const TuningRule&, const TuningRule&) = default;
};

class TuningTable {
 public:
  TuningTable() = default;
  explicit TuningTable(std::vector<TuningRule> rules);

  // The table measured on the development machine, compiled in.
  static const TuningTable& Default();

  // INVALID_ARGUMENT naming the line and what is wrong with it.
  static absl::StatusOr<TuningTable> Parse(absl::string_view text);
  // NOT_FOUND or INVALID_ARGUMENT naming the file.
  static absl::StatusOr<TuningTable> Load(const std::string& path);
  // The text form, which Parse reads back to an equal table.
  std::string Serialize() const;

  // nullopt when no rule has the problem's format (or, for a block format,
  // kFp4).
  std::optional<KernelVariant> Lookup(const GemmProblem& problem) const;

  const std::vector<TuningRule>& rules() const { return rules_; }

 private:
  std::vector<TuningRule> rules_;
};

}  // namespace nibble

#endif  // NIBBLE_KERNELS_TUNING_TABLE_H_
