// Fuzzes the tuning-table reader: TuningTable::Parse must refuse bad text
// cleanly, a table it accepts must survive Serialize and Parse unchanged, and
// Lookup on each rule it answers with, at the rule's own problem, must give
// that rule's variant; so must the table ForGpu narrows to a rule's level
// and thread count, whatever the problem's threads.
#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "kernels/tuning_table.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

// The problem at the edge of `rule`: its shape, threads and m = max_m.
nibble::GemmProblem ProblemAt(const nibble::TuningRule& rule) {
  nibble::GemmProblem problem;
  problem.format = rule.format;
  problem.group_size = rule.group_size;
  problem.k = rule.k;
  problem.n = rule.n;
  problem.threads = rule.threads;
  problem.m = rule.max_m;
  return problem;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<nibble::TuningTable> table = nibble::TuningTable::Parse(text);
  if (!table.ok()) return 0;
  absl::StatusOr<nibble::TuningTable> reparsed =
      nibble::TuningTable::Parse(table->Serialize());
  FUZZ_CHECK(reparsed.ok());
  FUZZ_CHECK(reparsed->rules() == table->rules());
  for (const nibble::TuningRule& rule : table->rules()) {
    // Rules of other levels than the one the table answers at wait for
    // ForIsas to pick theirs; a rule of every level gives way to the level's
    // own rule for the same problems.
    if (!rule.isa.empty() && rule.isa != table->isa()) continue;
    const bool overridden =
        rule.isa.empty() &&
        std::any_of(table->rules().begin(), table->rules().end(),
                    [&](const nibble::TuningRule& other) {
                      return !other.isa.empty() && other.isa == table->isa() &&
                             other.format == rule.format &&
                             other.group_size == rule.group_size &&
                             other.k == rule.k && other.n == rule.n &&
                             other.threads == rule.threads &&
                             other.max_m == rule.max_m;
                    });
    if (overridden) continue;
    // Rules of one problem differ in max_m, so at m = max_m this rule is the
    // tightest one that covers it.
    if (rule.max_m == 0) continue;
    FUZZ_CHECK(table->Lookup(ProblemAt(rule)) == rule.variant);
  }
  for (const nibble::TuningRule& rule : table->rules()) {
    if (rule.isa.empty() || rule.max_m == 0) continue;
    nibble::GemmProblem problem = ProblemAt(rule);
    problem.threads = 1;
    FUZZ_CHECK(table->ForGpu(rule.isa, rule.threads).Lookup(problem) ==
               rule.variant);
  }
  return 0;
}
