#include "kernels/tuning_table.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "base/file_contents.h"
#include "kernels/cpu/cpu_kernels.h"

namespace nibble {
namespace {

// The columns after the ISA level, which a rule for every level has alone.
constexpr char kRuleColumns[] = "format group k n threads max_m variant";

constexpr char kDefaultTableText[] =
#include "kernels/default_tuning_table.inc"
// The GPU's rules after the CPU's, whose first level is the table's isa().
#include "kernels/default_gpu_tuning_table.inc"
    ;

absl::StatusOr<KernelVariant> ParseKernelVariant(absl::string_view name) {
  for (KernelVariant variant :
       {KernelVariant::kFused, KernelVariant::kDoubleBuffered,
        KernelVariant::kStriped, KernelVariant::kReference}) {
    if (name == KernelVariantName(variant)) return variant;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown variant \"", name,
                   "\": use fused, double_buffered, striped or reference"));
}

// A column holding an integer in [min, max]; min is 0 or 1.
absl::StatusOr<int64_t> ParseCount(absl::string_view column,
                                   absl::string_view text, int64_t min,
                                   int64_t max) {
  int64_t value = 0;
  if (!absl::SimpleAtoi(text, &value) || value < min) {
    return absl::InvalidArgumentError(absl::StrCat(
        column, " must be ",
        min == 0 ? "0 (no bound) or a positive integer" : "a positive integer",
        ", got \"", text, "\""));
  }
  if (value > max) {
    return absl::InvalidArgumentError(
        absl::StrCat(column, " must be at most ", max, ", got \"", text, "\""));
  }
  return value;
}

// A GPU's level: "sm" and its compute capability in digits, as
// cuda::GpuLevelName writes it.
bool IsGpuLevel(absl::string_view text) {
  return absl::ConsumePrefix(&text, "sm") && !text.empty() &&
         std::all_of(text.begin(), text.end(), absl::ascii_isdigit);
}

// A level's name: one of cpu::kAllIsas by name, or a GPU's level. A misspelt
// level would make its rules answer nowhere.
absl::StatusOr<std::string> ParseIsa(absl::string_view text) {
  if (IsGpuLevel(text)) return std::string(text);
  std::vector<absl::string_view> names;
  for (const cpu::Isa level : cpu::kAllIsas) {
    if (cpu::IsaName(level) == text) return std::string(text);
    names.push_back(cpu::IsaName(level));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("the first of 8 columns must be an ISA level (",
                   absl::StrJoin(names, ", "),
                   ") or a GPU level (sm and the compute capability, e.g. "
                   "sm90), got \"",
                   text, "\""));
}

absl::StatusOr<TuningRule> ParseRule(absl::string_view line) {
  std::vector<absl::string_view> columns =
      absl::StrSplit(line, absl::ByAnyChar(" \t\r"), absl::SkipEmpty());
  if (columns.size() != 8 && columns.size() != 7) {
    return absl::InvalidArgumentError(
        absl::StrCat("expected 7 columns (", kRuleColumns,
                     "), or 8 with the ISA level first, got ", columns.size()));
  }
  TuningRule rule;
  if (columns.size() == 8) {
    absl::StatusOr<std::string> isa = ParseIsa(columns[0]);
    if (!isa.ok()) return isa.status();
    rule.isa = *std::move(isa);
    columns.erase(columns.begin());
  }
  absl::StatusOr<WeightFormat> format = ParseWeightFormat(columns[0]);
  if (!format.ok()) return format.status();
  rule.format = *format;
  constexpr int64_t kNoMax = std::numeric_limits<int64_t>::max();
  const std::pair<absl::string_view, int64_t*> dimensions[] = {
      {"group", &rule.group_size}, {"k", &rule.k}, {"n", &rule.n}};
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<int64_t> value =
        ParseCount(dimensions[i].first, columns[1 + i], 1, kMaxDimension);
    if (!value.ok()) return value.status();
    *dimensions[i].second = *value;
  }
  absl::StatusOr<int64_t> threads =
      ParseCount("threads", columns[4], 1, std::numeric_limits<int>::max());
  if (!threads.ok()) return threads.status();
  rule.threads = static_cast<int>(*threads);
  absl::StatusOr<int64_t> max_m = ParseCount("max_m", columns[5], 0, kNoMax);
  if (!max_m.ok()) return max_m.status();
  rule.max_m = *max_m;
  absl::StatusOr<KernelVariant> variant = ParseKernelVariant(columns[6]);
  if (!variant.ok()) return variant.status();
  rule.variant = *variant;
  return rule;
}

// How far apart two positive sizes are on a log scale: 1 per factor of two.
double LogDistance(int64_t a, int64_t b) {
  return std::abs(std::log2(static_cast<double>(std::max<int64_t>(a, 1)) /
                            static_cast<double>(std::max<int64_t>(b, 1))));
}

// The format whose rules stand in for `format` when the table has none of its
// own: the FP4-coded formats run the same loops as kFp4, with other scales.
WeightFormat StandInFormat(WeightFormat format) {
  return HasFp4Codes(format) ? WeightFormat::kFp4 : format;
}

// Sorts max_m ascending with 0 (unbounded) last.
bool CoversLess(const TuningRule* a, const TuningRule* b) {
  if (a->max_m == 0) return false;
  return b->max_m == 0 || a->max_m < b->max_m;
}

// Rules in the order Lookup tries them: the tighter bound first, and at the
// same bound a level's own rule before one of every level.
bool TriedBefore(const TuningRule* a, const TuningRule* b) {
  if (CoversLess(a, b)) return true;
  if (CoversLess(b, a)) return false;
  return !a->isa.empty() && b->isa.empty();
}

}  // namespace

TuningTable::TuningTable(std::vector<TuningRule> rules)
    : rules_(std::move(rules)) {
  const auto first_level =
      std::find_if(rules_.begin(), rules_.end(),
                   [](const TuningRule& rule) { return !rule.isa.empty(); });
  if (first_level != rules_.end()) isa_ = first_level->isa;
}

const TuningTable& TuningTable::Default() {
  static const TuningTable* const table = [] {
    absl::StatusOr<TuningTable> parsed = Parse(kDefaultTableText);
    if (!parsed.ok()) {
      // Only an edit of the .inc files gets here; the tests catch it.
      std::fprintf(stderr, "nibble: built-in tuning table is broken: %s\n",
                   std::string(parsed.status().message()).c_str());
      std::abort();
    }
    return new TuningTable(*std::move(parsed));
  }();
  return *table;
}

absl::StatusOr<TuningTable> TuningTable::Parse(absl::string_view text) {
  std::vector<TuningRule> rules;
  std::vector<int> rule_lines;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::StatusOr<TuningRule> rule = ParseRule(line);
    if (!rule.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("line ", line_number, ": ", rule.status().message()));
    }
    // Two rules for the same problems would make the table ambiguous.
    for (size_t i = 0; i < rules.size(); ++i) {
      const TuningRule& other = rules[i];
      if (other.isa == rule->isa && other.format == rule->format &&
          other.group_size == rule->group_size && other.k == rule->k &&
          other.n == rule->n && other.threads == rule->threads &&
          other.max_m == rule->max_m) {
        return absl::InvalidArgumentError(absl::StrCat(
            "line ", line_number,
            ": repeats the isa, format, group, k, n, threads and max_m of "
            "line ",
            rule_lines[i], "; keep one of them"));
      }
    }
    rules.push_back(*rule);
    rule_lines.push_back(line_number);
  }
  return TuningTable(std::move(rules));
}

absl::StatusOr<TuningTable> TuningTable::Load(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFileContents(path);
  if (!contents.ok()) return contents.status();
  absl::StatusOr<TuningTable> table = Parse(*contents);
  if (!table.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", table.status().message()));
  }
  return table;
}

std::string TuningTable::Serialize() const {
  std::string text = absl::StrCat("# isa ", kRuleColumns, "\n");
  for (const TuningRule& rule : rules_) {
    if (!rule.isa.empty()) absl::StrAppend(&text, rule.isa, " ");
    absl::StrAppend(&text, WeightFormatName(rule.format), " ", rule.group_size,
                    " ", rule.k, " ", rule.n, " ", rule.threads, " ",
                    rule.max_m, " ", KernelVariantName(rule.variant), "\n");
  }
  return text;
}

TuningTable TuningTable::ForGpu(absl::string_view level, int sm_count) const {
  std::vector<TuningRule> rules;
  if (!level.empty()) {
    std::copy_if(rules_.begin(), rules_.end(), std::back_inserter(rules),
                 [&](const TuningRule& rule) { return rule.isa == level; });
  }
  TuningTable table(std::move(rules));
  table.sm_count_ = sm_count;
  return table;
}

TuningTable TuningTable::ForIsas(
    std::span<const absl::string_view> levels) const {
  if (levels.empty()) return *this;
  TuningTable table = *this;
  table.isa_.clear();
  for (absl::string_view level : levels) {
    if (std::any_of(rules_.begin(), rules_.end(), [&](const TuningRule& rule) {
          return rule.isa == level;
        })) {
      table.isa_ = std::string(level);
      break;
    }
  }
  return table;
}

std::optional<KernelVariant> TuningTable::Lookup(
    const GemmProblem& problem) const {
  const bool has_own_rules =
      std::any_of(rules_.begin(), rules_.end(), [&](const TuningRule& rule) {
        return Answers(rule) && rule.format == problem.format;
      });
  const WeightFormat format =
      has_own_rules ? problem.format : StandInFormat(problem.format);
  // The closest measured key; ties go to the rule listed first.
  const TuningRule* nearest = nullptr;
  double best[3] = {};
  for (const TuningRule& rule : rules_) {
    if (!Answers(rule) || rule.format != format) continue;
    const double distance[3] = {
        LogDistance(rule.group_size, problem.group_size),
        LogDistance(rule.k, problem.k) + LogDistance(rule.n, problem.n),
        LogDistance(rule.threads, sm_count_ > 0 ? sm_count_ : problem.threads)};
    if (nearest == nullptr ||
        std::lexicographical_compare(distance, distance + 3, best, best + 3)) {
      nearest = &rule;
      std::copy(distance, distance + 3, best);
    }
  }
  if (nearest == nullptr) return std::nullopt;

  std::vector<const TuningRule*> candidates;
  for (const TuningRule& rule : rules_) {
    if (Answers(rule) && rule.format == nearest->format &&
        rule.group_size == nearest->group_size && rule.k == nearest->k &&
        rule.n == nearest->n && rule.threads == nearest->threads) {
      candidates.push_back(&rule);
    }
  }
  std::stable_sort(candidates.begin(), candidates.end(), TriedBefore);
  for (const TuningRule* rule : candidates) {
    if (rule->max_m == 0 || problem.m <= rule->max_m) return rule->variant;
  }
  // Past every bound: the rule measured at the largest m is the best guess.
  return candidates.back()->variant;
}

}  // namespace nibble
