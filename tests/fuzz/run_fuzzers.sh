#!/usr/bin/env bash
# Runs each libFuzzer target built in BUILD_DIR for SECONDS, as `make fuzz`
# does: on a scratch corpus in BUILD_DIR/corpus/<target>, seeded from the
# repository's corpus and regressions (which it never writes), with crashers
# in BUILD_DIR/artifacts/<target>/ and the log in BUILD_DIR/logs/<target>.log.
# One line per target; fails when any target crashes.
#
#   tests/fuzz/run_fuzzers.sh build-fuzz 60 weight_file_fuzzer upload_fuzzer
set -euo pipefail

(($# >= 3)) || {
  echo "usage: $0 BUILD_DIR SECONDS TARGET..." >&2
  exit 2
}
build_dir=$1
seconds=$2
shift 2
fuzz_dir=$(dirname "$0")

failed=()
for target in "$@"; do
  corpus="$build_dir/corpus/$target"
  artifacts="$build_dir/artifacts/$target"
  log="$build_dir/logs/$target.log"
  mkdir -p "$corpus" "$artifacts" "$(dirname "$log")"
  for seeds in "$fuzz_dir/corpus/$target" "$fuzz_dir/regressions/$target"; do
    [[ -d "$seeds" ]] && cp -n "$seeds"/* "$corpus"/ 2>/dev/null || true
  done
  echo "fuzz: $target for ${seconds}s ($(ls "$corpus" | wc -l) inputs)"
  # -timeout: a single input running this long is a hang, reported as a crash.
  if "$build_dir/bin/$target" -max_total_time="$seconds" -timeout=25 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 "$corpus" \
    >"$log" 2>&1; then
    # libFuzzer's last status line, e.g. "#52 DONE cov: 812 ft: 1311 corp:
    # 88/5Kb lim: 4 exec/s: 17 rss: 40Mb".
    summary=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 |
      sed -E 's/^#[0-9]+[[:space:]]+DONE[[:space:]]+//' || true)
    echo "fuzz: $target ok: $summary"
  else
    echo "fuzz: $target FAILED; log $log, crasher in $artifacts:" >&2
    grep -E 'ERROR|FUZZ_CHECK|SUMMARY|Test unit written' "$log" | head -5 >&2
    failed+=("$target")
  fi
done

if ((${#failed[@]} > 0)); then
  echo "fuzz: crashed: ${failed[*]}; add each crasher to" \
    "tests/fuzz/regressions/<target>/ with the fix" >&2
  exit 1
fi
echo "fuzz: all ${#} targets ran ${seconds}s without a crash"
