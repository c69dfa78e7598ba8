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
