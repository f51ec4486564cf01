// Fuzzes the tuning-table reader: TuningTable::Parse must refuse bad text
// cleanly, a table it accepts must survive Serialize and Parse unchanged, and
// Lookup on each rule's own problem must answer with that rule's variant.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "kernels/tuning_table.h"
#include "tests/fuzz/fuzz_check.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nibble::TuningTable> table = nibble::TuningTable::Parse(text);
  if (!table.ok()) return 0;
  absl::StatusOr<nibble::TuningTable> reparsed =
      nibble::TuningTable::Parse(table->Serialize());
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(reparsed->rules() == table->rules());
  for (const nibble::TuningRule& rule : table->rules()) {
    nibble::GemmProblem problem;
    problem.format = rule.format;
    problem.group_size = rule.group_size;
    problem.k = rule.k;
    problem.n = rule.n;
    problem.threads = rule.threads;
    // Rules of one problem differ in max_m, so at m = max_m this rule is the
    // tightest one that covers it.
    if (rule.max_m == 0) continue;
    problem.m = rule.max_m;
    FUZZ_CHECK(table->Lookup(problem) == rule.variant);
  }
  return 0;
}
