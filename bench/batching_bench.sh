#!/usr/bin/env bash
# Dynamic batching's target, measured on this machine: 64 closed-loop clients
# of M = 1 on a random 4096x4096 u4b8 (group 128) weight against nibbled with
# batching on (the defaults) and off (--max_batch_rows=1); prints both
# throughputs and their ratio (the target is at least 8). Then one client
# against each, whose p50 difference is what batching costs a lone request.
#
#   bench/batching_bench.sh [BIN_DIR]   (BATCH_DURATION=10 BATCH_WARMUP=2
#                                        BATCH_DTYPE=f32 BATCH_FLAGS=)
# BATCH_FLAGS are extra nibbled flags for the batching-on server, e.g.
# --max_batch_delay_us=500.
set -euo pipefail

bin=${1:-build/bin}
duration=${BATCH_DURATION:-10}
warmup=${BATCH_WARMUP:-2}
dtype=${BATCH_DTYPE:-f32}
read -r -a batch_flags <<<"${BATCH_FLAGS:-}"
work=$(mktemp -d)
source "$(dirname "$0")/../deploy/nibbled_lib.sh"
trap 'stop_nibbled || true; rm -rf "$work"' EXIT

# Starts nibbled with the given flags and uploads the weight.
start_server() {
  start_nibbled "$@"
  "$bin/nibble" upload --target="$target" --name=bench --format=u4b8 \
    --k=4096 --n=4096 --group=128 --random=1 >/dev/null
}

# Runs nibble-load with `concurrency` clients; writes $work/$2.json.
load() {
  "$bin/nibble-load" --target="$target" --name=bench --m=1 --dtype="$dtype" \
    --concurrency="$1" --duration="$duration" --warmup="$warmup" \
    --json="$work/$2.json" >/dev/null
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
printf '64 clients, M=1 %s, 4096x4096 u4b8: batching on %.1f req/s, off %.1f req/s, ratio %.2fx (target >= 8x)\n' \
  "$dtype" "$rps_on" "$rps_off" "$(awk -v a="$rps_on" -v b="$rps_off" 'BEGIN { print a / b }')"
printf '1 client, M=1 %s: p50 batching on %s us, off %s us\n' \
  "$dtype" "$(json_number p50 "$work/c1_on.json")" "$(json_number p50 "$work/c1_off.json")"
