# Shell helpers for scripts that run their own nibbled on loopback (the demo
# and the benchmarks); source it after setting $bin (the binaries) and $work
# (a scratch directory).
#
#   start_nibbled [FLAGS...]   # sets $server_pid and $target (HOST:PORT)
#   stop_nibbled               # SIGTERM, waits, returns nibbled's exit status
#                              # (0 when none runs)
#   json_number KEY FILE       # the first number after "KEY": in FILE

server_pid=

start_nibbled() {
  "$bin/nibbled" --listen=127.0.0.1:0 "$@" >"$work/nibbled.out" \
    2>"$work/nibbled.err" &
  server_pid=$!
  target=
  # Polled every 20 ms, for up to a minute: a start that imports a
  # checkpoint (--import) takes seconds, and the import bench times it.
  for _ in $(seq 3000); do
    grep -q "listening on" "$work/nibbled.out" 2>/dev/null && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$work/nibbled.err" >&2; exit 1; }
    sleep 0.02
  done
  target=$(sed -n 's/^nibbled: listening on \([^ ]*\).*/\1/p' "$work/nibbled.out")
  [[ -n "$target" ]] || { echo "$0: nibbled did not start" >&2; exit 1; }
}

stop_nibbled() {
  local status=0
  if [[ -n "$server_pid" ]] && kill -0 "$server_pid" 2>/dev/null; then
    # A server paused with SIGSTOP would never see the SIGTERM.
    kill -CONT "$server_pid" 2>/dev/null || true
    kill -TERM "$server_pid"
    wait "$server_pid" || status=$?
  fi
  server_pid=
  return "$status"
}

json_number() {
  grep -o "\"$1\": [-0-9.e+]*" "$2" | head -1 | sed 's/.*: //'
}
