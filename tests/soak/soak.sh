#!/usr/bin/env bash
# The soak: nibbled, built with sanitizers (NIBBLE_SANITIZE=address or
# thread), serves a steady open-loop load for SECONDS while weights are
# uploaded, checked and deleted beside it. It fails on any sanitizer report,
# any error reply, any wrong result (nibble-load --verify, nibble matmul
# --check), nibbled not exiting 0 on SIGTERM (leaks are reported at exit), or
# nibbled's resident memory growing past a bound after warm-up.
#
#   tests/soak/soak.sh build-asan/bin 600
#   SOAK_RATE=200 SOAK_OUT=build-asan/soak tests/soak/soak.sh build-asan/bin 30
#
# Knobs: SOAK_RATE, requests/s over both load instances (default 200);
# SOAK_RSS_SLACK_MIB, the least growth the memory bound allows (default 32);
# SOAK_BACKEND, nibbled's --backend (default: nibbled's own default); with
# cuda the GPUs' used memory is sampled and bounded too, with
# SOAK_GPU_SLACK_MIB (default 64) as the least growth it allows;
# SOAK_OUT, where the results go (default BIN_DIR/../soak): rss.csv and
# rss.svg (nibbled's VmRSS each second), gpu.csv and gpu.svg (with cuda),
# the nibble-load JSON, churn.log, nibbled's output and any sanitizer report
# (sanitizer.PID for nibbled, sanitizer-client.PID for the CLI and
# nibble-load).
#
#   SOAK_BACKEND=cuda tests/soak/soak.sh build/portable/bin 120   # make gpu-soak
set -euo pipefail

if [[ $# -ne 2 || ! "$2" =~ ^[0-9]+$ || "$2" -lt 10 ]]; then
  echo "usage: $0 BIN_DIR SECONDS (SECONDS >= 10)" >&2
  exit 2
fi
bin=$1
duration=$2
rate=${SOAK_RATE:-200}
out=${SOAK_OUT:-$bin/../soak}
backend=${SOAK_BACKEND:-}
backend_flags=()
[[ -n "$backend" ]] && backend_flags=(--backend="$backend")
# The CUDA kernels take f32 activations as bf16 (docs/architecture.md): the
# churn's f32 checks use the f16 and bf16 tolerance there.
check_flags=()
[[ "$backend" == cuda ]] && check_flags=(--tolerance=1e-2)
if [[ "$backend" == cuda ]] && ! command -v nvidia-smi >/dev/null; then
  echo "$0: SOAK_BACKEND=cuda samples GPU memory with nvidia-smi, which is" \
    "not on PATH" >&2
  exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)

mkdir -p "$out"
out=$(cd "$out" && pwd)
# Only what an earlier soak left: a stale report must not fail this one.
rm -rf "$out/data"
rm -f "$out"/sanitizer* "$out"/*.json "$out"/rss.* "$out"/gpu.* "$out"/churn.* \
  "$out"/nibbled.* "$out"/load-*.log "$out"/metrics.txt "$out"/summary.txt
work=$out # nibbled_lib.sh keeps nibbled.out and nibbled.err in $work
# shellcheck source-path=SCRIPTDIR source=../../deploy/nibbled_lib.sh
source "$here/../../deploy/nibbled_lib.sh"

bg_pids=()
cleanup() {
  local pid
  for pid in "${bg_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  stop_nibbled || true
}
trap cleanup EXIT

phase() { echo "== soak: $*"; }
failures=()
fail() { failures+=("$*"); echo "soak: FAIL: $*" >&2; }

# Every report goes to a file, so that none is lost in a log and the check at
# the end sees them all. Only the runtime the binary was built with reads its
# variable. A small ASan quarantine (the freed memory ASan holds back to catch
# use-after-free; 256 MiB by default) fills within seconds, so that RSS
# reaches its plateau during warm-up instead of climbing for minutes.
sanitizer_env() {
  local log=$1 lsan_supp='' tsan_supp=''
  [[ -f "$here/lsan.supp" ]] && lsan_supp=:suppressions=$here/lsan.supp
  [[ -f "$here/tsan.supp" ]] && tsan_supp=:suppressions=$here/tsan.supp
  export ASAN_OPTIONS="log_path=$log:halt_on_error=1:detect_leaks=1:\
quarantine_size_mb=16"
  export UBSAN_OPTIONS="log_path=$log:halt_on_error=1:print_stacktrace=1"
  export LSAN_OPTIONS="log_path=$log$lsan_supp"
  export TSAN_OPTIONS="log_path=$log:halt_on_error=0:second_deadlock_stack=1\
$tsan_supp"
}

phase "starting nibbled from $bin (results in $out)"
sanitizer_env "$out/sanitizer"
start_nibbled --data_dir="$out/data" --metrics_listen=127.0.0.1:0 \
  "${backend_flags[@]}"
metrics=$(sed -n 's|.*metrics at http://\([^/]*\)/metrics.*|\1|p' \
  "$out/nibbled.out")
sanitizer_env "$out/sanitizer-client"
echo "$(cat "$out/nibbled.out") (pid $server_pid)"

phase "uploading the steady weights"
"$bin/nibble" upload --target="$target" --name=steady-u4b8 --format=u4b8 \
  --k=1024 --n=1024 --group=128 --random=11 >/dev/null
"$bin/nibble" upload --target="$target" --name=steady-fp4 --format=fp4 \
  --k=1024 --n=512 --group=32 --random=12 >/dev/null

# nibbled's VmRSS, and with cuda the memory used on its GPUs (all of it,
# since nvidia-smi's per-process view does not see through PID namespaces),
# once a second in KiB, the clock starting with the load.
rss_kib() {
  awk '/^VmRSS:/ { print $2 }' "/proc/$server_pid/status" 2>/dev/null
}
gpu_kib() {
  nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits |
    awk '{ mib += $1 } END { print mib * 1024 }'
}
sample() {
  local name=$1 t0 now kib
  t0=${EPOCHREALTIME%.*}
  echo "seconds,${name}_kib" >"$out/$name.csv"
  while kill -0 "$server_pid" 2>/dev/null; do
    kib=$("${name}_kib") || break
    now=${EPOCHREALTIME%.*}
    [[ -n "$kib" ]] && echo "$((now - t0)),$kib" >>"$out/$name.csv"
    sleep 1
  done
}
memories=(rss)
[[ "$backend" == cuda ]] && memories+=(gpu)

# Once a second: a fresh weight of another shape and format, one matmul on
# it checked against the float64 reference, and its delete. The counts go to
# churn.counts at the end.
churn() {
  local end=$1 i=0 bad=0 formats=(u4b8 fp4 u4) dtypes=(f32 bf16 f16)
  local ks=(128 256 512) ns=(64 200 256) groups=(32 64 128) name started
  while ((${EPOCHREALTIME%.*} < end)); do
    started=$EPOCHREALTIME
    i=$((i + 1))
    name=churn-$i
    {
      echo "-- cycle $i: $name"
      "$bin/nibble" upload --target="$target" --name="$name" \
        --format="${formats[i % 3]}" --k="${ks[i % 3]}" \
        --n="${ns[(i / 3) % 3]}" --group="${groups[(i / 9) % 3]}" \
        --random=$((1000 + i)) &&
        "$bin/nibble" matmul --target="$target" --name="$name" \
          --m=$((1 + i % 7)) --dtype="${dtypes[(i / 2) % 3]}" \
          --random_input="$i" --check --random=$((1000 + i)) \
          "${check_flags[@]}" >/dev/null &&
        "$bin/nibble" delete --target="$target" --name="$name"
    } >>"$out/churn.log" 2>&1 || {
      bad=$((bad + 1))
      echo "-- cycle $i FAILED" >>"$out/churn.log"
    }
    # One cycle a second when the CLI is quick enough, else back to back.
    sleep "$(awk -v s="$started" -v n="$EPOCHREALTIME" \
      'BEGIN { r = 1 - (n - s); print (r > 0 ? r : 0) }')"
  done
  echo "$i $bad" >"$out/churn.counts"
}

phase "load: ${rate} requests/s open loop for ${duration}s (Matmul on" \
  "steady-u4b8, ModelInfer on steady-fp4, every 4th reply verified)" \
  "+ churn once a second"
for memory in "${memories[@]}"; do
  sample "$memory" &
  bg_pids+=($!)
done
churn $((${EPOCHREALTIME%.*} + duration)) &
churn_pid=$!
bg_pids+=("$churn_pid")
half=$(awk -v r="$rate" 'BEGIN { print r / 2 }')
"$bin/nibble-load" --target="$target" --name=steady-u4b8 --api=Matmul \
  --m=1 --dtype=f32 --rate="$half" --duration="$duration" --warmup=0 \
  --verify=4 --random=11 --json="$out/load-matmul.json" \
  >"$out/load-matmul.log" 2>&1 &
load1_pid=$!
bg_pids+=("$load1_pid")
"$bin/nibble-load" --target="$target" --name=steady-fp4 --api=ModelInfer \
  --m=4 --dtype=bf16 --rate="$half" --duration="$duration" --warmup=0 \
  --verify=4 --random=12 --json="$out/load-modelinfer.json" \
  >"$out/load-modelinfer.log" 2>&1 &
load2_pid=$!
bg_pids+=("$load2_pid")

wait "$load1_pid" || fail "nibble-load Matmul exited $? (load-matmul.log)"
wait "$load2_pid" || fail "nibble-load ModelInfer exited $? (load-modelinfer.log)"
wait "$churn_pid" || fail "the churn loop exited $?"
# One more RSS sample at the end of the load, then stop sampling.
sleep 1

# Every churn weight was deleted, so only the steady ones' files are left.
left=$(find "$out/data" -type f | wc -l)
((left == 2)) || fail "$left files in $out/data, not the 2 steady weights'"

phase "stopping nibbled (SIGTERM)"
# The metrics endpoint still answers after the soak (bash's /dev/tcp: no curl
# needed).
scrape_metrics() {
  exec 3<>"/dev/tcp/${metrics%:*}/${metrics##*:}" || return 1
  printf 'GET /metrics HTTP/1.0\r\nHost: %s\r\n\r\n' "$metrics" >&3
  cat <&3 >"$out/metrics.txt"
  exec 3<&-
  grep -q '^HTTP/1\.[01] 200' "$out/metrics.txt"
}
scrape_metrics || fail "no metrics from http://$metrics/metrics (metrics.txt)"
server_exit=0
stop_nibbled || server_exit=$?
((server_exit == 0)) || fail "nibbled exited $server_exit, not 0 (nibbled.err)"
wait

phase "checking"
reports=$(find "$out" -maxdepth 1 -name 'sanitizer*' -type f | sort)
if [[ -n "$reports" ]]; then
  while read -r report; do
    echo "---- $report"
    head -60 "$report"
  done <<<"$reports"
  fail "sanitizer reports: $(echo "$reports" | wc -l) file(s) in $out"
fi

# The first number after "KEY": in FILE. nibbled_lib.sh's json_number ends
# grep's pipe early, which pipefail turns into a failure once a long run's
# per-second series makes the JSON larger than a pipe's buffer.
json_first() {
  awk -v key="\"$1\": " '{
    i = index($0, key)
    if (i) { s = substr($0, i + length(key)); match(s, /^[-0-9.e+]+/)
             print substr(s, 1, RLENGTH); exit } }' "$2"
}

requests=0
verified=0
errors=0
for api in matmul modelinfer; do
  j=$out/load-$api.json
  if [[ ! -s "$j" ]]; then
    fail "nibble-load $api wrote no $j"
    continue
  fi
  e=$(json_first errors "$j")
  v=$(json_first verified "$j")
  ok=$(json_first requests_ok "$j")
  echo "nibble-load $api: $ok ok, $e errors, $v verified," \
    "$(json_first sent_rps "$j") sent/s"
  [[ "$e" == 0 ]] || fail "nibble-load $api: $e error replies ($j)"
  [[ "$v" -gt 0 ]] || fail "nibble-load $api: no reply verified"
  requests=$((requests + ${ok:-0} + ${e:-0}))
  verified=$((verified + ${v:-0}))
  errors=$((errors + ${e:-0}))
done

read -r cycles churn_failures <"$out/churn.counts" || cycles=0 churn_failures=1
((churn_failures == 0)) ||
  fail "churn: $churn_failures of $cycles cycles failed (churn.log)"
((cycles > 0)) || fail "churn: no cycle ran"

# Memory: after warm-up (the first 20 %, at least 5 s), the largest sample
# of the last quarter against the largest of the first quarter, with room
# for max(10 %, the slack). A leak of a request's buffers (4 KiB at 200
# requests/s is 0.8 MB/s) passes the default 32 MiB of RSS slack within a
# minute; allocator noise does not.
warmup=$((duration / 5 > 5 ? duration / 5 : 5))
declare -A title=([rss]="nibbled RSS" [gpu]="GPU memory used")
declare -A slack_mib=([rss]=${SOAK_RSS_SLACK_MIB:-32}
  [gpu]=${SOAK_GPU_SLACK_MIB:-64})
declare -A lines
# Checks and draws $out/NAME.csv; its summary line goes to lines[NAME].
check_memory() {
  local name=$1 start end base last bound growth
  read -r start end base last bound <<<"$(awk -F, -v w="$warmup" \
    -v d="$duration" -v min_slack="$((${slack_mib[$name]} * 1024))" \
    'NR > 1 && $1 >= w && $1 <= d {
      q = (d - w) / 4
      if (start == "") start = $2
      end = $2
      if ($1 < w + q && $2 > base) base = $2
      if ($1 >= d - q && $2 > last) last = $2
    }
    END {
      slack = base * 0.10 > min_slack ? base * 0.10 : min_slack
      printf "%d %d %d %d %d\n", start, end, base, last, base + slack
    }' "$out/$name.csv")"
  if ((base == 0 || last == 0)); then
    fail "too few ${title[$name]} samples after the ${warmup}s warm-up" \
      "($out/$name.csv)"
  elif ((last > bound)); then
    fail "${title[$name]} grew: largest of the last quarter" \
      "$((last / 1024)) MiB > $((bound / 1024)) MiB (first quarter's" \
      "$((base / 1024)) MiB + slack)"
  fi
  plot_memory "$name" "$bound" >"$out/$name.svg"
  growth=$(awk -v a="$base" -v b="$last" \
    'BEGIN { printf "%+.1f", a ? (b - a) * 100 / a : 0 }')
  lines[$name]="${title[$name]} after the ${warmup}s warm-up: \
$((start / 1024)) MiB, at end: $((end / 1024)) MiB; largest first quarter \
$((base / 1024)) MiB, last quarter $((last / 1024)) MiB ($growth %, bound \
$((bound / 1024)) MiB)"
}

# The memory curve, for people: a polyline of NAME (MiB) over seconds, the
# warm-up's end and the bound (KiB) drawn in.
plot_memory() {
  awk -F, -v w="$warmup" -v bound="$2" -v title="${title[$1]}" 'NR > 1 {
    t[n] = $1; r[n] = $2 / 1024; n++
    if ($1 > tmax) tmax = $1
    if ($2 / 1024 > rmax) rmax = $2 / 1024
  }
  END {
    if (bound / 1024 > rmax) rmax = bound / 1024
    if (tmax == 0) tmax = 1
    rmax *= 1.1
    W = 800; H = 400; L = 60; B = 40
    sx = (W - L - 20) / tmax; sy = (H - B - 20) / rmax
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<rect width=\"%d\" height=\"%d\" fill=\"white\"/>\n", W, H
    printf "<text x=\"%d\" y=\"14\">%s (MiB) over the soak (s)</text>\n", L, title
    printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, H - B, W - 20, H - B
    printf "<line x1=\"%d\" y1=\"20\" x2=\"%d\" y2=\"%d\" stroke=\"black\"/>\n", L, L, H - B
    for (i = 0; i <= 4; i++) {
      y = H - B - i * rmax / 4 * sy
      printf "<text x=\"5\" y=\"%.1f\">%.0f</text>\n", y + 4, i * rmax / 4
      x = L + i * tmax / 4 * sx
      printf "<text x=\"%.1f\" y=\"%d\">%.0f</text>\n", x - 8, H - B + 16, i * tmax / 4
    }
    x = L + w * sx
    printf "<line x1=\"%.1f\" y1=\"20\" x2=\"%.1f\" y2=\"%d\" stroke=\"gray\" stroke-dasharray=\"4\"/>\n", x, x, H - B
    printf "<text x=\"%.1f\" y=\"32\" fill=\"gray\">warm-up</text>\n", x + 4
    y = H - B - bound / 1024 * sy
    printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"red\" stroke-dasharray=\"4\"/>\n", L, y, W - 20, y
    printf "<text x=\"%d\" y=\"%.1f\" fill=\"red\">bound</text>\n", W - 60, y - 4
    printf "<polyline fill=\"none\" stroke=\"steelblue\" stroke-width=\"1.5\" points=\""
    for (i = 0; i < n; i++) printf "%.1f,%.1f ", L + t[i] * sx, H - B - r[i] * sy
    printf "\"/>\n</svg>\n"
  }' "$out/$1.csv"
}

for memory in "${memories[@]}"; do check_memory "$memory"; done
{
  echo "soak: ${duration}s at ${rate} requests/s${backend:+, --backend=$backend}"
  echo "requests: $requests, verified: $verified, errors: $errors"
  echo "churn cycles: $cycles (upload + checked matmul + delete), failed:" \
    "$churn_failures"
  for memory in "${memories[@]}"; do echo "${lines[$memory]}"; done
  echo "nibbled exit status: $server_exit; sanitizer reports:" \
    "$(echo -n "$reports" | grep -c . || true)"
  echo "memory curves: $(for memory in "${memories[@]}"; do
    echo -n "$out/$memory.csv, $out/$memory.svg "; done)"
} | tee "$out/summary.txt"

if ((${#failures[@]} > 0)); then
  echo "soak: FAILED:" >&2
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
echo "soak: PASSED"
