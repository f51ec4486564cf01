#!/usr/bin/env bash
# nibble-load's own targets, measured on this machine: the open-loop rate one
# process sustains against a nibbled answering a health-sized request (a
# 32x8 weight, M = 1), for each API, and the p99 it reports when the server
# is paused with SIGSTOP for 1 s in the middle of a 10 s run at 1,000
# requests/s. Client and server share the machine, as in a loopback test.
#
#   bench/load_rate.sh [BIN_DIR]      (LOAD_RATE=20000 LOAD_DURATION=10)
set -euo pipefail

bin=${1:-build/bin}
rate=${LOAD_RATE:-20000}
duration=${LOAD_DURATION:-10}
work=$(mktemp -d)
server_pid=

cleanup() {
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    kill -CONT "$server_pid" 2>/dev/null || true
    kill -TERM "$server_pid"
    wait "$server_pid" || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT

"$bin/nibbled" --listen=127.0.0.1:0 >"$work/nibbled.out" 2>"$work/nibbled.err" &
server_pid=$!
for _ in $(seq 100); do
  grep -q "listening on" "$work/nibbled.out" 2>/dev/null && break
  kill -0 "$server_pid" 2>/dev/null || { cat "$work/nibbled.err" >&2; exit 1; }
  sleep 0.1
done
target=$(sed -n 's/^nibbled: listening on \([^ ]*\).*/\1/p' "$work/nibbled.out")
[[ -n "$target" ]] || { echo "load_rate: nibbled did not start" >&2; exit 1; }
"$bin/nibble" upload --target="$target" --name=tiny --format=u4b8 --k=32 \
  --n=8 --group=32 --random=1 >/dev/null

# The number after "KEY": in a JSON file.
json_value() {
  grep -o "\"$1\": [-0-9.e]*" "$2" | head -1 | sed 's/.*: //'
}

echo "== open loop at $rate requests/s for ${duration}s, M=1 on a 32x8 u4b8 weight"
printf "%-13s %10s %10s %9s %9s %9s %7s\n" api asked sent short_% p50_ms \
  p99_ms errors
for api in Matmul MatmulStream ModelInfer; do
  "$bin/nibble-load" --target="$target" --name=tiny --api="$api" \
    --rate="$rate" --duration="$duration" --warmup=1 \
    --json="$work/$api.json" >/dev/null
  j="$work/$api.json"
  awk -v api="$api" -v asked="$rate" -v sent="$(json_value sent_rps "$j")" \
    -v short="$(json_value send_shortfall_percent "$j")" \
    -v p50="$(json_value p50 "$j")" -v p99="$(json_value p99 "$j")" \
    -v errors="$(json_value errors "$j")" 'BEGIN {
      printf "%-13s %10d %10.1f %9.2f %9.2f %9.2f %7d\n", api, asked, sent,
             short, p50 / 1000, p99 / 1000, errors }'
done

echo "== open loop at 1000 requests/s for 10s, server paused 1s at 4.5s"
( sleep 4.5; kill -STOP "$server_pid"; sleep 1; kill -CONT "$server_pid" ) &
pause_pid=$!
"$bin/nibble-load" --target="$target" --name=tiny --rate=1000 --duration=10 \
  --warmup=0 --json="$work/stall.json" >/dev/null
wait "$pause_pid"
echo "p50 $(json_value p50 "$work/stall.json") us, p99" \
  "$(json_value p99 "$work/stall.json") us, max" \
  "$(json_value max "$work/stall.json") us (from scheduled send times)"
