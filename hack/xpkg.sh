#!/usr/bin/env bash
# Builds the project's three Crossplane packages as .xpkg files:
#
#   provider-egressproxy-VERSION.xpkg        package/crossplane.yaml, package/crds,
#                                            examples/, runtime image with bin/provider
#   configuration-egressproxy-VERSION.xpkg   package/configuration (XRDs, Compositions),
#                                            package/configuration/examples
#   function-egressproxy-VERSION.xpkg        package/function (meta, input schema),
#                                            runtime image with the function
#
#   hack/xpkg.sh [OUT_DIR]        (default bin/xpkg; VERSION from the environment
#                                  or git describe)
#
# The packaging tool is hack/xpkg (`crossplane xpkg build` on Crossplane's own
# pkg/xpkg library, in a module of its own), built into the cache outside the
# repo once per source change. No docker: the runtime images are made from
# the static binaries by the tool itself. Prints the package files and their
# sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-bin/xpkg}
VERSION=${VERSION:-$(git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)}
CACHE=${EGRESSPROXY_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/provider-egressproxy}
export GOFLAGS=-buildvcs=false
log() { echo "xpkg: $*" >&2; }

mkdir -p "$OUT" "$CACHE/xpkg"
OUT=$(cd "$OUT" && pwd)

# The tool, keyed by its sources.
key=$(cat hack/xpkg/go.mod hack/xpkg/go.sum hack/xpkg/main.go | sha256sum | cut -c1-12)
TOOL="$CACHE/xpkg/crossplane-xpkg-$key"
if [ ! -x "$TOOL" ]; then
  exec 9>"$CACHE/xpkg/.lock"
  flock 9
  if [ ! -x "$TOOL" ]; then
    log "building the packaging tool (hack/xpkg; about a minute cold)"
    (cd hack/xpkg && GOWORK=off CGO_ENABLED=0 go build -trimpath -o "$TOOL.tmp" .)
    mv "$TOOL.tmp" "$TOOL"
  fi
  exec 9>&-
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Static binaries for the runtime images.
mkdir -p "$WORK/bin"
log "building the provider and the function (static, linux/$(go env GOARCH))"
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X github.com/egressproxy/provider-egressproxy/internal/version.Version=$VERSION" \
  -o "$WORK/bin/provider" ./cmd/provider
CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$WORK/bin/function-egressproxy" ./function/cmd/function-egressproxy

# The provider's package root holds only its metadata and CRDs: package/
# also holds the other two packages' folders.
mkdir -p "$WORK/provider/crds"
cp package/crossplane.yaml "$WORK/provider/"
cp package/crds/*.yaml "$WORK/provider/crds/"

"$TOOL" build --package-root "$WORK/provider" --examples-root "$ROOT/examples" \
  --embed-runtime-binary "$WORK/bin/provider" -o "$OUT/provider-egressproxy-$VERSION.xpkg"
"$TOOL" build --package-root package/configuration --examples-root package/configuration/examples \
  -o "$OUT/configuration-egressproxy-$VERSION.xpkg"
"$TOOL" build --package-root package/function \
  --embed-runtime-binary "$WORK/bin/function-egressproxy" -o "$OUT/function-egressproxy-$VERSION.xpkg"

for f in provider configuration function; do
  p="$OUT/$f-egressproxy-$VERSION.xpkg"
  printf '%s\t%s bytes\n' "$p" "$(stat -c %s "$p")"
done
