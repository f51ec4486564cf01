#!/usr/bin/env bash
# nibble-load's own targets, measured on this machine: the open-loop rate one
# process sustains against a nibbled answering a health-sized request (a
# 32x8 weight, M = 1), for each API, and the p99 it reports when the server
# is paused with SIGSTOP for 1 s in the middle of a 10 s run at 1,000
# requests/s. Client and server share the machine, as in a loopback test.
# Then the cost of the HTTP/2 front (deploy/haproxy/nibble-front.cfg):
# unary Matmul at concurrency 64, bare and through HAProxy, on the 32x8
# weight (the front's worst case) and on a 4096x4096 one, alternating. The
# front reaches a second nibbled on a Unix socket, as in the container
# image (deploy/nibble-entrypoint.sh).
#
#   bench/server/load_rate.sh [BIN_DIR]
#     (LOAD_RATE=20000 LOAD_DURATION=10 LOAD_FRONT_ROUNDS=3)
set -euo pipefail

bin=${1:-build/bin}
rate=${LOAD_RATE:-20000}
duration=${LOAD_DURATION:-10}
front_rounds=${LOAD_FRONT_ROUNDS:-3}
work=$(mktemp -d)
source "$(dirname "$0")/../../deploy/nibbled_lib.sh"
front_pid=
front_nibbled_pid=
trap 'for pid in $front_pid $front_nibbled_pid; do kill "$pid" || true; done
      stop_nibbled || true; rm -rf "$work"' EXIT

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

echo "== unary Matmul at concurrency 64 for ${duration}s, bare and through the front, $front_rounds rounds"
socket=$work/nibbled.sock
"$bin/nibbled" --listen="unix:$socket" >"$work/front-nibbled.out" \
  2>"$work/front-nibbled.err" &
front_nibbled_pid=$!
front_port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
NIBBLE_FRONT_LISTEN=127.0.0.1:$front_port NIBBLE_FRONT_BACKEND=unix@$socket \
  haproxy -f "$(dirname "$0")/../../deploy/haproxy/nibble-front.cfg" &
front_pid=$!
until "$bin/nibble" health --target="127.0.0.1:$front_port" >/dev/null 2>&1; do
  kill -0 "$front_nibbled_pid" || { cat "$work/front-nibbled.err" >&2; exit 1; }
  sleep 0.1
done
"$bin/nibble" upload --target="unix:$socket" --name=tiny --format=u4b8 \
  --k=32 --n=8 --group=32 --random=1 >/dev/null
for address in "$target" "unix:$socket"; do
  "$bin/nibble" upload --target="$address" --name=large --format=u4b8 \
    --k=4096 --n=4096 --group=128 --random=1 >/dev/null
done
printf "%-7s %-6s %12s %9s %9s %7s\n" weight path requests/s p50_ms p99_ms \
  errors
for round in $(seq "$front_rounds"); do
  for weight in tiny large; do
    for path in bare front; do
      address=$target
      [[ "$path" == bare ]] || address=127.0.0.1:$front_port
      j="$work/$weight-$path-$round.json"
      "$bin/nibble-load" --target="$address" --name="$weight" \
        --concurrency=64 --duration="$duration" --warmup=1 --json="$j" \
        >/dev/null
      awk -v weight="$weight" -v path="$path" \
        -v rps="$(json_number throughput_rps "$j")" \
        -v p50="$(json_number p50 "$j")" -v p99="$(json_number p99 "$j")" \
        -v errors="$(json_number errors "$j")" 'BEGIN {
          printf "%-7s %-6s %12.1f %9.2f %9.2f %7d\n", weight, path, rps,
                 p50 / 1000, p99 / 1000, errors }'
      json_number throughput_rps "$j" >>"$work/$weight-$path.rps"
    done
  done
done
# The medians, and what the front costs of the bare throughput.
median() { sort -g "$1" | awk '{ v[NR] = $1 } END {
  print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
for weight in tiny large; do
  awk -v weight="$weight" -v bare="$(median "$work/$weight-bare.rps")" \
    -v front="$(median "$work/$weight-front.rps")" 'BEGIN {
      printf "%-7s median of %d: bare %.1f, front %.1f requests/s: %+.1f %%\n",
             weight, '"$front_rounds"', bare, front, 100 * (front / bare - 1) }'
done
