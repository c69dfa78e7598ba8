#!/usr/bin/env bash
# Builds the project's three Crossplane packages with the Crossplane CLI
# (`crossplane xpkg build`, github.com/crossplane/cli/v2 built into the
# cache by hack/crossplane-bins.sh):
#
#   provider-egressproxy-VERSION-ARCH.xpkg    package/crossplane.yaml, package/crds
#                                             (the managed kinds as MRDs,
#                                             hack/mrds), examples/, runtime image
#   function-egressproxy-VERSION-ARCH.xpkg    package/function, runtime image
#   configuration-egressproxy-VERSION.xpkg    package/configuration (XRDs,
#                                             Compositions calling the function
#                                             by its resolver name, examples)
#
#   podproxy.yaml                             cluster/rbac/podproxy.yaml, its
#                                             ImageConfig matching XPKG_REPO
#   tenant.yaml                               cluster/rbac/tenant.yaml: the
#                                             application teams' roles
#
#   squid-egressproxy-VERSION.oci.tar         the Squid image PodProxy runs by
#                                             default (hack/squid-image.sh), an
#                                             OCI layout in a tar, which make
#                                             xpkg-push pushes to
#                                             XPKG_REPO/squid-egressproxy
#
#   hack/xpkg.sh [OUT_DIR]     (default bin/xpkg)
#
# Environment: VERSION (default hack/version.sh: the tag, or the next
# patch's vX.Y.Z-dev.<date>.<sha>), XPKG_REPO (the registry and organisation the
# Configuration's dependsOn names; default 127.0.0.1:5000/egressproxy),
# PLATFORMS (default "linux/amd64 linux/arm64"; none: only the
# Configuration), BIN_OUT (a folder to keep
# the static binaries in), SQUID_IMAGE (the provider's default Squid image;
# default XPKG_REPO/squid-egressproxy@DIGEST, the image hack/squid-image.sh
# builds, which needs root and Debian's mirror: set it to build without
# them, and no image archive is written). A release VERSION (vX.Y.Z, no pre-release)
# makes the Configuration depend on the provider and function >=VERSION,
# admitting no pre-release.
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
[ "$PLATFORMS" = none ] && PLATFORMS=''   # the Configuration only
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
  # shellcheck source=hack/lib-apt.sh
  source hack/lib-apt.sh
  apt_ca_certificates() {
    DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 update -qq &&
      DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq ca-certificates >/dev/null
  }
  apt_no_start apt_ca_certificates || { log "apt-get failed"; exit 1; }
}

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

bash hack/go-build.sh "xpkg: hack/runtimeimage" -o "$WORK/runtimeimage" ./hack/runtimeimage
bash hack/go-build.sh "xpkg: hack/mrds" -o "$WORK/mrds" ./hack/mrds

# dns_label is the name Crossplane's dependency resolver gives a package
# it installs: crossplane-runtime's xpkg.ToDNSLabel of the reference's
# repository (the registry host left out): lower-case letters and digits
# kept, '.', '/', ':' and '-' as '-' (except first and last), the rest
# dropped, cut at 63, dashes trimmed. test/packages checks it against
# ToDNSLabel itself.
dns_label() {
  local s=$1 out='' c i
  for ((i = 0; i < ${#s}; i++)); do
    c=${s:i:1}
    case $c in
      [a-z0-9]) out+=$c ;;
      [./:-]) ((i != 0 && i != 62 && i != ${#s} - 1)) && out+=- ;;
    esac
    ((i == 62)) && break
  done
  while [[ $out == -* ]]; do out=${out#-}; done
  while [[ $out == *- ]]; do out=${out%-}; done
  printf '%s' "$out"
}
# The repository path of XPKG_REPO, without the registry host (which
# Crossplane v2 wants spelled out: a first part with a '.' or ':', or
# localhost).
host=${XPKG_REPO%%/*}
[[ $host == *[.:]* || $host == localhost ]] ||
  { log "XPKG_REPO=$XPKG_REPO: its first part must be a registry host (registry.example.com/org, 127.0.0.1:5000/org); Crossplane v2 takes only fully qualified package names"; exit 1; }
FUNCTION_NAME=$(dns_label "${XPKG_REPO#*/}/function-egressproxy")

# Package roots: the provider's holds only its metadata and its resource
# definitions (package/ also holds the other two packages' folders): each
# managed resource kind as a ManagedResourceDefinition stating the
# connection Secret's keys (hack/mrds), the ProviderConfig kinds as CRDs.
# The Configuration's names the registry it is told, and its Compositions
# call the function by the name the dependency resolver installs it under.
mkdir -p "$WORK/provider/crds"
cp package/crossplane.yaml "$WORK/provider/"
"$WORK/mrds" -o "$WORK/provider/crds" package/crds/*.yaml
cp -r package/configuration "$WORK/configuration"
sed -i "s#^\(      package: \)127.0.0.1:5000/egressproxy/#\1$XPKG_REPO/#" "$WORK/configuration/crossplane.yaml"
# A release (no pre-release in VERSION) depends on the provider and the
# function of at least its own version, and admits no pre-release of them:
# a semver constraint without a pre-release matches none. Builds between
# tags keep ">=v0.2.0-0", which admits the pre-releases they are.
if [[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]]; then
  sed -i "s#^\(      version: \)\">=v0.2.0-0\"\$#\1\">=$VERSION\"#" "$WORK/configuration/crossplane.yaml"
  [ "$(grep -c "^      version: \">=$VERSION\"\$" "$WORK/configuration/crossplane.yaml")" = 2 ] ||
    { log "package/configuration/crossplane.yaml: dependsOn no longer constrains both packages to \">=v0.2.0-0\" for make xpkg to replace"; exit 1; }
fi
grep -q "$XPKG_REPO/provider-egressproxy" "$WORK/configuration/crossplane.yaml" ||
  { log "package/configuration/crossplane.yaml: dependsOn no longer names 127.0.0.1:5000/egressproxy/provider-egressproxy for make xpkg to replace"; exit 1; }
for c in "$WORK"/configuration/composition-*.yaml; do
  sed -i "s#^\(      name: \)egressproxy-function-egressproxy\$#\1$FUNCTION_NAME#" "$c"
  grep -q "^      name: $FUNCTION_NAME\$" "$c" ||
    { log "package/configuration/$(basename "$c"): functionRef no longer names egressproxy-function-egressproxy for make xpkg to replace"; exit 1; }
done
log "the Compositions call the function $FUNCTION_NAME (the name Crossplane's dependency resolver installs $XPKG_REPO/function-egressproxy under)"

files=()
# The provider's default Squid image (internal/backend/kubernetes's
# DefaultImage), by the digest of the image written next to the packages.
DEFAULT_SQUID=${SQUID_IMAGE:-}
if [ -n "$PLATFORMS" ] && [ -z "$DEFAULT_SQUID" ]; then
  squid=$(bash hack/squid-image.sh oci)
  squid_oci=$(sed -n 1p <<<"$squid") squid_digest=$(sed -n 2p <<<"$squid")
  [[ $squid_digest =~ ^sha256:[0-9a-f]{64}$ ]] || { log "hack/squid-image.sh oci printed $squid; want the layout and its digest"; exit 1; }
  tar --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner -C "$squid_oci" -cf "$OUT/squid-egressproxy-$VERSION.oci.tar" .
  files+=("$OUT/squid-egressproxy-$VERSION.oci.tar")
  DEFAULT_SQUID="$XPKG_REPO/squid-egressproxy@$squid_digest"
fi
[ -z "$DEFAULT_SQUID" ] || log "the provider's default Squid image: $DEFAULT_SQUID"
for plat in $PLATFORMS; do
  os=${plat%%/*} arch=${plat#*/}
  bin="$WORK/bin/$arch"; mkdir -p "$bin"
  log "building the provider and the function for $plat (static)"
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch bash hack/go-build.sh "xpkg: the provider for $plat" -trimpath \
    -ldflags "-s -w -X github.com/egressproxy/provider-egressproxy/internal/version.Version=$VERSION -X github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes.DefaultImage=$DEFAULT_SQUID" \
    -o "$bin/provider" ./cmd/provider
  CGO_ENABLED=0 GOOS=$os GOARCH=$arch bash hack/go-build.sh "xpkg: the function for $plat" -trimpath -ldflags "-s -w" \
    -o "$bin/function-egressproxy" ./function/cmd/function-egressproxy
  # BIN_OUT keeps the binaries (make release's SBOM reads their build
  # information).
  if [ -n "${BIN_OUT:-}" ]; then
    mkdir -p "$BIN_OUT"
    cp "$bin/provider" "$BIN_OUT/provider-$arch"
    cp "$bin/function-egressproxy" "$BIN_OUT/function-egressproxy-$arch"
  fi
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

# The PodProxy grant (cluster/rbac/podproxy.yaml) with its ImageConfig
# matching the provider of this registry.
sed "s#^\(      prefix: \)127.0.0.1:5000/egressproxy/provider-egressproxy\$#\1$XPKG_REPO/provider-egressproxy#" cluster/rbac/podproxy.yaml >"$OUT/podproxy.yaml"
grep -q "^      prefix: $XPKG_REPO/provider-egressproxy\$" "$OUT/podproxy.yaml" ||
  { log "cluster/rbac/podproxy.yaml: the ImageConfig no longer matches 127.0.0.1:5000/egressproxy/provider-egressproxy for make xpkg to replace"; exit 1; }
files+=("$OUT/podproxy.yaml")
# The application teams' roles (cluster/rbac/tenant.yaml), as they are.
cp cluster/rbac/tenant.yaml "$OUT/tenant.yaml"
files+=("$OUT/tenant.yaml")

for p in "${files[@]}"; do
  printf '%s\t%s bytes\n' "$p" "$(stat -c %s "$p")"
done
