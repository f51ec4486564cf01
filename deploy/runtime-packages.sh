#!/usr/bin/env bash
# Prints the Debian (or Ubuntu) packages holding the shared libraries that the
# given binaries load, one per line: what a runtime image must install to run
# them. A library no package holds (say, one copied in by hand) is an error.
#
#   deploy/runtime-packages.sh build/bin/nibbled build/bin/nibble
set -euo pipefail

(($# > 0)) || { echo "usage: $0 BINARY..." >&2; exit 2; }

ldd "$@" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u |
  while read -r library; do
    real=$(realpath "$library")
    # With merged /usr a package may have registered the file under /lib.
    dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || {
      echo "runtime-packages: no package holds $library" >&2
      exit 1
    }
  done | cut -d: -f1 | sort -u
