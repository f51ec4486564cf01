#!/bin/bash
# The container image's entrypoint: nibbled behind HAProxy, its hardened
# HTTP/2 front (deploy/haproxy/nibble-front.cfg), or nibbled alone.
#
#   NIBBLE_FRONT=haproxy (default)  HAProxy serves NIBBLED_LISTEN (the public
#                                   gRPC address) and forwards to nibbled on
#                                   a Unix socket in a private directory
#                                   under $TMPDIR (/tmp), or on
#                                   127.0.0.1:NIBBLE_BACKEND_PORT when that
#                                   is set or no directory can be made
#   NIBBLE_FRONT=none               nibbled serves NIBBLED_LISTEN itself
#   NIBBLE_FRONT_TLS_PEM=FILE       with the front: TLS there, with the
#                                   certificate chain and key in FILE
#
# Arguments go to nibbled. SIGTERM and SIGINT go to nibbled, which drains;
# HAProxy keeps forwarding until nibbled has exited, then stops. The exit
# status is nibbled's, or 1 when HAProxy ended first.
set -uo pipefail

front=${NIBBLE_FRONT:-haproxy}
case "$front" in
  none) exec nibbled "$@" ;;
  haproxy) ;;
  *)
    echo "nibble-entrypoint: NIBBLE_FRONT=$front: use haproxy (the default)" \
      "or none" >&2
    exit 2
    ;;
esac
for argument in "$@"; do
  if [[ "$argument" == --listen || "$argument" == --listen=* ]]; then
    echo "nibble-entrypoint: $argument: behind the front, nibbled listens on" \
      "loopback; set the public address with NIBBLED_LISTEN instead, or run" \
      "without the front (NIBBLE_FRONT=none)" >&2
    exit 2
  fi
done

# A Unix socket costs HAProxy and nibbled less per frame than TCP on
# loopback, and only this user can reach nibbled around the front (mktemp -d
# makes the directory 0700).
socket_dir=
if [[ -z "${NIBBLE_BACKEND_PORT:-}" ]] &&
  socket_dir=$(mktemp -d "${TMPDIR:-/tmp}/nibble-front.XXXXXX" 2>/dev/null); then
  listen=unix:$socket_dir/nibbled.sock
  backend=unix@$socket_dir/nibbled.sock
else
  socket_dir=
  [[ -n "${NIBBLE_BACKEND_PORT:-}" ]] ||
    echo "nibble-entrypoint: no directory for nibbled's socket under" \
      "${TMPDIR:-/tmp} (read-only?); nibbled listens on 127.0.0.1:50052" >&2
  listen=127.0.0.1:${NIBBLE_BACKEND_PORT:-50052}
  backend=$listen
fi
trap '[[ -z "$socket_dir" ]] || rm -rf "$socket_dir"' EXIT
NIBBLED_LISTEN=$listen nibbled "$@" &
nibbled_pid=$!
NIBBLE_FRONT_LISTEN=${NIBBLED_LISTEN:-0.0.0.0:50051} \
  NIBBLE_FRONT_BACKEND=$backend haproxy -f /etc/nibble/front.cfg &
front_pid=$!
trap 'kill -TERM "$nibbled_pid" 2>/dev/null' TERM INT

# wait -n returns when either ends, or early for a trapped signal.
while kill -0 "$nibbled_pid" 2>/dev/null && kill -0 "$front_pid" 2>/dev/null; do
  wait -n "$nibbled_pid" "$front_pid"
done
if ! kill -0 "$front_pid" 2>/dev/null; then
  echo "nibble-entrypoint: HAProxy ended; stopping nibbled" >&2
  kill -TERM "$nibbled_pid" 2>/dev/null
  wait "$nibbled_pid"
  exit 1
fi
wait "$nibbled_pid"
status=$?
kill -USR1 "$front_pid" 2>/dev/null  # soft stop: no call is left to finish
wait "$front_pid"
exit "$status"
