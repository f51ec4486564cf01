#!/usr/bin/env bash
# Installs nibble's dependencies from Debian packages, by group:
#   build       compilers and the libraries nibble links (the container image's
#               build stage needs only these)
#   test        GoogleTest and what the tests and benchmarks add (python3-h2
#               and python3-protobuf: the hostile-client tests' raw HTTP/2;
#               python3-grpcio and python3-numpy: the Python client's tests;
#               haproxy: the HTTP/2 front they and `make load-bench` run)
#   container   podman, podman-compose and debootstrap for `make container-test`
#   k8s         kubectl (for kustomize) and node/npm for `make k8s-check`
#   fuzz        clang and its libFuzzer and sanitizer runtimes for `make fuzz`
# With no group: build and test. Idempotent: when every package is present it
# only checks, in well under a second. Runs apt-get as root, or through sudo.
#
#   deploy/install-deps.sh                  # what `make test` needs
#   deploy/install-deps.sh build container  # several groups
set -euo pipefail

declare -A groups=(
  [build]="build-essential cmake ninja-build pkg-config libgrpc++-dev
           libgrpc-dev protobuf-compiler-grpc libprotobuf-dev
           protobuf-compiler libabsl-dev libopenblas-dev libcpp-httplib-dev
           nlohmann-json3-dev"
  [test]="googletest libgtest-dev libgmock-dev python3-h2 python3-protobuf
          python3-grpcio python3-numpy haproxy"
  [container]="podman podman-compose buildah debootstrap runc netavark
               aardvark-dns iptables uidmap"
  [k8s]="kubernetes-client nodejs npm"
  [fuzz]="clang libclang-rt-14-dev"
)

wanted=("$@")
((${#wanted[@]} > 0)) || wanted=(build test)
packages=()
for group in "${wanted[@]}"; do
  [[ -n "${groups[$group]:-}" ]] || {
    echo "install-deps: no group \"$group\"; the groups are: ${!groups[*]}" >&2
    exit 2
  }
  # -d '': the whole list, across its lines (read stops at the missing NUL).
  read -r -d '' -a members <<<"${groups[$group]}" || true
  packages+=("${members[@]}")
done

# A tool installed some other way (kubectl from Kubernetes' repository, npm
# with NodeSource's Node.js) counts as its package being present.
declare -A commands=([kubernetes-client]=kubectl [nodejs]=node [npm]=npm)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] && continue
  command -v "${commands[$package]:-/nonexistent}" >/dev/null && continue
  missing+=("$package")
done

if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#packages[@]} packages of ${wanted[*]} present"
  exit 0
fi

sudo=()
if ((EUID != 0)); then
  command -v sudo >/dev/null || {
    echo "install-deps: need root (or sudo) to install: ${missing[*]}" >&2
    exit 1
  }
  sudo=(sudo)
fi

echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
