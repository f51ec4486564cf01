#!/usr/bin/env bash
# The rooms' one-way doors: each room includes only itself and the rooms
# below it, and nothing below server/ and client/ sees gRPC or protobuf.
# Prints every wrong-way include and fails on the first run that has one.
#   base → format → kernels → checkpoint → server, client; bench/ times
#   the rooms up to checkpoint/; clients/ (the Python client's build-time
#   format-table writer) sees base/ and format/; proto/ holds no C++ of its
#   own.
set -u
cd "${1:?usage: layering_test.sh SOURCE_DIR}" || exit 2

# The rooms each room may include, besides third-party headers.
declare -A allowed=(
  [base]="base"
  [format]="base format"
  [kernels]="base format kernels"
  [checkpoint]="base format kernels checkpoint"
  [server]="base format kernels checkpoint server proto"
  [client]="base format kernels checkpoint client proto"
  [bench]="base format kernels checkpoint bench"
  [clients]="base format"
)
rooms="base format kernels checkpoint server client bench proto"
# Headers of gRPC, protobuf and the generated contract.
rpc_headers='^(grpc|grpcpp|google/protobuf|nibble/v1|inference|grpc/health)/'

wrong=0
for room in "${!allowed[@]}"; do
  while IFS=: read -r file line include; do
    target=$(sed -E 's/.*#include "([^"]+)".*/\1/' <<<"$include")
    top=${target%%/*}
    if [[ " $rooms " == *" $top "* && " ${allowed[$room]} " != *" $top "* ]]; then
      echo "$file:$line: $room/ includes $target: $room/ may include only ${allowed[$room]}"
      wrong=1
    fi
    if [[ " server client " != *" $room "* ]] &&
        grep -qE "$rpc_headers" <<<"$target"; then
      echo "$file:$line: $room/ includes $target: no gRPC or protobuf below server/ and client/"
      wrong=1
    fi
  done < <(grep -rnE '^#include "' "$room" --include='*.h' --include='*.cc' \
             --include='*.cu' --include='*.cuh' --include='*.inc')
done

if compgen -G 'proto/**/*.cc' >/dev/null || compgen -G 'proto/*.cc' >/dev/null ||
    compgen -G 'proto/*.h' >/dev/null; then
  echo "proto/ holds C++: it is for .proto files and their generated library only"
  ls proto/*.cc proto/*.h 2>/dev/null
  wrong=1
fi

if [ "$wrong" -ne 0 ]; then
  echo "1 failed"
  exit 1
fi
echo "layering: every include goes one way"
