#!/usr/bin/env bash
# Builds nibble's container image with podman and proves it serves: starts it
# with a read-only root filesystem and a data volume, waits for its
# HEALTHCHECK, uploads a weight and runs nibble-load (with --verify) through
# the published port and the HAProxy front, runs the short forms of the
# hostile-client scenarios the front is for (tests/hostile/, --target: rapid
# reset, CONTINUATION flood, a bad -bin header) against it with the image's
# own client tools, replaces the container with a
# bare one (NIBBLE_FRONT=none) on the same volume and checks the weight is
# still served, runs deploy/compose.yaml with podman-compose, then removes
# what it started.
# The image stays, as localhost/nibble:latest.
#
# Needs root, podman, podman-compose, debootstrap and python3-h2
# (deploy/install-deps.sh container test). The
# Debian base image is made locally with debootstrap when missing, so nothing
# is pulled from a registry. Settings: DEBIAN_MIRROR, CONTAINER_TEST_IMAGE.
set -euo pipefail
# Pipelines into grep below read the whole input (grep >/dev/null, not grep -q):
# under pipefail, grep -q exiting at its first match fails the writer with
# SIGPIPE ("curl: (23) Failed writing body").
cd "$(dirname "$0")/.."

image=${CONTAINER_TEST_IMAGE:-localhost/nibble:latest}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
base_image=localhost/debian:bookworm
run_id=nibble-test-$$
volume=$run_id-data
weight=container-test
started=$SECONDS

step() { printf 'container-test [%3ds]: %s\n' $((SECONDS - started)) "$*"; }
fail() {
  echo "container-test: FAILED: $*" >&2
  exit 1
}

((EUID == 0)) || fail "run as root: the test uses rootful podman"
for tool in podman podman-compose debootstrap; do
  command -v "$tool" >/dev/null ||
    fail "$tool is missing: run deploy/install-deps.sh container"
done

work=$(mktemp -d)
compose=(true)
cleanup() {
  podman rm -f -t 0 "$run_id-1" "$run_id-2" "$run_id-tools" >/dev/null 2>&1 ||
    true
  podman volume rm -f "$volume" >/dev/null 2>&1 || true
  # The load job's container gets an anonymous volume (the image's VOLUME),
  # which podman-compose's down leaves behind.
  podman ps -a -q --filter "label=io.podman.compose.project=$run_id" |
    xargs -r podman rm -f -v >/dev/null 2>&1 || true
  "${compose[@]}" down -v >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

# Rootful podman with the runc runtime and the cgroupfs manager (no systemd
# here). Its default ulimits are above what this sandbox lets runc set, so
# they come down to ones it can.
nofile=$(ulimit -Hn)
((nofile > 65536)) && nofile=65536
cat >"$work/containers.conf" <<EOF
[containers]
default_ulimits = ["nofile=$nofile:$nofile", "nproc=4096:4096"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
EOF
export CONTAINERS_CONF=$work/containers.conf

if ! podman image exists "$base_image"; then
  step "making the Debian bookworm base image with debootstrap ($mirror)"
  debootstrap --variant=minbase bookworm "$work/rootfs" "$mirror" \
    >"$work/debootstrap.log" 2>&1 || {
    tail -20 "$work/debootstrap.log" >&2
    fail "debootstrap could not build the base image"
  }
  # What debootstrap downloaded is not part of the system.
  rm -rf "$work/rootfs/var/cache/apt/archives/"*.deb \
    "$work/rootfs/var/lib/apt/lists/"*
  tar -C "$work/rootfs" -c . | podman import -q - "$base_image" >/dev/null
  rm -rf "$work/rootfs"
fi
# The build stage starts from bookworm, the runtime stage from bookworm-slim;
# the minimal debootstrap image serves as both.
podman tag "$base_image" localhost/debian:bookworm-slim

step "building $image from deploy/Dockerfile"
# The docker format keeps the HEALTHCHECK, which OCI images cannot carry.
podman build --pull=never --format docker -f deploy/Dockerfile -t "$image" . \
  >"$work/build.log" 2>&1 || {
  tail -40 "$work/build.log" >&2
  fail "the image did not build (log above)"
}
podman image prune -f >/dev/null
step "built: $(podman image inspect --format '{{.Size}}' "$image" |
  awk '{printf "%.0f MB", $1 / 1e6}')"

user=$(podman image inspect --format '{{.Config.User}}' "$image")
[[ "$user" == 10001:10001 ]] || fail "the image runs as \"$user\", not 10001"
dev_packages=$(podman run --rm --no-healthcheck --entrypoint dpkg-query "$image" \
  -W -f='${Package}\n' | grep -E -- '-dev$|^(gcc|g\+\+|cpp|cmake|ninja-build)(-[0-9]+)?$' || true)
[[ -z "$dev_packages" ]] ||
  fail "the runtime image holds build packages: $dev_packages"

step "a misspelled NIBBLED_ variable must stop nibbled with a usage error"
status=0
podman run --rm --no-healthcheck -e NIBBLED_THREDS=2 "$image" >"$work/bad-env.out" 2>&1 ||
  status=$?
if ((status != 2)) ||
  ! grep -q "NIBBLED_THREDS: there is no flag" "$work/bad-env.out"; then
  fail "nibbled with NIBBLED_THREDS=2 exited $status: $(cat "$work/bad-env.out")"
fi
step "behind the front, a --listen argument must be refused with a usage error"
status=0
podman run --rm --no-healthcheck "$image" --listen=0.0.0.0:1 \
  >"$work/listen.out" 2>&1 || status=$?
if ((status != 2)) || ! grep -q "NIBBLED_LISTEN instead" "$work/listen.out"; then
  fail "the image with --listen exited $status: $(cat "$work/listen.out")"
fi

podman volume create "$volume" >/dev/null

# Starts container $1 on the volume with NIBBLE_FRONT=$2 (haproxy: nibbled
# behind the front on a Unix socket under /tmp, podman's tmpfs there; none:
# bare), with a read-only root filesystem
# as on Kubernetes, and waits until its HEALTHCHECK passes; sets $target and
# $metrics to the published addresses. Without systemd podman cannot run the
# HEALTHCHECK on a timer (it says so on stderr), so the test runs it.
start_container() {
  local name=$1 front=$2 listen=0.0.0.0:50051
  [[ "$front" == none ]] || listen='unix:/tmp/nibble-front\.[^/ ]*/nibbled\.sock'
  podman run -d --name "$name" --read-only -e NIBBLED_THREADS=2 \
    -e NIBBLE_FRONT="$front" \
    -p 127.0.0.1::50051 -p 127.0.0.1::9464 \
    -v "$volume:/var/lib/nibble" "$image" >/dev/null 2>"$work/run.err" || {
    cat "$work/run.err" >&2
    fail "$name did not start"
  }
  target=$(podman port "$name" 50051/tcp)
  metrics=$(podman port "$name" 9464/tcp)
  for _ in $(seq 60); do
    podman healthcheck run "$name" >/dev/null 2>&1 && break
    [[ "$(podman inspect --format '{{.State.Running}}' "$name")" == true ]] || {
      podman logs "$name" >&2
      fail "$name exited before it was healthy"
    }
    sleep 1
  done
  podman healthcheck run "$name" >/dev/null 2>&1 || {
    podman logs "$name" >&2
    fail "$name was not healthy within 60 s"
  }
  podman logs "$name" 2>/dev/null |
    grep "listening on $listen (.*, 2 threads" >/dev/null ||
    fail "$name: nibbled is not listening on $listen with --threads from" \
      "NIBBLED_THREADS: $(podman logs "$name")"
  step "$name healthy (front: $front), serving on $target, metrics on $metrics"
}

# The image's own tools, on the host's network, reach nibbled through the
# published port.
tool() {
  local program=$1
  shift
  podman run --rm --no-healthcheck --network=host --entrypoint "$program" \
    "$image" \
    "$@" --target="$target"
}

# nibble-load against the weight with every 10th reply checked against the
# float64 reference; fails on any error or wrong result.
load_and_verify() {
  tool nibble-load --name="$weight" --m=4 --concurrency=4 --duration=3 \
    --warmup=0.5 --verify=10 --random=7 --json=/dev/stderr \
    >"$work/load.out" 2>"$work/load.json" || {
    cat "$work/load.out" "$work/load.json" >&2
    fail "nibble-load failed"
  }
  grep -q '"errors": 0,' "$work/load.json" || {
    cat "$work/load.out" >&2
    fail "nibble-load saw errors or wrong results"
  }
  step "nibble-load: $(grep -E '^(throughput|verified):' "$work/load.out" |
    tr -s ' ' | paste -sd ';' | sed 's/;/; /')"
}

start_container "$run_id-1" haproxy
step "uploading a 2048x2048 u4b8 weight, group 128"
tool nibble upload --name="$weight" --format=u4b8 --k=2048 --n=2048 \
  --group=128 --random=7 >/dev/null
load_and_verify
curl -fsS "http://$metrics/metrics" | grep '^nibble_weights 1$' >/dev/null ||
  fail "/metrics does not report the one resident weight"

step "hostile clients through the front: $(tests/hostile/hostile_test.py \
  --list --target="$target" | paste -sd ' ')"
# The image's own client tools, run on the host, are the scenarios' CLI and
# bystander.
podman create --name "$run_id-tools" "$image" >/dev/null
mkdir -p "$work/bin"
for program in nibble nibble-load; do
  podman cp "$run_id-tools:/usr/local/bin/$program" "$work/bin/"
done
podman rm "$run_id-tools" >/dev/null
tests/hostile/hostile_test.py --target="$target" --bin_dir="$work/bin" \
  --scratch="$work/hostile" --p99_ms=1000 >"$work/hostile.log" 2>&1 || {
  cat "$work/hostile.log" >&2
  fail "a hostile-client scenario through the front failed (log above)"
}
step "$(grep -c ' survived ' "$work/hostile.log") hostile-client scenarios" \
  "survived through the front"

step "replacing the container with a bare one on the same volume"
podman stop -t 30 "$run_id-1" >/dev/null 2>>"$work/podman.err"
exit_code=$(podman inspect --format '{{.State.ExitCode}}' "$run_id-1")
((exit_code == 0)) || fail "nibbled exited $exit_code on SIGTERM, not 0"
podman rm "$run_id-1" >/dev/null 2>>"$work/podman.err"
start_container "$run_id-2" none
tool nibble list | grep "^$weight " >/dev/null ||
  fail "the new container does not serve the uploaded weight"
load_and_verify

step "deploy/compose.yaml with podman-compose: nibbled and the load job"
compose=(podman-compose -p "$run_id" -f deploy/compose.yaml)
# Free host ports, so a busy 50051 or 9464 on this machine cannot fail the run.
read -r grpc_port metrics_port < <(python3 -c '
import socket
held = [socket.socket() for _ in range(2)]
for s in held:
    s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in held))')
NIBBLE_GRPC_PORT=$grpc_port NIBBLE_METRICS_PORT=$metrics_port \
  LOAD_DURATION=3 "${compose[@]}" up --abort-on-container-exit \
  >"$work/compose.log" 2>&1 || true
if ! grep -q "^errors: *none" "$work/compose.log" ||
  ! grep -q "^verified: .* 0 wrong" "$work/compose.log"; then
  cat "$work/compose.log" >&2
  fail "the compose load job did not finish without errors"
fi
step "compose load job: $(grep -E '^throughput:' "$work/compose.log" | tr -s ' ')"

step "passed"
