#!/usr/bin/env bash
# Render every kustomization under deploy/k8s (base + overlays) and validate
# the result against the Kubernetes schemas (validate/validate.mjs); then
# prove the validator bites: each validate/testdata/*.yaml fixture must be
# rejected with the error named on its "# expect:" line.
#
# Needs kubectl (built-in kustomize) and node + npm. Runs from any directory.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
validator="$here/validate"

for tool in kubectl node npm; do
  command -v "$tool" >/dev/null 2>&1 || { echo "check: missing tool: $tool" >&2; exit 1; }
done

# Install the validator's pinned packages once (package-lock.json); a later
# run finds node_modules and skips this. The marker is written last, so an
# interrupted install is redone.
if [[ ! -f "$validator/node_modules/.nibble-installed" \
   || "$validator/package-lock.json" -nt "$validator/node_modules/.nibble-installed" ]]; then
  echo "check: npm ci (validator packages)"
  (cd "$validator" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  touch "$validator/node_modules/.nibble-installed"
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# Positive checks: base and every overlay render cleanly and validate.
targets=("$here/base")
for overlay in "$here"/overlays/*/; do
  targets+=("${overlay%/}")
done
for target in "${targets[@]}"; do
  name="${target#"$here"/}"
  echo "check: render + validate $name"
  # kustomize warnings (e.g. deprecated fields) go to stderr: treat as errors.
  out="${name//\//-}.yaml"   # overlays/gpu -> overlays-gpu.yaml, named in errors
  if ! kubectl kustomize "$target" >"$tmp/$out" 2>"$tmp/err" || [[ -s "$tmp/err" ]]; then
    cat "$tmp/err" >&2
    echo "check: FAILED: kubectl kustomize $name" >&2
    exit 1
  fi
  if ! (cd "$tmp" && node "$validator/validate.mjs" "$out") | sed 's/^/  /'; then
    echo "check: FAILED: $name does not validate" >&2
    exit 1
  fi
done

# Negative checks: each broken fixture must be rejected, for the right reason.
fixtures=0
for fixture in "$validator"/testdata/*.yaml; do
  name="${fixture#"$here"/}"
  expect="$(sed -n 's/^# expect: //p' "$fixture")"
  [[ -n "$expect" ]] || { echo "check: FAILED: $name has no '# expect:' line" >&2; exit 1; }
  echo "check: must reject $name"
  if node "$validator/validate.mjs" "$fixture" >"$tmp/neg" 2>&1; then
    cat "$tmp/neg" >&2
    echo "check: FAILED: validator accepted $name" >&2
    exit 1
  fi
  if ! grep -qF -- "$expect" "$tmp/neg"; then
    cat "$tmp/neg" >&2
    echo "check: FAILED: $name rejected, but not with: $expect" >&2
    exit 1
  fi
  fixtures=$((fixtures + 1))
done
(( fixtures > 0 )) || { echo "check: FAILED: no fixtures in validate/testdata" >&2; exit 1; }

echo "check: OK: ${#targets[@]} kustomizations valid, $fixtures broken fixtures rejected"
