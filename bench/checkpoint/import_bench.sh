#!/usr/bin/env bash
# The checkpoint import target, measured on this machine: importing a 1 GB
# safetensors file must take under twice the time it takes to read the file
# from disk, both through `nibble import` into nibbled on loopback and
# through `nibbled --import` (from its start until it listens). For each layout (GPTQ and AWQ
# layers, repacked; BF16 float layers, quantized as u4b8:128; with
# IMPORT_LAYOUTS also mxfp4 and nvfp4 layers, copied)
# nibble-make-checkpoint writes a synthetic Llama-like checkpoint; the read
# time is the median of IMPORT_RUNS `cat FILE > /dev/null`, the import time
# the median of IMPORT_RUNS `nibble import`, each into a fresh nibbled, and
# of IMPORT_RUNS starts of `nibbled --import` until it listens, and
# before every run of either the file is evicted from the page cache
# (nibble-make-checkpoint --evict, no root needed), so that both read it from
# the disk. For context, "fresh" is the quickest and the slowest of
# IMPORT_RUNS times a new process takes to write as many bytes of newly
# allocated memory as `nibbled --import` kept resident
# (nibble-make-checkpoint --fresh_memory), a floor of any import that stores
# them: the quickest reuses memory the process before it freed, and the
# slowest shows what memory the host has taken back costs, on a host that
# backs its guests' memory lazily. One checkpoint at a time lies in BUILD/bench/import (the parent of
# BIN_DIR), deleted after its runs; the imports' logs and results.jsonl (one
# JSON object per layout) stay there.
#
#   bench/checkpoint/import_bench.sh [BIN_DIR]   (IMPORT_BYTES=1073741824 IMPORT_RUNS=3
#                                      IMPORT_LAYOUTS="gptq awq float")
set -euo pipefail
# EPOCHREALTIME and awk must agree on the decimal point.
export LC_ALL=C

bin=${1:-build/bin}
bytes=${IMPORT_BYTES:-1073741824}
runs=${IMPORT_RUNS:-3}
read -r -a layouts <<<"${IMPORT_LAYOUTS:-gptq awq float}"
quantize=u4b8:128
out="$(dirname "$bin")/bench/import"
results="$out/results.jsonl"
checkpoint=
work=$(mktemp -d)
# shellcheck source-path=SCRIPTDIR source=../../deploy/nibbled_lib.sh
source "$(dirname "$0")/../../deploy/nibbled_lib.sh"
trap 'stop_nibbled || true; rm -rf "$work"; [[ -z $checkpoint ]] || rm -f "$checkpoint"' EXIT

mkdir -p "$out"
: >"$results"

# The median of the numbers on stdin, one a line.
median() {
  sort -g | awk '{ v[NR] = $1 }
    END { print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# $1 bytes in $2 seconds, in GB/s.
rate() { awk -v b="$1" -v s="$2" 'BEGIN { printf "%.2f", b / 1e9 / s }'; }

# Runs the command after $1, its output into the file $1, and prints the
# seconds it took; stops the script when it fails.
timed() {
  local log=$1 start=$EPOCHREALTIME
  shift
  "$@" >"$log" 2>&1 || { echo "$0: $* failed; see $log" >&2; return 1; }
  awk -v a="$start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.3f", b - a }'
}

# Drops the checkpoint from the page cache; says so when pages stayed.
evict() {
  local report cached
  report=$("$bin/nibble-make-checkpoint" --evict="$checkpoint")
  cached=$(sed -n 's/.*: \([0-9]*\) of [0-9]* pages still cached$/\1/p' <<<"$report")
  [[ $cached == 0 ]] || echo "warning: $report: the run reads them from memory"
}

# The first number after "$1" on a line of the file $2.
number_after() {
  sed -n "s/.*$1 *\([0-9.]*\).*/\1/p" "$2" | head -1
}

for layout in "${layouts[@]}"; do
  checkpoint="$out/$layout.safetensors"
  echo "== $layout: writing about $(rate "$bytes" 1) GB to $checkpoint"
  made=$("$bin/nibble-make-checkpoint" --layout="$layout" --bytes="$bytes" \
    --out="$checkpoint")
  echo "$made"
  projections=$(sed -n 's/.*, \([0-9]*\) projections in.*/\1/p' <<<"$made")
  file_bytes=$(stat -c %s "$checkpoint")

  for run in $(seq "$runs"); do
    evict
    seconds=$(timed /dev/null cat "$checkpoint")
    echo "$seconds" >>"$work/read_$layout"
    printf '[%s] read %d/%d: %s s (%s GB/s)\n' "$layout" "$run" "$runs" \
      "$seconds" "$(rate "$file_bytes" "$seconds")"
  done

  for run in $(seq "$runs"); do
    # shellcheck disable=SC2119 # nibbled's default flags
    start_nibbled
    evict
    log="$out/import_${layout}_$run.log"
    seconds=$(timed "$log" "$bin/nibble" import --target="$target" \
      --file="$checkpoint" --quantize="$quantize")
    stop_nibbled
    echo "$seconds" >>"$work/import_$layout"
    # nibble's own split: checking every layer (PlanImport), then converting
    # and uploading them (ExecuteImport).
    number_after "layers in" "$log" >>"$work/check_$layout"
    number_after "time:" "$log" >>"$work/upload_$layout"
    printf '[%s] import %d/%d: %s s (%s GB/s): check %s s, convert+upload %s s\n' \
      "$layout" "$run" "$runs" "$seconds" "$(rate "$file_bytes" "$seconds")" \
      "$(tail -1 "$work/check_$layout")" "$(tail -1 "$work/upload_$layout")"
  done
  for run in $(seq "$runs"); do
    evict
    start=$EPOCHREALTIME
    start_nibbled --import="$checkpoint" --import_quantize="$quantize"
    seconds=$(awk -v a="$start" -v b="$EPOCHREALTIME" \
      'BEGIN { printf "%.3f", b - a }')
    stop_nibbled
    echo "$seconds" >>"$work/serve_$layout"
    printf '[%s] nibbled --import %d/%d: %s s (%s GB/s) until it listens\n' \
      "$layout" "$run" "$runs" "$seconds" "$(rate "$file_bytes" "$seconds")"
  done
  # The host memory the last start kept (none of what a GPU holds).
  resident=$(sed -n 's/.*msg="import done".* resident_bytes=\([0-9]*\).*/\1/p' \
    "$work/nibbled.err" | tail -1)
  for run in $(seq "$runs"); do
    if [[ ${resident:-0} -gt 0 ]]; then
      "$bin/nibble-make-checkpoint" --fresh_memory="$resident" |
        sed -n 's/.* in \([0-9.]*\) s .*/\1/p'
    else
      echo 0
    fi
  done >"$work/fresh_$layout"
  printf '[%s] fresh memory: %s bytes written in %s s\n' "$layout" \
    "${resident:-0}" "$(paste -sd' ' "$work/fresh_$layout")"
  rm -f "$checkpoint"
  checkpoint=

  read_s=$(median <"$work/read_$layout")
  import_s=$(median <"$work/import_$layout")
  check_s=$(median <"$work/check_$layout")
  upload_s=$(median <"$work/upload_$layout")
  serve_s=$(median <"$work/serve_$layout")
  awk -v layout="$layout" -v bytes="$file_bytes" -v projections="$projections" \
    -v read_s="$read_s" -v import_s="$import_s" -v check_s="$check_s" \
    -v upload_s="$upload_s" -v serve_s="$serve_s" -v runs="$runs" \
    -v fresh_min="$(sort -g "$work/fresh_$layout" | head -1)" \
    -v fresh_max="$(sort -g "$work/fresh_$layout" | tail -1)" \
    -v freshes="$(paste -sd, "$work/fresh_$layout")" \
    -v resident="${resident:-0}" \
    -v quantize="$quantize" \
    -v reads="$(paste -sd, "$work/read_$layout")" \
    -v imports="$(paste -sd, "$work/import_$layout")" \
    -v results="$results" -v table="$work/table" -v breakdown="$work/breakdown" 'BEGIN {
    ratio = import_s / read_s
    verdict = ratio < 2 ? "PASS" : "FAIL"
    serve_ratio = serve_s / read_s
    serve_verdict = serve_ratio < 2 ? "PASS" : "FAIL"
    printf "{\"layout\":\"%s\",\"quantize\":%s,\"file_bytes\":%d," \
      "\"projections\":%d,\"runs\":%d,\"read_s\":%.3f,\"read_gbps\":%.3f," \
      "\"import_s\":%.3f,\"import_gbps\":%.3f,\"check_s\":%.3f," \
      "\"convert_upload_s\":%.3f,\"ratio\":%.3f,\"target\":2," \
      "\"pass\":%s,\"read_runs_s\":[%s],\"import_runs_s\":[%s]," \
      "\"server_import_s\":%.3f,\"server_ratio\":%.3f,\"server_pass\":%s," \
      "\"server_resident_bytes\":%d,\"fresh_runs_s\":[%s]}\n",
      layout, layout == "float" ? "\"" quantize "\"" : "null", bytes, projections, runs,
      read_s, bytes / 1e9 / read_s, import_s, bytes / 1e9 / import_s, check_s,
      upload_s, ratio, verdict == "PASS" ? "true" : "false", reads,
      imports, serve_s, serve_ratio,
      serve_verdict == "PASS" ? "true" : "false", resident, freshes >>results
    printf "%-7s %7.2f %7.2f %7.2f %8.2f %8.2f %7s %9.2f %9.2f %7s %4.2f-%.2f\n",
      layout, bytes / 1e9, read_s, bytes / 1e9 / read_s, import_s, ratio,
      verdict, serve_s, serve_ratio, serve_verdict, fresh_min, fresh_max >>table
    printf "%-7s %8.2f %8.2f %14.2f %6.2f\n", layout, import_s, check_s,
      upload_s, import_s - check_s - upload_s >>breakdown
  }'
done

echo "== medians over $runs runs; float layers quantized as $quantize;" \
  "results in $results"
echo "   (target: under 2 x read; import = nibble import, serve = nibbled" \
  "--import until it listens; fresh = quickest-slowest write of the host" \
  "memory serve kept, alone, in a new process; 0 when it kept none)"
printf '%-7s %7s %7s %7s %8s %8s %7s %9s %9s %7s %7s\n' layout "file GB" \
  "read s" "GB/s" "import s" "imp/read" verdict "serve s" "serve/rd" verdict \
  "fresh s"
cat "$work/table"
echo "== where the import's time goes (medians; rest: process start, opening" \
  "the file, connecting, exit)"
printf '%-7s %8s %8s %14s %6s\n' layout "import s" "check s" \
  "convert+upl s" "rest s"
cat "$work/breakdown"
