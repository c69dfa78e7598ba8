#!/usr/bin/env bash
# Builds the release artefacts of VERSION (vX.Y.Z, no pre-release) into
# OUT_DIR (default bin/release/VERSION):
#
#   the three packages, both architectures   hack/xpkg.sh with VERSION: the
#                                            Configuration depends on provider
#                                            and function >=VERSION, admitting
#                                            no pre-release
#   podproxy.yaml                            the PodProxy grant for XPKG_REPO
#   tenant.yaml                              the application teams' roles
#   squid-egressproxy-VERSION.oci.tar        the Squid image the provider runs
#                                            by default (linux/amd64), which
#                                            must hold the packages of
#                                            hack/squidimage/packages.lock
#   provider-egressproxy-VERSION-ARCH.cdx.json  CycloneDX SBOM of the provider
#                                            image's binary, from its Go build
#                                            information (cyclonedx-gomod bin)
#   CHANGELOG-VERSION.md                     the entry: the commit subjects since
#                                            the last release tag
#   SHA256SUMS                               of every file above (sha256sum -c)
#
#   VERSION=v0.3.0 hack/release.sh [OUT_DIR]
#
# XPKG_REPO as for hack/xpkg.sh. A tree with uncommitted changes is
# refused (ALLOW_DIRTY=1 builds it anyway, for tests).
set -euo pipefail
cd "$(dirname "$0")/.."
log() { echo "release: $*" >&2; }
VERSION=${VERSION:-}
[[ $VERSION =~ ^v[0-9]+\.[0-9]+\.[0-9]+$ ]] ||
  { log "VERSION=$VERSION: want a release version vX.Y.Z (no pre-release), such as VERSION=v0.3.0"; exit 1; }
if [ -z "${ALLOW_DIRTY:-}" ] && [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
  log "the tree has uncommitted changes: commit them (a release is built from a commit)"; exit 1
fi
OUT=${1:-bin/release/$VERSION}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# SQUID_IMAGE_STRICT: the Squid image holds the packages
# hack/squidimage/packages.lock records, or the release fails (0 builds
# it anyway, for tests, as ALLOW_DIRTY does).
VERSION=$VERSION BIN_OUT="$WORK/bin" SQUID_IMAGE_STRICT=${SQUID_IMAGE_STRICT:-1} bash hack/xpkg.sh "$OUT"
for f in "$WORK"/bin/provider-*; do
  arch=${f##*-}
  log "SBOM of the provider for $arch"
  go tool -modfile=hack/tools/go.mod cyclonedx-gomod bin -json -noserial -notimestamp \
    -version "$VERSION" -output "$OUT/provider-egressproxy-$VERSION-$arch.cdx.json" "$f"
done

# The entry: what changed since the newest release tag before VERSION.
last=$(git tag --merged HEAD --list 'v*' --sort=-v:refname 2>/dev/null |
  grep -E '^v[0-9]+\.[0-9]+\.[0-9]+$' | grep -vx "$VERSION" | head -n1 || true)
{
  echo "## $VERSION ($(TZ=UTC git log -1 --format=%cd --date=format-local:%Y-%m-%d))"
  echo
  if [ -n "$last" ]; then echo "Changes since $last:"; else echo "Changes:"; fi
  echo
  git log --no-merges --format='- %s' ${last:+"$last"..HEAD}
} >"$OUT/CHANGELOG-$VERSION.md"

# Only VERSION's files: OUT_DIR may hold other builds too.
(cd "$OUT" && rm -f SHA256SUMS && sha256sum -- ./*-"$VERSION".xpkg ./*-"$VERSION"-*.xpkg ./squid-egressproxy-"$VERSION".oci.tar podproxy.yaml tenant.yaml ./*-"$VERSION"-*.cdx.json "CHANGELOG-$VERSION.md" |
  sed 's# \./# #' >SHA256SUMS)
log "$VERSION in $OUT:"
(cd "$OUT" && ls -l) >&2
