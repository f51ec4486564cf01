#!/usr/bin/env bash
# Builds abseil with ThreadSanitizer for `make soak SOAK_SANITIZER=thread`.
# Debian's abseil is not instrumented, so TSan cannot see its mutexes and
# reports every access they guard. This builds Debian's own source package of
# the installed libabsl-dev version: the shared libraries it leaves in
# OUT_DIR/lib have the system's names and ABI, and LD_LIBRARY_PATH puts them
# under nibbled and the gRPC it loads. Done once per version (a stamp file
# records it); about two minutes on two cores.
#
#   deploy/tsan-deps.sh build-tsan-deps
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: $0 OUT_DIR" >&2
  exit 2
fi
out=$1
version=$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null) || {
  echo "tsan-deps: libabsl-dev is not installed (make deps installs it)" >&2
  exit 1
}
stamp=$out/lib/abseil.version
if [[ -f "$stamp" && "$(cat "$stamp")" == "$version" ]]; then
  echo "tsan-deps: abseil $version with TSan already in $out/lib"
  exit 0
fi

sudo=()
((EUID == 0)) || sudo=(sudo)
# apt-get source needs the source indexes: the same mirrors and suites as the
# binary packages, in a list of our own.
if ! apt-cache showsrc abseil >/dev/null 2>&1; then
  echo "tsan-deps: adding deb-src entries for the configured Debian mirrors"
  if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
    sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
      "${sudo[@]}" tee /etc/apt/sources.list.d/nibble-deb-src.sources >/dev/null
  else
    sed -n 's/^deb /deb-src /p' /etc/apt/sources.list |
      "${sudo[@]}" tee /etc/apt/sources.list.d/nibble-deb-src.list >/dev/null
  fi
  "${sudo[@]}" apt-get update -qq
fi

rm -rf "$out/src" "$out/build" "$out/lib"
mkdir -p "$out/src" "$out/lib"
echo "tsan-deps: fetching the source of abseil $version"
(cd "$out/src" && apt-get source -qq --only-source "abseil=$version" \
  >/dev/null 2>&1) || {
  echo "tsan-deps: apt-get source abseil=$version failed; is dpkg-dev" \
    "installed and the source package on the mirror?" >&2
  exit 1
}
source_dir=$(find "$out/src" -mindepth 1 -maxdepth 1 -type d | head -n 1)

echo "tsan-deps: building abseil $version with -fsanitize=thread"
# Debian's own flags for its shared build, plus TSan.
cmake -S "$source_dir" -B "$out/build" -G Ninja \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_STANDARD=17 \
  -DBUILD_SHARED_LIBS=ON -DCMAKE_CXX_FLAGS=-fsanitize=thread \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread >"$out/configure.log" 2>&1 || {
  echo "tsan-deps: configuring failed; see $out/configure.log" >&2
  exit 1
}
cmake --build "$out/build" -j "$(nproc)" >"$out/build.log" 2>&1 || {
  echo "tsan-deps: building failed; see $out/build.log" >&2
  exit 1
}
find "$out/build" -name 'libabsl_*.so*' -exec cp -a {} "$out/lib/" \;
echo "$version" >"$stamp"
echo "tsan-deps: $(find "$out/lib" -name 'libabsl_*.so.*' -type f | wc -l)" \
  "instrumented abseil libraries in $out/lib"
