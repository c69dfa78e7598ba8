#!/usr/bin/env bash
# `make run` with KUBECONFIG set: the cluster it names is the user's.
#
# When it runs Crossplane (it serves pkg.crossplane.io's Providers): the
# packages are built from this tree, pushed to XPKG_REPO (a registry the
# cluster pulls from, with your registry credentials in the Docker config
# the Crossplane CLI reads) and installed there with `crossplane xpkg
# install`, the same path as docs/install.md and make run's local cluster.
# Otherwise: the CRDs are applied and the provider runs out of cluster, as a
# process here, with the identity of KUBECONFIG; it says so.
#
#   KUBECONFIG=... VERSION=... XPKG_REPO=... hack/run-cluster.sh [PROVIDER FLAGS]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBECONFIG:?set KUBECONFIG to the cluster to run against}"
VERSION=${VERSION:-$(bash hack/version.sh)}
XPKG_REPO=${XPKG_REPO:-localhost:5000/egressproxy}
say() { echo "make run: $*" >&2; }

KUBECTL="$(bash hack/controlplane-bins.sh)/kubectl"
if "$KUBECTL" get crd providers.pkg.crossplane.io >/dev/null 2>&1; then
  say "the cluster in KUBECONFIG=$KUBECONFIG runs Crossplane: building the packages, pushing them to XPKG_REPO=$XPKG_REPO, installing them with crossplane xpkg install"
  case $XPKG_REPO in
    localhost:*|localhost/*)
      say "XPKG_REPO=$XPKG_REPO: Crossplane refuses localhost:PORT as not fully qualified, and the cluster must pull from it; set XPKG_REPO to your registry, such as registry.example.com/platform (docs/install.md)"
      exit 1 ;;
  esac
  make --no-print-directory xpkg-push VERSION="$VERSION" XPKG_REPO="$XPKG_REPO"
  CLI=$(bash hack/crossplane-bins.sh cli)
  # The Provider's name is the one Crossplane's dependency resolver gives
  # the Configuration's dependency (the repository path as a DNS label), so
  # that it finds it installed and makes no second Provider.
  org=${XPKG_REPO#*/}
  "$CLI" xpkg install provider "$XPKG_REPO/provider-egressproxy:$VERSION" "${org//\//-}-provider-egressproxy" --wait=5m
  "$CLI" xpkg install function "$XPKG_REPO/function-egressproxy:$VERSION" function-egressproxy --wait=5m
  "$CLI" xpkg install configuration "$XPKG_REPO/configuration-egressproxy:$VERSION" configuration-egressproxy --wait=5m
  say "installed $VERSION. PodProxies on InjectedIdentity need the grant of cluster/rbac/podproxy.yaml (docs/install.md); then a ProviderConfig for your backends (examples/) and an EgressProxy (package/configuration/examples/)"
else
  say "no Crossplane in the cluster in KUBECONFIG=$KUBECONFIG (it serves no providers.pkg.crossplane.io): applying the CRDs and running the provider out of cluster, as a process here, with KUBECONFIG's identity. Compositions and claims need Crossplane (docs/install.md); managed resources work."
  go run ./hack/applycrds package/crds
  exec bin/provider --log-format console "$@"
fi
