#!/usr/bin/env bash
# The main job, end to end on this machine: start nibbled on loopback, upload a
# 4096x4096 u4b8 (group 128) weight, check one matmul against the float64
# reference, drive it with nibble-load for 10 s, print the report, and stop the
# server cleanly.
set -euo pipefail

bin=${1:-build/bin}
duration=${DEMO_DURATION:-10}
concurrency=${DEMO_CONCURRENCY:-4}
work=$(mktemp -d)
source "$(dirname "$0")/nibbled_lib.sh"
trap 'stop_nibbled || true; rm -rf "$work"' EXIT

start_nibbled
echo "== $(cat "$work/nibbled.out")"

echo "== uploading a 4096x4096 u4b8 weight, group 128"
"$bin/nibble" upload --target="$target" --name=demo --format=u4b8 \
  --k=4096 --n=4096 --group=128 --random=1

echo "== one matmul (m=4, bf16), checked against the float64 reference"
"$bin/nibble" matmul --target="$target" --name=demo --m=4 --dtype=bf16 \
  --random_input=2 --check --random=1

echo "== nibble-load: m=1, f32, concurrency $concurrency, ${duration}s"
"$bin/nibble-load" --target="$target" --name=demo --m=1 --dtype=f32 \
  --concurrency="$concurrency" --duration="$duration"

echo "== stopping nibbled"
stop_nibbled
echo "== done"
