#!/usr/bin/env bash
# Copies nibbled, nibble, nibble-load and nibble-make-checkpoint with every
# shared library they load, the dynamic loader included, into one folder that
# runs on any x86-64 Linux machine, one without gRPC or abseil too (a GPU
# machine reached through the device tool, say): bin/ holds a wrapper per
# program that starts it through the bundled loader. bench/checkpoint/import_bench.sh and
# bench/server/gpu_serve_bench.sh take OUT_DIR/bin as their BIN_DIR.
#
#   deploy/portable-bundle.sh [BIN_DIR] [OUT_DIR]   (build/bin, build/portable)
set -euo pipefail

bin=${1:-build/bin}
out=${2:-build/portable}
programs=(nibbled nibble nibble-load nibble-make-checkpoint)
loader=$(ldd "$bin/nibbled" | awk '/ld-linux/ { print $1 }')
[[ -f $loader ]] || { echo "$0: no dynamic loader found for $bin/nibbled" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/programs" "$out/lib"
for program in "${programs[@]}"; do
  [[ -x $bin/$program ]] || { echo "$0: no $bin/$program: build it first" >&2; exit 1; }
  cp "$bin/$program" "$out/programs/"
  ldd "$bin/$program" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
    xargs -r cp -Ln -t "$out/lib/"
  cat >"$out/bin/$program" <<WRAPPER
#!/bin/sh
# $program through the loader and libraries beside it (portable-bundle.sh).
here=\$(dirname "\$0")/..
exec "\$here/lib/$(basename "$loader")" --library-path "\$here/lib" \\
  "\$here/programs/$program" "\$@"
WRAPPER
  chmod +x "$out/bin/$program"
done
cp -L "$loader" "$out/lib/"
strip "$out"/programs/* "$out"/lib/*.so* 2>/dev/null || true
echo "$out: ${programs[*]} and $(find "$out/lib" -type f | wc -l) libraries, $(du -sh "$out" | cut -f1)"
