#!/bin/sh
# Runs nibble-bench's CI grid (--quick --json) and checks that it exits 0 and
# prints the machine line and timings. Usage: nibble_bench_quick_test.sh BIN
set -eu
output=$("$1" --quick --json)
printf '%s\n' "$output"
printf '%s\n' "$output" | grep -q '^{"machine":'
printf '%s\n' "$output" | grep -q '"median_us"'
