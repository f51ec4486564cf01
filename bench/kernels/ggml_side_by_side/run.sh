#!/usr/bin/env bash
# nibble-bench against ggml's CPU backend (Q4_0 repacked, activations
# quantized to int8) on the same matmuls, in interleaved rounds: ggml, then
# nibble, then ggml again... Prints a markdown table of the medians over the
# rounds (table.py). Not part of the build or CI.
#
#   bench/kernels/ggml_side_by_side/run.sh GGML_SOURCE_DIR GGML_BUILD_DIR
#
# GGML_BUILD_DIR is a CPU-only build of GGML_SOURCE_DIR, e.g.
#   cmake -S GGML_SOURCE_DIR -B GGML_BUILD_DIR -DCMAKE_BUILD_TYPE=Release \
#     -DGGML_NATIVE=ON && cmake --build GGML_BUILD_DIR -j
#
# Environment (defaults in brackets):
#   ROUNDS [3]; THREADS [2]; NIBBLE_BIN [build/bin];
#   OUT [build/ggml-side-by-side]: the harness's build and the JSON lines;
#   GGML_BUFFER_TYPE [CPU_REPACK]: ggml's weight buffer type (its repack
#     for CPUs without AMX; "AMX" where ggml was built with it);
#   NIBBLE_ISA [avx512_bf16]: nibble's level cap, the same CPU class;
#   LOCK [/tmp/nibble-cpu.lock]: every build and run holds it (flock), so
#     that two people timing on one machine take turns.
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 GGML_SOURCE_DIR GGML_BUILD_DIR" >&2
  exit 2
fi
ggml_source=$(realpath "$1")
ggml_build=$(realpath "$2")
here=$(dirname "$(realpath "$0")")
rounds=${ROUNDS:-3}
threads=${THREADS:-2}
nibble_bin=${NIBBLE_BIN:-build/bin}
out=${OUT:-build/ggml-side-by-side}
buffer_type=${GGML_BUFFER_TYPE:-CPU_REPACK}
export NIBBLE_ISA=${NIBBLE_ISA:-avx512_bf16}
lock=${LOCK:-/tmp/nibble-cpu.lock}

# The points, as M:KxN, grouped as nibble-bench takes them (its grid is M x
# shapes).
nibble_groups=("1 4096x4096" "1,16,64 8192x28672" "256 4096x14336")
ggml_points=1x4096x4096,1x8192x28672,16x8192x28672,64x8192x28672,256x4096x14336

if [[ ! -x "$nibble_bin/nibble-bench" ]]; then
  echo "no $nibble_bin/nibble-bench: build it first (cmake --build build" \
       "--target nibble-bench) or set NIBBLE_BIN" >&2
  exit 2
fi
flock "$lock" cmake -S "$here" -B "$out" -G Ninja \
  -DGGML_SOURCE_DIR="$ggml_source" -DGGML_BUILD_DIR="$ggml_build" > /dev/null
flock "$lock" cmake --build "$out" > /dev/null

rm -f "$out"/ggml_r*.jsonl "$out"/nibble_r*.jsonl
for round in $(seq 1 "$rounds"); do
  echo "round $round of $rounds: ggml ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  flock "$lock" "$out/ggml_side_by_side" --points="$ggml_points" \
    --threads="$threads" --buffer_type="$buffer_type" \
    > "$out/ggml_r$round.jsonl"
  echo "round $round of $rounds: nibble ($(date -u +%T), load $(cut -d' ' -f1 /proc/loadavg))" >&2
  for group in "${nibble_groups[@]}"; do
    read -r m shapes <<< "$group"
    # The default pick on f32 A (bf16 activations allowed), the opt-in int8
    # path, then A sent as bf16, which no kernel rounds further (below 16
    # rows f32 A keeps exact fp32 products).
    # Runs as precision:dtype of A.
    runs="bf16:f32"
    [[ $m == 1 ]] || runs+=" int8:f32"  # int8 kernels take >= 16 rows
    runs+=" bf16:bf16"
    for run in $runs; do
      precision=${run%:*}
      dtype=${run#*:}
      flock "$lock" "$nibble_bin/nibble-bench" --m="$m" --shapes="$shapes" \
        --formats=u4b8 --groups=128 --threads="$threads" \
        --activation_precision="$precision" --dtype="$dtype" \
        --json 2> /dev/null |
        sed "s/^{/{\"precision\":\"$precision\",\"a\":\"$dtype\",/" \
        >> "$out/nibble_r$round.jsonl"
    done
  done
done
python3 "$here/table.py" "$out"
