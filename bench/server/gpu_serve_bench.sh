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
#     reference (nibble-load --verify);
#   - on a machine with several GPUs (issue 30), the 8192x28672 weight once
#     per GPU and 64 and 256 clients spread evenly over the copies, unary and
#     MatmulStream, with nibbled on GPU 0 alone (every copy there, --gpus=0)
#     and on every GPU (each copy placed on its own), and the tiny weight
#     likewise on every GPU (the server's ceiling with next to no GPU work):
#     requests/s summed over the copies, in multi_gpu.tsv and the report's
#     last table.
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
#   GPU_SERVE_KERNEL_REPEATS=200, GPU_SERVE_GPUS (default: the GPUs
#   nvidia-smi lists; the multi-GPU runs need 2 or more),
#   GPU_SERVE_MULTI_CONCURRENCY="64 256", GPU_SERVE_MULTI_APIS="Matmul
#   MatmulStream", NIBBLE_GPU_BENCH (default
#   BIN_DIR/nibble-gpu-bench), PYTHON=python3.
set -euo pipefail

bin=${1:-build/portable/bin}
out=${2:-build/gpu-serve-bench}
duration=${GPU_SERVE_DURATION:-5}
warmup=${GPU_SERVE_WARMUP:-1}
concurrency=${GPU_SERVE_CONCURRENCY:-1 64 256}
backend=${GPU_SERVE_BACKEND:-cuda}
repeats=${GPU_SERVE_KERNEL_REPEATS:-200}
gpus=${GPU_SERVE_GPUS:-$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)}
multi_concurrency=${GPU_SERVE_MULTI_CONCURRENCY:-64 256}
multi_apis=${GPU_SERVE_MULTI_APIS:-Matmul MatmulStream}
gpu_bench=${NIBBLE_GPU_BENCH:-$bin/nibble-gpu-bench}
python=${PYTHON:-python3}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
rm -f "$out"/load_*.json "$out"/stages_*.txt "$out"/cpu_*.txt "$out/kernels.jsonl" "$out/runs.tsv" \
  "$out"/multi_*
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

# multi_gpu PLACEMENT WEIGHT K N [NIBBLED FLAGS...]: a u4b8 g128 weight of
# K x N uploaded as WEIGHT0, WEIGHT1, ... (one per GPU), then for each API of
# $multi_apis and each of $multi_concurrency clients one nibble-load per copy
# with its share of the clients, all at once; a line of multi_gpu.tsv per
# run with the summed requests/s and the worst p50, where the CPU went
# (multi_cpu_*.txt), and `nibble list` (which GPU holds each copy) in
# multi_list_PLACEMENT_WEIGHT.txt.
multi_gpu() {
  local placement=$1 weight=$2 k=$3 n=$4
  start_nibbled --backend="$backend" "${@:5}"
  echo "== $gpus copies of $weight, nibbled $placement: $(cat "$work/nibbled.out")"
  local copy c api
  for ((copy = 0; copy < gpus; ++copy)); do
    "$bin/nibble" upload --target="$target" --name="$weight$copy" \
      --format=u4b8 --k="$k" --n="$n" --group=128 --random=13 >/dev/null
  done
  "$bin/nibble" list --target="$target" \
    >"$out/multi_list_${placement}_$weight.txt"
  sed 's/^/   /' "$out/multi_list_${placement}_$weight.txt"
  for api in $multi_apis; do
    for c in $multi_concurrency; do
      local share=$((c / gpus)) pids=() jsons=()
      local run="${placement}_${weight}_${api}_$c"
      for ((copy = 0; copy < gpus; ++copy)); do
        local json="$out/multi_${run}_$copy.json"
        jsons+=("$json")
        "$bin/nibble-load" --target="$target" --name="$weight$copy" \
          --api="$api" --m=1 --dtype=f16 --concurrency="$share" \
          --connections=$((share < 16 ? share : 16)) --duration="$duration" \
          --warmup="$warmup" --json="$json" >"$work/multi_$copy.out" 2>&1 &
        pids+=($!)
      done
      (sleep "$(awk "BEGIN { print $warmup + $duration / 4 }")" &&
        "$python" "$here/thread_cpu.py" "$(awk "BEGIN { print $duration / 2 }")" \
          "$server_pid" "${pids[@]}" >"$out/multi_cpu_$run.txt" 2>&1) &
      local sampler_pid=$! failed=0 pid
      for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
      wait "$sampler_pid" || true
      if ((failed)); then
        echo "   $run: a nibble-load failed:" >&2
        tail -n 5 "$work"/multi_*.out >&2
        continue
      fi
      local rps=0 p50=0 errors=0 json
      for json in "${jsons[@]}"; do
        rps=$(awk "BEGIN { print $rps + $(json_number throughput_rps "$json") }")
        p50=$(awk "BEGIN { p = $(json_number p50 "$json"); print (p > $p50 ? p : $p50) }")
        errors=$((errors + $(json_number errors "$json")))
      done
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$placement" "$weight" "$api" \
        "$c" "$rps" "$p50" "$errors" >>"$out/multi_gpu.tsv"
      printf '   %-4s %-4s %-12s c=%-4s %10.0f req/s  worst p50 %8s us  errors %s\n' \
        "$placement" "$weight" "$api" "$c" "$rps" "$p50" "$errors"
      sed 's/^/      /' "$out/multi_cpu_$run.txt"
    done
  done
  stop_nibbled || { echo "$0: nibbled exited with an error:" >&2; tail -n 20 "$work/nibbled.err" >&2; }
}

# The big weight on GPU 0 alone and on every GPU; the tiny one on every GPU
# gives the server's ceiling with next to no GPU work.
if ((gpus >= 2)); then
  multi_gpu one big 8192 28672 --gpus=0
  multi_gpu all big 8192 28672
  multi_gpu all tiny 128 256
fi

"$python" "$here/gpu_serve_report.py" --runs="$out/runs.tsv" \
  --kernels="$out/kernels.jsonl" --json="$out/results.json" \
  --markdown="$out/report.md" --multi_gpu="$out/multi_gpu.tsv" --gpus="$gpus"
cat "$out/report.md"
