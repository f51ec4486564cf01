#!/usr/bin/env bash
# nibble-load's own targets, measured on this machine: the open-loop rate one
# process sustains against a nibbled answering a health-sized request (a
# 32x8 weight, M = 1), for each API, and the p99 it reports when the server
# is paused with SIGSTOP for 1 s in the middle of a 10 s run at 1,000
# requests/s. Client and server share the machine, as in a loopback test.
#
#   bench/server/load_rate.sh [BIN_DIR]      (LOAD_RATE=20000 LOAD_DURATION=10)
set -euo pipefail

bin=${1:-build/bin}
rate=${LOAD_RATE:-20000}
duration=${LOAD_DURATION:-10}
work=$(mktemp -d)
source "$(dirname "$0")/../../deploy/nibbled_lib.sh"
trap 'stop_nibbled || true; rm -rf "$work"' EXIT

start_nibbled
"$bin/nibble" upload --target="$target" --name=tiny --format=u4b8 --k=32 \
  --n=8 --group=32 --random=1 >/dev/null

echo "== open loop at $rate requests/s for ${duration}s, M=1 on a 32x8 u4b8 weight"
printf "%-13s %10s %10s %9s %9s %9s %7s\n" api asked sent short_% p50_ms \
  p99_ms errors
for api in Matmul MatmulStream ModelInfer; do
  "$bin/nibble-load" --target="$target" --name=tiny --api="$api" \
    --rate="$rate" --duration="$duration" --warmup=1 \
    --json="$work/$api.json" >/dev/null
  j="$work/$api.json"
  awk -v api="$api" -v asked="$rate" -v sent="$(json_number sent_rps "$j")" \
    -v short="$(json_number send_shortfall_percent "$j")" \
    -v p50="$(json_number p50 "$j")" -v p99="$(json_number p99 "$j")" \
    -v errors="$(json_number errors "$j")" 'BEGIN {
      printf "%-13s %10d %10.1f %9.2f %9.2f %9.2f %7d\n", api, asked, sent,
             short, p50 / 1000, p99 / 1000, errors }'
done

echo "== open loop at 1000 requests/s for 10s, server paused 1s at 4.5s"
( sleep 4.5; kill -STOP "$server_pid"; sleep 1; kill -CONT "$server_pid" ) &
pause_pid=$!
"$bin/nibble-load" --target="$target" --name=tiny --rate=1000 --duration=10 \
  --warmup=0 --json="$work/stall.json" >/dev/null
wait "$pause_pid"
echo "p50 $(json_number p50 "$work/stall.json") us, p99" \
  "$(json_number p99 "$work/stall.json") us, max" \
  "$(json_number max "$work/stall.json") us (from scheduled send times)"
