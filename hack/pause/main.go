// Command pause is the first process of a pod on the local node
// (internal/devenv/controlplane): it holds the pod's namespaces, reaps the
// zombies it inherits as PID 1, and exits on SIGINT or SIGTERM. It stands
// in for registry.k8s.io/pause, which cannot be pulled here; hack/node-bins.sh
// builds it and the node makes its sandbox image from it.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
