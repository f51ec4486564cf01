#!/usr/bin/env bash
# Dynamic batching's target, measured on this machine: 64 closed-loop clients
# of M = 1 on a random 4096x4096 u4b8 (group 128) weight against nibbled with
# batching on (the defaults) and off (--max_batch_rows=1); prints both
# throughputs and their ratio (the target is at least 8). Then one client
# against each, whose p50 difference is what batching costs a lone request.
#
# First it times the kernels alone (nibble-bench, the scheduler's pick) at
# M = 1 and M = 64: 64 x t(1) / t(64) is the most batching can gain on this
# machine before any RPC is counted, so the ratio reads against it.
#
#   bench/server/batching_bench.sh [BIN_DIR]   (BATCH_DURATION=10 BATCH_WARMUP=2
#                                        BATCH_DTYPE=bf16 BATCH_API=Matmul
#                                        BATCH_FLAGS=)
# bf16 by default: f32 and f16 requests never batch into the AMX kernels that
# would round A (see docs/operations.md, Batching): far less gain where AMX is.
# BATCH_API is nibble-load's --api (Matmul, MatmulStream or ModelInfer).
# BATCH_FLAGS are extra nibbled flags for the batching-on server, e.g.
# --max_batch_delay_us=500.
set -euo pipefail

bin=${1:-build/bin}
duration=${BATCH_DURATION:-10}
warmup=${BATCH_WARMUP:-2}
dtype=${BATCH_DTYPE:-bf16}
api=${BATCH_API:-Matmul}
read -r -a batch_flags <<<"${BATCH_FLAGS:-}"
work=$(mktemp -d)
source "$(dirname "$0")/../../deploy/nibbled_lib.sh"
trap 'stop_nibbled || true; rm -rf "$work"' EXIT

# The median microseconds of the scheduler's pick at M = $1.
kernel_us() {
  grep "\"pick\":true" "$work/kernels.jsonl" | grep "\"m\":$1," |
    grep -o '"median_us":[0-9.e+]*' | sed 's/.*://'
}

echo "== kernels alone (nibble-bench, u4b8 g128 4096x4096)"
"$bin/nibble-bench" --m=1,64 --shapes=4096x4096 --formats=u4b8 --groups=128 \
  --json="$work/kernels.jsonl" | tail -3
t1=$(kernel_us 1)
t64=$(kernel_us 64)

# Starts nibbled with the given flags and uploads the weight.
start_server() {
  start_nibbled "$@"
  "$bin/nibble" upload --target="$target" --name=bench --format=u4b8 \
    --k=4096 --n=4096 --group=128 --random=1 >/dev/null
}

# Runs nibble-load with `concurrency` clients; writes $work/$2.json.
load() {
  "$bin/nibble-load" --target="$target" --name=bench --api="$api" --m=1 \
    --dtype="$dtype" --concurrency="$1" --duration="$duration" \
    --warmup="$warmup" --json="$work/$2.json" >/dev/null
}

for mode in on off; do
  if [[ $mode == on ]]; then
    start_server "${batch_flags[@]}"
  else
    start_server --max_batch_rows=1
  fi
  echo "== batching $mode: $(cat "$work/nibbled.out")"
  load 64 "c64_$mode"
  load 1 "c1_$mode"
  stop_nibbled
done

rps_on=$(json_number throughput_rps "$work/c64_on.json")
rps_off=$(json_number throughput_rps "$work/c64_off.json")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
printf 'kernels: M=1 %.1f us, M=64 %.1f us: batches of 64 gain at most %sx\n' \
  "$t1" "$t64" "$(ratio "$(awk -v a="$t1" 'BEGIN { print 64 * a }')" "$t64")"
printf '64 clients, %s M=1 %s, 4096x4096 u4b8: batching on %.1f req/s, off %.1f req/s, ratio %sx (target >= 8x)\n' \
  "$api" "$dtype" "$rps_on" "$rps_off" "$(ratio "$rps_on" "$rps_off")"
printf '1 client, M=1 %s: p50 batching on %s us, off %s us\n' \
  "$dtype" "$(json_number p50 "$work/c1_on.json")" "$(json_number p50 "$work/c1_off.json")"
