# Sourced by hack/bench-*.sh: strict mode, the repository root as the
# working folder, and bin/ for what they build.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export GOFLAGS="${GOFLAGS:--buildvcs=false}"
mkdir -p bin

# bench_build NAME: builds the benchmark ./hack/NAME into bin/NAME.
bench_build() {
  go build -o "bin/$1" "./hack/$1"
}

# bench_args DEFAULT "$@": COUNT is the first argument (DEFAULT when there
# is none) and ARGS what follows it, without a leading "--" (the
# benchmark's own flags).
bench_args() {
  local def=$1; shift
  COUNT="${1:-$def}"
  shift $(( $# > 1 ? 1 : $# ))
  [ "${1:-}" = "--" ] && shift
  ARGS=("$@")
}

# bench_provider: the provider the benchmarks run (hack/benchprovider:
# the shipped program with the KVMProxy kind on the in-memory reference
# driver and its API requests counted) into bin/benchprovider, built as
# the package's provider is (hack/xpkg.sh: static, stripped), so that its
# memory is the shipped binary's: a cgo build maps libc besides.
bench_provider() {
  CGO_ENABLED=0 go build -trimpath -ldflags '-s -w' -o bin/benchprovider ./hack/benchprovider
}

# bench_charts: draws the results the benchmarks appended to BENCH_DATA
# (default .cache/bench) as SVG charts beside them (hack/benchchart, a
# module of its own: gonum.org/v1/plot).
bench_charts() {
  local data
  data=$(realpath -m "${BENCH_DATA:-.cache/bench}")
  (cd hack/benchchart && go run . -data "$data") || echo "bench_charts: could not draw the charts" >&2
}
