// Command benchprovider is the provider the benchmarks run
// (hack/bench-scale.sh, bench-start.sh, bench-podproxy.sh): the shipped
// program (internal/provider) with two changes, each in its own file. The
// KVMProxy kind's backend is in memory (memory.go), so the benchmarks
// measure the control plane and the provider rather than libvirt, and
// every request to the API server is counted by verb and resource
// (requests.go). It takes the provider's flags. Never shipped: nothing
// but the benchmarks builds it.
package main

import (
	"runtime"

	"github.com/egressproxy/provider-egressproxy/internal/provider"
)

func main() {
	// A heap profile sample every 64 KiB rather than every 512 KiB: the
	// benchmarks print the heap's top holders, and at the default a
	// provider's few tens of MiB are too few samples to tell them apart.
	runtime.MemProfileRate = 64 << 10
	provider.Main(provider.Hooks{Bindings: memoryBindings(), Configure: countRequests()})
}
