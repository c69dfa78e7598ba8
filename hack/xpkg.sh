#!/usr/bin/env bash
# Builds the project's three Crossplane packages with the Crossplane CLI
# (`crossplane xpkg build`, github.com/crossplane/cli/v2 built into the
# cache by hack/crossplane-bins.sh):
#
#   provider-egressproxy-VERSION-ARCH.xpkg    package/crossplane.yaml, package/crds,
#                                             examples/, runtime image
#   function-egressproxy-VERSION-ARCH.xpkg    package/function, runtime image
#   configuration-egressproxy-VERSION.xpkg    package/configuration (XRDs,
#                                             Compositions, examples)
#
#   hack/xpkg.sh [OUT_DIR]     (default bin/xpkg)
#
# Environment: VERSION (default hack/version.sh: the tag, or
# v0.2.0-dev.<date>.<sha>), XPKG_REPO (the registry and organisation the
# Configuration's dependsOn names; default 127.0.0.1:5000/egressproxy),
# PLATFORMS (default "linux/amd64 linux/arm64").
#
# No docker: each runtime image (a static binary, Debian's CA certificates,
# a nonroot user) is made by hack/runtimeimage and embedded with
# --embed-runtime-image-tarball, so the package is also the image Crossplane
# runs. `crossplane xpkg push -f a-amd64.xpkg,a-arm64.xpkg REF` pushes the
# architectures of a package as one multi-arch index. Prints each file
# and its size.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${1:-bin/xpkg}
VERSION=${VERSION:-$(bash hack/version.sh)}
XPKG_REPO=${XPKG_REPO:-127.0.0.1:5000/egressproxy}
PLATFORMS=${PLATFORMS:-linux/amd64 linux/arm64}
export GOFLAGS=-buildvcs=false
log() { echo "xpkg: $*" >&2; }

[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?$ ]] ||
  { log "VERSION=$VERSION is not a semantic version (vX.Y.Z[-pre]); Crossplane orders packages by it"; exit 1; }
[[ $XPKG_REPO =~ ^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._-]+)+$ ]] ||
  { log "XPKG_REPO=$XPKG_REPO: want registry/organisation, such as 127.0.0.1:5000/egressproxy"; exit 1; }

# The package's CRDs must be what the API types generate: a stale CRD in a
# package would be installed into every cluster that pulls it.
bash hack/check-crds.sh

CLI=$(bash hack/crossplane-bins.sh cli)
[ -d /usr/share/ca-certificates/mozilla ] || {
  log "installing Debian's ca-certificates (the runtime images' CA bundle)"
  apt-get -o DPkg::Lock::Timeout=600 install -y ca-certificates >/dev/null
}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

bash hack/go-build.sh "xpkg: hack/runtimeimage" -o "$WORK/runtimeimage" ./hack/runtimeimage

# Package roots: the provider's holds only its metadata and CRDs (package/
# also holds the other two packages' folders); the Configuration's names
# the registry it is told.
mkdir -p "$WORK/provider/crds"
cp package/crossplane.yaml "$WORK/provider/"
cp package/crds/*.yaml "$WORK/provider/crds/"
cp -r package/configuration "$WORK/configuration"
sed -i "s#^\(    - \(provider\|function\): \)127.0.0.1:5000/egressproxy/#\1$XPKG_REPO/#" "$WORK/configuration/crossplane.yaml"
grep -q "$XPKG_REPO/provider-egressproxy" "$WORK/configuration/crossplane.yaml" ||
  { log "package/configuration/crossplane.yaml: dependsOn no longer names 127.0.0.1:5000/egressproxy/provider-egressproxy for make xpkg to replace"; exit 1; }

files=()
for plat in $PLATFORMS; do
  os=${plat%%/*} arch=${plat#*/}
  bin="$WORK/bin/$arch"; mkdir -p "$bin"
  log "building the provider and the function for $plat (static)"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch bash hack/go-build.sh "xpkg: the provider for $plat" -trimpath \
    -ldflags "-s -w -X github.com/egressproxy/provider-egressproxy/internal/version.Version=$VERSION" \
    -o "$bin/provider" ./cmd/provider
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch bash hack/go-build.sh "xpkg: the function for $plat" -trimpath -ldflags "-s -w" \
    -o "$bin/function-egressproxy" ./function/cmd/function-egressproxy
  for b in provider function-egressproxy; do
    "$WORK/runtimeimage" --binary "$bin/$b" --platform "$plat" --version "$VERSION" -o "$bin/$b.tar"
  done
  "$CLI" xpkg build --package-root "$WORK/provider" --examples-root "$ROOT/examples" \
    --embed-runtime-image-tarball "$bin/provider.tar" -o "$OUT/provider-egressproxy-$VERSION-$arch.xpkg"
  "$CLI" xpkg build --package-root package/function --examples-root package/function/.no-examples \
    --embed-runtime-image-tarball "$bin/function-egressproxy.tar" -o "$OUT/function-egressproxy-$VERSION-$arch.xpkg"
  files+=("$OUT/provider-egressproxy-$VERSION-$arch.xpkg" "$OUT/function-egressproxy-$VERSION-$arch.xpkg")
  printf '%s\t%s bytes (runtime image)\n' "$plat provider" "$(stat -c %s "$bin/provider.tar")"
  printf '%s\t%s bytes (runtime image)\n' "$plat function" "$(stat -c %s "$bin/function-egressproxy.tar")"
done
"$CLI" xpkg build --package-root "$WORK/configuration" --examples-root "$WORK/configuration/examples" \
  -o "$OUT/configuration-egressproxy-$VERSION.xpkg"
files+=("$OUT/configuration-egressproxy-$VERSION.xpkg")

for p in "${files[@]}"; do
  printf '%s\t%s bytes\n' "$p" "$(stat -c %s "$p")"
done
