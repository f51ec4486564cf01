#!/usr/bin/env bash
# The unary latency target, measured on this machine: one client (concurrency
# 1) sending unary Matmul with M = 1 on a random 4096x4096 u4b8 (group 128)
# weight must see a p50 of at most the kernel time plus twice the p50 of the
# health Check RPC measured in the same run. The kernel time is nibble-bench's
# median for the kernel the scheduler picks; the RPC cost is nibble-load
# --api=Check against the same nibbled (default flags). Each round runs the
# kernel benchmark, then Check, then Matmul; the verdict uses the medians over
# the rounds, since one noisy run can land either way.
#
#   bench/server/latency_bench.sh [BIN_DIR]   (LATENCY_DURATION=10 LATENCY_WARMUP=2
#                                       LATENCY_ROUNDS=3)
set -euo pipefail

bin=${1:-build/bin}
duration=${LATENCY_DURATION:-10}
warmup=${LATENCY_WARMUP:-2}
rounds=${LATENCY_ROUNDS:-3}
work=$(mktemp -d)
source "$(dirname "$0")/../../deploy/nibbled_lib.sh"
trap 'stop_nibbled || true; rm -rf "$work"' EXIT

# The median of the numbers on stdin, one a line.
median() {
  sort -g | awk '{ v[NR] = $1 }
    END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# nibble-bench's line for the scheduler's pick at M = 1; the scalar reference
# is named but not timed, so then there is none and the script stops.
bench_kernel() {
  local json="$work/kernel_$1.jsonl"
  "$bin/nibble-bench" --m=1 --shapes=4096x4096 --formats=u4b8 --groups=128 \
    --json="$json" >/dev/null 2>"$work/bench.err" ||
    { cat "$work/bench.err" >&2; exit 1; }
  grep '"backend":"cpu"' "$json" | grep '"pick":true' >"$work/pick_$1.json" ||
    { echo "$0: nibble-bench timed no pick; see $json" >&2; exit 1; }
}

# Runs nibble-load with one client through API $1 in round $2, plus flags;
# writes $work/$1_$2.json and stops the script when any request failed.
load() {
  local json="$work/$1_$2.json"
  "$bin/nibble-load" --target="$target" --api="$1" --concurrency=1 \
    --duration="$duration" --warmup="$warmup" --json="$json" "${@:3}" \
    >"$work/$1_$2.out"
  local errors
  errors=$(json_number errors "$json")
  if [[ $errors != 0 ]]; then
    echo "$0: $1 had $errors errors:" >&2
    cat "$work/$1_$2.out" >&2
    exit 1
  fi
}

start_nibbled
"$bin/nibble" upload --target="$target" --name=bench --format=u4b8 \
  --k=4096 --n=4096 --group=128 --random=1 >/dev/null
echo "== $(cat "$work/nibbled.out")"
echo "== $rounds rounds of: nibble-bench M=1 4096x4096 u4b8 g128, then" \
  "Check and Matmul M=1 f32 at concurrency 1 for ${duration}s after" \
  "${warmup}s warmup"

for round in $(seq "$rounds"); do
  bench_kernel "$round"
  load Check "$round"
  load Matmul "$round" --name=bench --m=1
  pick="$work/pick_$round.json"
  grep -o '"median_us":[-0-9.e+]*' "$pick" | cut -d: -f2 >"$work/kernel_us_$round"
  printf 'round %d/%d: kernel %s us (%s), Check p50 %s us, Matmul p50 %s us\n' \
    "$round" "$rounds" "$(cat "$work/kernel_us_$round")" \
    "$(sed 's/.*"kernel":"\([^"]*\)".*/\1/' "$pick")" \
    "$(json_number p50 "$work/Check_$round.json")" \
    "$(json_number p50 "$work/Matmul_$round.json")"
done

kernel_us=$(cat "$work"/kernel_us_* | median)
check_us=$(for f in "$work"/Check_*.json; do json_number p50 "$f"; done | median)
matmul_us=$(for f in "$work"/Matmul_*.json; do json_number p50 "$f"; done | median)
bench_pick=$(sed 's/.*"kernel":"\([^"]*\)".*/\1/' "$work/pick_1.json")
served=$(grep -o '"kernels": {"[^"]*"' "$work/Matmul_1.json" | sed 's/.*{"//; s/"$//')

echo "== medians over $rounds rounds"
printf 'kernel:          %10.1f us  (%s, nibble-bench median)\n' "$kernel_us" "$bench_pick"
printf 'health Check:    %10.1f us  (p50)\n' "$check_us"
printf 'Matmul M=1:      %10.1f us  (p50, served by %s)\n' "$matmul_us" "$served"
awk -v kernel="$kernel_us" -v check="$check_us" -v matmul="$matmul_us" 'BEGIN {
  bound = kernel + 2 * check
  margin = bound - matmul
  pass = (margin >= 0)
  gap = pass ? margin : -margin
  printf "bound:           %10.1f us  (kernel + 2 x Check)\n", bound
  printf "%s: Matmul p50 is %.1f us (%.1f %%) %s the bound\n",
    (pass ? "PASS" : "FAIL"), gap, 100 * gap / bound,
    (pass ? "under" : "over") }'
