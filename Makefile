# provider-egressproxy. The two commands a newcomer needs:
#   make run    set up and run the provider (on an embedded local control
#               plane unless KUBECONFIG points at a cluster)
#   make test   the whole test suite, installing what it needs
# Quicker loops: make test-unit, make test-integration, make test-pod.

GO        ?= go
BIN       := $(CURDIR)/bin
PKG       := github.com/egressproxy/provider-egressproxy
# A semver Crossplane can order: the tag, or v0.2.0-dev.<date>.<commit>.
VERSION   ?= $(shell bash hack/version.sh)
# The registry and organisation packages are pushed to, which the
# Configuration's dependsOn names (docs/install.md).
XPKG_REPO ?= 127.0.0.1:5000/egressproxy
LDFLAGS   := -s -w -X $(PKG)/internal/version.Version=$(VERSION)
GOTEST    ?= $(GO) test
TESTFLAGS ?= -count=1 -timeout 40m

export GOFLAGS := -buildvcs=false

.PHONY: all
all: build

## Code generation ----------------------------------------------------------

# Deepcopy functions, CRDs (package/crds) and method sets. Never edit
# zz_generated.* or package/crds by hand.
.PHONY: generate
generate:
	cd apis && $(GO) generate -tags generate ./...

# Fails when the generated files in the tree are not what `make generate`
# produces from the sources.
.PHONY: check-generated
check-generated: generate
	@if [ -n "$$(git status --porcelain -- apis package/crds)" ]; then \
		echo "Generated files are stale: run 'make generate' and commit the result:"; \
		git status --porcelain -- apis package/crds; git --no-pager diff --stat -- apis package/crds; exit 1; \
	fi

## Build ---------------------------------------------------------------------

# hack/go-build.sh is go build saying how far it is when it takes long (an
# empty Go build cache: minutes); warm it prints nothing.
GOBUILD = GO=$(GO) bash hack/go-build.sh

.PHONY: build
build: build-provider
	$(GOBUILD) "make build: bin/local-control-plane" -o $(BIN)/local-control-plane ./cmd/local-control-plane

# bin/provider alone (what make run runs out of cluster).
.PHONY: build-provider
build-provider:
	$(GOBUILD) "make build: bin/provider" -ldflags '$(LDFLAGS)' -o $(BIN)/provider ./cmd/provider

## Dependencies the tests and `make run` install themselves -------------------

# kube-apiserver, etcd and kube-controller-manager, built from the Go module
# proxy into a cache outside the repo (~/.cache/provider-egressproxy) and
# only when missing: about 7 minutes cold, instant after.
.PHONY: controlplane-bins
controlplane-bins:
	@bash hack/controlplane-bins.sh >/dev/null

# The local node (internal/devenv/controlplane's Options.Node): kubelet,
# kube-proxy, kube-scheduler and crictl built from the Go module proxy into
# the cache, containerd, runc and the CNI plugins from apt, only when
# missing (about 6 minutes cold); and the Squid image its pods run, built
# with mmdebstrap (about 2 minutes cold, cached after).
.PHONY: node-bins
node-bins:
	@bash hack/node-bins.sh >/dev/null
	@bash hack/squid-image.sh >/dev/null

# Debian's squid, for the tests that run real Squid; Crossplane core for
# the compositions; the local node. (The KVM tests bring up libvirt and
# build their guest image themselves, through hack/libvirt-up.sh and
# hack/guest-image.sh.)
.PHONY: test-deps
test-deps: controlplane-bins crossplane-bins node-bins
	@bash hack/install-squid.sh

## Run -----------------------------------------------------------------------

# Without KUBECONFIG: a whole local Crossplane that hands out a working
# proxy (README, "Quickstart"): builds what is missing (printing what and
# how far), then brings up and prints, in order, the control plane, a node
# (NODE=0 for none), a local registry on 127.0.0.1:5000 (RUN_XPKG_REPO=
# 127.0.0.1:PORT/egressproxy for another port) with
# the packages built from this tree, Crossplane core with its package
# manager, the provider, function and Configuration installed with
# crossplane xpkg install, a ClusterProviderConfig for the local cluster
# and an upstream web server; then the next three commands. Ctrl-C stops
# everything it started. As root (the node).
# With KUBECONFIG set (hack/run-cluster.sh): when the cluster runs
# Crossplane, builds the packages, pushes them to XPKG_REPO and installs
# them there with crossplane xpkg install (refused when they are installed
# already); otherwise applies the CRDs and runs the provider out of cluster
# against it, and says so.
.PHONY: run
run:
	@t0=$$(date +%s.%N); \
	if [ -n "$$KUBECONFIG" ]; then \
		VERSION=$(VERSION) XPKG_REPO=$(XPKG_REPO) bash hack/run-cluster.sh $(ARGS); \
	else \
		$(GOBUILD) "make run: building bin/local-control-plane" -o $(BIN)/local-control-plane ./cmd/local-control-plane && \
		$(BIN)/local-control-plane --crossplane $(if $(filter 0,$(NODE)),,--node) $(if $(RUN_XPKG_REPO),--xpkg-repo $(RUN_XPKG_REPO)) \
			--kubeconfig-out $(CURDIR)/.cache/kubeconfig --started-at $$t0; \
	fi

## Test ----------------------------------------------------------------------

# The whole suite: generated files up to date, vet, unit and integration
# tests on a real control plane, real Squid, real Crossplane core.
.PHONY: test
test: test-deps check-generated vet lint
	CI=$${CI:-true} EGRESSPROXY_REQUIRE_SQUID=1 $(GOTEST) $(TESTFLAGS) ./...

.PHONY: vet
vet:
	$(GO) vet ./...
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "Not gofmt'ed:"; echo "$$out"; exit 1; fi
	@bash hack/check-tracked.sh

# golangci-lint at the version pinned in hack/lint-bins.sh (built into the
# tool cache when missing), with .golangci.yml.
.PHONY: lint
lint:
	@$$(bash hack/lint-bins.sh) run ./...

# Unit tests only: no control plane, no Squid.
# Unit tests of the provider's code (apis, internal, the function): what
# every kind runs through, in under a minute warm. vet is left to make vet
# and make lint; cmd/, test/ and hack/ are end-to-end and tools, run by
# make test (test-unit-all runs their unit tests too).
.PHONY: test-unit
test-unit:
	$(GOTEST) -count=1 -vet=off -skip Integration ./apis/... ./internal/... ./function/...

.PHONY: test-unit-all
test-unit-all:
	$(GOTEST) -count=1 -skip Integration ./...

# Integration tests only.
.PHONY: test-integration
test-integration: test-deps
	EGRESSPROXY_REQUIRE_SQUID=1 $(GOTEST) $(TESTFLAGS) -run Integration ./...

# One backend: the PodProxy driver and its end-to-end test.
.PHONY: test-pod
test-pod: test-deps
	EGRESSPROXY_REQUIRE_SQUID=1 $(GOTEST) $(TESTFLAGS) ./internal/backend/kubernetes/... ./internal/controller/pod/... ./internal/squid/...

# The docs check alone (test/docs, part of make test too): every flag,
# environment variable, metric, condition reason and make target that
# README.md and docs/ name exists in the code or this Makefile.
.PHONY: test-docs
test-docs:
	$(GOTEST) -count=1 ./test/docs/

## Benchmarks -----------------------------------------------------------------

# Each benchmark is hack/bench-<name>.sh, given the arguments below (make
# variables with defaults); what it measures is in the script's header.
BENCHES := bench-podproxy bench-scale bench-batch bench-node bench-start bench-image bench-run bench-kvm
.PHONY: $(BENCHES)
$(BENCHES):
	bash hack/$@.sh $(BENCH_ARGS)

# The floor, then the provider, each on a fresh control plane, and a summary
# of both against the targets: make bench-podproxy N=200 DELAY=3s (one side:
# hack/bench-podproxy.sh 200 3s -- -only provider, or -- -floor)
bench-podproxy: controlplane-bins
bench-podproxy: BENCH_ARGS = $(or $(N),200) $(or $(DELAY),3s)

# One provider holding N managed resources on the in-memory reference
# driver: time to Ready, RSS and CPU per poll at 1000, 5000 and 10000, and a
# restart (docs/benchmarks.md): make bench-scale N=10000
bench-scale: controlplane-bins
bench-scale: BENCH_ARGS = $(or $(N),10000)

# Backend calls per proxy per poll with batched observation, counted at the
# Proxmox and GCP fakes: make bench-batch N=100
bench-batch: BENCH_ARGS = $(or $(N),100)

# The local node: warm start and stop, PodProxy create-to-Ready on real
# pods (as root): make bench-node ROUNDS=3 PROXIES=3
bench-node: build
bench-node: BENCH_ARGS = $(or $(ROUNDS),3) $(or $(PROXIES),3)

# The provider's start: exec to /readyz and to the first reconcile of an
# existing resource (docs/benchmarks.md): make bench-start ROUNDS=5
bench-start: controlplane-bins
bench-start: BENCH_ARGS = $(or $(ROUNDS),5)

# make run (no KUBECONFIG) ROUNDS times in a row, each to ready for
# kubectl and then Ctrl-C: the time to each stage and to ready, and the
# load average (as root; NODE=0 for no node): make bench-run ROUNDS=3
bench-run: BENCH_ARGS = $(or $(ROUNDS),3)

# KVMProxy create-to-Ready by phase on the real libvirt host, the base
# image cached (as root): the median of each phase: make bench-kvm ROUNDS=3
bench-kvm: controlplane-bins
bench-kvm: BENCH_ARGS = $(or $(ROUNDS),3)

# The KVM image download into a storage pool of the real libvirt host
# (as root): RSS growth and throughput for SIZE MiB: make bench-image SIZE=1024
bench-image: BENCH_ARGS = $(or $(SIZE),1024)

.PHONY: clean
clean:
	rm -rf $(BIN) .cache

## Compositions and packages ---------------------------------------------------

# Crossplane core v2.4.0 and the Crossplane CLI v2.5.0, built from the Go
# module proxy into the cache outside the repo (minutes cold, instant
# after). The end-to-end tests run hack/crossplane-bins.sh themselves when
# they are missing.
.PHONY: crossplane-bins
crossplane-bins:
	@bash hack/crossplane-bins.sh all >/dev/null

# The compositions on real Crossplane core with the function and the
# provider (test/compositions), the function's unit tests, and the
# packages opened (test/packages).
.PHONY: test-compositions
test-compositions: test-deps crossplane-bins
	EGRESSPROXY_REQUIRE_SQUID=1 $(GOTEST) $(TESTFLAGS) ./function/... ./test/...

# The install path of docs/install.md end to end (test/install).
.PHONY: test-install
test-install: test-deps crossplane-bins
	EGRESSPROXY_REQUIRE_SQUID=1 $(GOTEST) $(TESTFLAGS) -v -run Integration ./test/install/

# The provider and function packages (linux/amd64 and linux/arm64, each
# its own runtime image) and the Configuration as .xpkg files in bin/xpkg,
# with `crossplane xpkg build` (hack/xpkg.sh; no docker), and the Squid
# image the provider runs by default (hack/squid-image.sh: as root, with
# Debian's mirror). Push them with make xpkg-push (docs/install.md).
.PHONY: xpkg
xpkg:
	VERSION=$(VERSION) XPKG_REPO=$(XPKG_REPO) bash hack/xpkg.sh $(BIN)/xpkg

# crossplane xpkg push of the three packages to $(XPKG_REPO), both
# architectures of a package as one index; first the Squid image the
# provider runs by default, as $(XPKG_REPO)/squid-egressproxy:$(VERSION)
# (the provider names it by digest).
.PHONY: xpkg-push
xpkg-push: xpkg
	$(GO) run ./hack/squidimage -push $(BIN)/xpkg/squid-egressproxy-$(VERSION).oci.tar -ref $(XPKG_REPO)/squid-egressproxy:$(VERSION)
	@cli=$$(bash hack/crossplane-bins.sh cli) && for n in provider function; do \
		$$cli xpkg push -f $(BIN)/xpkg/$$n-egressproxy-$(VERSION)-amd64.xpkg,$(BIN)/xpkg/$$n-egressproxy-$(VERSION)-arm64.xpkg $(XPKG_REPO)/$$n-egressproxy:$(VERSION) || exit 1; \
	done && $$cli xpkg push -f $(BIN)/xpkg/configuration-egressproxy-$(VERSION).xpkg $(XPKG_REPO)/configuration-egressproxy:$(VERSION)

# The release artefacts of VERSION (vX.Y.Z): the three packages for both
# architectures, the PodProxy grant, an SBOM of the provider per
# architecture, the CHANGELOG entry and SHA256SUMS, in bin/release/VERSION
# (hack/release.sh; docs/install.md, Releases).
.PHONY: release
release:
	VERSION=$(VERSION) XPKG_REPO=$(XPKG_REPO) bash hack/release.sh $(BIN)/release/$(VERSION)

# Claim-to-Ready time on real Crossplane core: make bench-claim-ready N=10
.PHONY: bench-claim-ready
bench-claim-ready: test-deps crossplane-bins
	bash hack/crossplane-claim-ready.sh $(or $(N),10)
