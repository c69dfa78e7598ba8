#!/usr/bin/env bash
# Fails, naming the files, when package/crds (or the folder given) is not
# what controller-gen makes of the API types in apis/ (the tree is left
# untouched): a package built from stale CRDs would install them into every
# cluster.
#
#   hack/check-crds.sh [CRD_DIR]
set -euo pipefail
CRDS=$(cd "${1:-$(dirname "$0")/../package/crds}" && pwd)
cd "$(dirname "$0")/.."
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd apis && go tool -modfile=../hack/tools/go.mod controller-gen paths=./... crd:crdVersions=v1 output:artifacts:config="$tmp")
if ! diff -r -q "$tmp" "$CRDS" >"$tmp.diff" 2>&1; then
  echo "$CRDS is stale: its CRDs differ from what apis/ generates:" >&2
  sed -e "s#$tmp#(generated)#g" -e "s#Only in (generated): #missing: #" "$tmp.diff" >&2
  echo "Run 'make generate' and commit the result." >&2
  rm -f "$tmp.diff"
  exit 1
fi
rm -f "$tmp.diff"
