#!/usr/bin/env bash
# Makes the test certificates in this directory: a CA, a server certificate
# for localhost and 127.0.0.1, a client certificate from the same CA, and a
# client certificate from another CA that the server must refuse. Valid for
# 100 years; for tests only, never for a real deployment.
set -euo pipefail
cd "$(dirname "$0")"
days=36500

make_ca() {  # NAME
  openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "/CN=$1" \
    -keyout "$1.key" -out "$1.pem" 2>/dev/null
}

make_leaf() {  # NAME CA EXTENSIONS
  openssl req -newkey rsa:2048 -nodes -subj "/CN=$1" -keyout "$1.key" \
    -out "$1.csr" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" \
    -CAcreateserial -days "$days" -extfile <(printf '%s\n' "$3") \
    -out "$1.pem" 2>/dev/null
  rm "$1.csr"
}

make_ca ca
make_ca other_ca
make_leaf server ca "subjectAltName=DNS:localhost,IP:127.0.0.1
extendedKeyUsage=serverAuth"
make_leaf client ca "extendedKeyUsage=clientAuth"
make_leaf rogue_client other_ca "extendedKeyUsage=clientAuth"
rm -f ca.key other_ca.key ./*.srl
