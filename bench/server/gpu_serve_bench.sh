#!/usr/bin/env bash
# The GPU serving benchmark (issue 26), run on the GPU machine through the
# portable bundle (deploy/portable-bundle.sh), which carries nibbled, nibble,
# nibble-load and nibble-gpu-bench with every library they load: no gRPC or
# network needed there. One run measures:
#   - the kernel time of each shape at M = 1 and 64 (nibble-gpu-bench, the
#     scheduler's pick), and that of one call through the backend with A and
#     C in host memory (its --latency), what a lone request costs below the
#     RPC;
#   - health Check at concurrency 1, 64 and 256: what the RPC alone costs;
#   - u4b8 (group 128) weights 128x256 (tiny), 4096x4096 and 8192x28672 with
#     M = 1 f16 requests, unary Matmul and MatmulStream, at concurrency 1, 64
#     and 256, with batching on (default flags) and off (--max_batch_rows=1);
#     replies of the two smaller weights are checked against the float64
#     reference (nibble-load --verify).
# It writes results.json (every run, with nibble-load's JSON) and report.md
# (the table and issue 26's targets, each PASS or FAIL) and prints the report;
# under each matmul run it prints where its requests' time went, from
# nibbled's /metrics (stage_means.py, also in stages_*.txt), and under every
# run where the CPU went, by process and thread name (thread_cpu.py, also in
# cpu_*.txt).
#
#   bench/server/gpu_serve_bench.sh [BIN_DIR] [OUT_DIR]
#     (build/portable/bin, build/gpu-serve-bench)
#   Environment: GPU_SERVE_DURATION=5 GPU_SERVE_WARMUP=1 (seconds per run),
#   GPU_SERVE_CONCURRENCY="1 64 256", GPU_SERVE_BACKEND=cuda,
#   GPU_SERVE_KERNEL_REPEATS=200, NIBBLE_GPU_BENCH (default
#   BIN_DIR/nibble-gpu-bench), PYTHON=python3.
set -euo pipefail

bin=${1:-build/portable/bin}
out=${2:-build/gpu-serve-bench}
duration=${GPU_SERVE_DURATION:-5}
warmup=${GPU_SERVE_WARMUP:-1}
concurrency=${GPU_SERVE_CONCURRENCY:-1 64 256}
backend=${GPU_SERVE_BACKEND:-cuda}
repeats=${GPU_SERVE_KERNEL_REPEATS:-200}
gpu_bench=${NIBBLE_GPU_BENCH:-$bin/nibble-gpu-bench}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
rm -f "$out"/load_*.json "$out"/stages_*.txt "$out"/cpu_*.txt "$out/kernels.jsonl" "$out/runs.tsv"
work=$(mktemp -d)
source "$here/../../deploy/nibbled_lib.sh"
trap 'stop_nibbled || true; rm -rf "$work"' EXIT

# name K N seed: the weights, u4b8 with group 128.
weights=(
  "tiny 128 256 11"
  "mid 4096 4096 12"
  "big 8192 28672 13"
)
shapes=$(for w in "${weights[@]}"; do set -- $w; printf '%sx%s,' "$2" "$3"; done)

echo "== kernels: nibble-gpu-bench M=1,64 on ${shapes%,}"
if ! "$gpu_bench" --m=1,64 --shapes="${shapes%,}" --latency \
  --formats=u4b8:128 --repeats="$repeats" --json="$out/kernels.jsonl" \
  >"$out/kernels.txt" 2>&1; then
  tail -n 20 "$out/kernels.txt" >&2
  echo "$0: nibble-gpu-bench failed; the report will have no kernel times" >&2
fi

# scrape FILE: nibbled's /metrics into FILE (bash's /dev/tcp: no curl
# needed).
scrape() {
  exec 3<>"/dev/tcp/${metrics%:*}/${metrics##*:}"
  printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$metrics" >&3
  cat <&3 >"$1"
  exec 3<&-
}

# load BATCHING NAME API CONCURRENCY [FLAGS...]: one nibble-load run into
# $out/load_BATCHING_NAME_API_CONCURRENCY.json, listed in runs.tsv, and the
# per-stage means of its requests (stage_means.py) into the matching
# stages_*.txt; its errors are counted by the report, not fatal here.
load() {
  local batching=$1 name=$2 api=$3 c=$4
  local json="$out/load_${batching}_${name}_${api}_${c}.json"
  local args=(--target="$target" --api="$api" --concurrency="$c"
    --duration="$duration" --warmup="$warmup" --json="$json" "${@:5}")
  [[ $api == Check ]] || args+=(--name="$name")
  # Every connection carries its share of the load; 256 clients on 4
  # connections would measure gRPC's per-connection limits.
  args+=(--connections=$((c < 16 ? c : 16)))
  scrape "$work/before.prom"
  "$bin/nibble-load" "${args[@]}" >"$work/load.out" 2>&1 &
  local load_pid=$!
  # Where the CPU goes, over the middle half of the measured seconds.
  (sleep "$(awk "BEGIN { print $warmup + $duration / 4 }")" &&
    "$python" "$here/thread_cpu.py" "$(awk "BEGIN { print $duration / 2 }")" \
      "$server_pid" "$load_pid" >"$work/cpu.txt" 2>&1) &
  local sampler_pid=$!
  if wait "$load_pid"; then
    wait "$sampler_pid" || true
    scrape "$work/after.prom"
    printf '%s\t%s\t%s\t%s\t%s\n' "$batching" "$name" "$api" "$c" "$json" \
      >>"$out/runs.tsv"
    printf '   %-8s %-5s %-12s c=%-4s %10s req/s  p50 %8s us  errors %s\n' \
      "$batching" "$name" "$api" "$c" "$(json_number throughput_rps "$json")" \
      "$(json_number p50 "$json")" "$(json_number errors "$json")"
    [[ $api == Check ]] ||
      "$python" "$here/stage_means.py" "$work/before.prom" "$work/after.prom" |
      tee "$out/stages_${batching}_${name}_${api}_${c}.txt" | sed 's/^/      /'
    tee "$out/cpu_${batching}_${name}_${api}_${c}.txt" <"$work/cpu.txt" |
      sed 's/^/      /'
  else
    wait "$sampler_pid" || true
    echo "   $batching $name $api c=$c: nibble-load failed:" >&2
    tail -n 5 "$work/load.out" >&2
  fi
}

for batching in on off; do
  flags=(--backend="$backend" --metrics_listen=127.0.0.1:0)
  [[ $batching == on ]] || flags+=(--max_batch_rows=1)
  start_nibbled "${flags[@]}"
  metrics=$(sed -n 's|.*metrics at http://\([^/]*\)/metrics.*|\1|p' "$work/nibbled.out")
  echo "== batching $batching: $(cat "$work/nibbled.out")"
  for w in "${weights[@]}"; do
    set -- $w
    "$bin/nibble" upload --target="$target" --name="$1" --format=u4b8 \
      --k="$2" --n="$3" --group=128 --random="$4" >/dev/null
  done
  if [[ $batching == on ]]; then
    for c in $concurrency; do load on check Check "$c"; done
  fi
  for w in "${weights[@]}"; do
    set -- $w
    verify=()
    # The float64 reference of the big weight costs the client ~0.2 s a reply.
    [[ $1 == big ]] || verify=(--verify=997 --random="$4")
    for api in Matmul MatmulStream; do
      for c in $concurrency; do
        load "$batching" "$1" "$api" "$c" --m=1 --dtype=f16 "${verify[@]}"
      done
    done
  done
  stop_nibbled || { echo "$0: nibbled exited with an error:" >&2; tail -n 20 "$work/nibbled.err" >&2; }
done

"$python" "$here/gpu_serve_report.py" --runs="$out/runs.tsv" \
  --kernels="$out/kernels.jsonl" --json="$out/results.json" \
  --markdown="$out/report.md"
cat "$out/report.md"
