#!/bin/sh
# The run stage of nibble's images (deploy/Dockerfile, deploy/Dockerfile.cuda):
# installs the packages the build stage listed in /tmp/runtime-packages (see
# runtime-packages.sh) and those named as arguments (haproxy, the front),
# then adds the user nibble (uid and gid 10001) and its data directory,
# /var/lib/nibble.
#
#   /tmp/image-runtime-setup.sh [PACKAGE...]
set -eu
apt-get update -qq
# shellcheck disable=SC2046  # one package a line, none with a space
apt-get install -y -qq --no-install-recommends $(cat /tmp/runtime-packages) "$@"
apt-get clean
rm -rf /var/lib/apt/lists/* /tmp/runtime-packages
groupadd --system --gid 10001 nibble
useradd --system --uid 10001 --gid nibble --no-create-home \
  --home-dir /var/lib/nibble --shell /usr/sbin/nologin nibble
install -d -o nibble -g nibble /var/lib/nibble
