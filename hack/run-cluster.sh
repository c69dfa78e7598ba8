#!/usr/bin/env bash
# `make run` with KUBECONFIG set: the cluster it names is the user's.
#
# When it runs Crossplane (it serves pkg.crossplane.io's Providers): the
# packages are built from this tree, pushed to XPKG_REPO (a registry the
# cluster pulls from, with your registry credentials in the Docker config
# the Crossplane CLI reads, and its CA in SSL_CERT_FILE if it is not a
# public one) and installed there with `crossplane xpkg install`, the same
# path as docs/install.md and make run's local cluster. A cluster that has
# them installed already is refused, naming the object (upgrades:
# docs/install.md).
# Otherwise: the CRDs are applied and the provider runs out of cluster, as a
# process here, with the identity of KUBECONFIG, in its namespace (made when
# missing: a cluster without Crossplane has no crossplane-system); it says
# so.
#
#   KUBECONFIG=... VERSION=... XPKG_REPO=... hack/run-cluster.sh [PROVIDER FLAGS]
set -euo pipefail
cd "$(dirname "$0")/.."
: "${KUBECONFIG:?set KUBECONFIG to the cluster to run against}"
VERSION=${VERSION:-$(bash hack/version.sh)}
XPKG_REPO=${XPKG_REPO:-127.0.0.1:5000/egressproxy}
say() { echo "make run: $*" >&2; }

# What the cluster is, asked by hack/runcluster (client-go; no kubectl to
# build): it fails, saying why, when the cluster cannot be reached.
mkdir -p bin
bash hack/go-build.sh "make run: building hack/runcluster" -o bin/runcluster ./hack/runcluster
crossplane=$(bin/runcluster crossplane)
if [ "$crossplane" = yes ]; then
  say "the cluster in KUBECONFIG=$KUBECONFIG runs Crossplane: building the packages, pushing them to XPKG_REPO=$XPKG_REPO, installing them with crossplane xpkg install"
  case $XPKG_REPO in
    localhost:*|localhost/*)
      say "XPKG_REPO=$XPKG_REPO: Crossplane refuses localhost:PORT as not fully qualified, and the cluster must pull from it; set XPKG_REPO to your registry, such as registry.example.com/platform (docs/install.md)"
      exit 1 ;;
  esac
  # The Provider's name is the one Crossplane's dependency resolver gives
  # the Configuration's dependency (the repository path as a DNS label), so
  # that it finds it installed and makes no second Provider.
  org=${XPKG_REPO#*/}
  provider="${org//\//-}-provider-egressproxy"
  # The Function's likewise, which the Compositions call (make xpkg writes
  # it into them).
  function="${org//\//-}-function-egressproxy"
  # A cluster that has them already gets no second install: moving all
  # three to a new build at once makes Crossplane's dependency resolver
  # add a second Function (seen with v2.4.0); upgrade the Provider as
  # docs/install.md (Upgrade) says.
  have=$(bin/runcluster installed "provider/$provider" "function/$function" configuration/configuration-egressproxy)
  if [ -n "$have" ]; then
    say "$have is installed in this cluster already: make run installs into a cluster without it; to move it to this build, see docs/install.md (Upgrade)"
    exit 1
  fi
  make --no-print-directory xpkg-push VERSION="$VERSION" XPKG_REPO="$XPKG_REPO"
  CLI=$(bash hack/crossplane-bins.sh cli)
  for p in "provider provider-egressproxy $provider" "function function-egressproxy $function" "configuration configuration-egressproxy configuration-egressproxy"; do
    read -r kind pkg name <<<"$p"
    say "crossplane xpkg install $kind $XPKG_REPO/$pkg:$VERSION $name, waiting for it to be Healthy"
    "$CLI" xpkg install "$kind" "$XPKG_REPO/$pkg:$VERSION" "$name" --wait=5m
  done
  say "installed $VERSION. PodProxies on InjectedIdentity need the grant of cluster/rbac/podproxy.yaml (docs/install.md); then a ProviderConfig for your backends (examples/) and an EgressProxy (package/configuration/examples/)"
else
  say "no Crossplane in the cluster in KUBECONFIG=$KUBECONFIG (it serves no providers.pkg.crossplane.io): applying the CRDs and running the provider out of cluster, as a process here, with KUBECONFIG's identity. Compositions and claims need Crossplane (docs/install.md); managed resources work."
  bin/runcluster apply-crds package/crds | sed 's/^/make run: /' >&2
  # The provider keeps its leader-election lease and installation ID in
  # its namespace (--namespace, else $POD_NAMESPACE, else
  # crossplane-system, where Crossplane would run it): made when missing.
  ns=${POD_NAMESPACE:-crossplane-system}
  prev=
  for a in "$@"; do
    case $a in
      --namespace=*|-namespace=*) ns=${a#*=} ;;
    esac
    case $prev in
      --namespace|-namespace) ns=$a ;;
    esac
    prev=$a
  done
  made=$(bin/runcluster namespace "$ns")
  case $made in
    created) say "created the namespace $ns, the provider's (its leader-election lease and installation ID; another one: ARGS=--namespace=NAME)" ;;
    *) say "the provider's namespace: $ns" ;;
  esac
  make --no-print-directory build-provider VERSION="$VERSION" >&2
  say "running bin/provider; Ctrl-C stops it"
  exec bin/provider --log-format console "$@"
fi
