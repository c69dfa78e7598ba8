// Command applycrds installs or updates the CRDs in the folders given on the
// cluster in KUBECONFIG, and waits until they are served. `make run` uses it
// when it runs the provider against an existing cluster.
package main

import (
	"fmt"
	"os"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: applycrds DIR...")
		os.Exit(2)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fail(err)
	}
	crds, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
		Paths: os.Args[1:], ErrorIfPathMissing: true, MaxTime: time.Minute, PollInterval: 200 * time.Millisecond,
	})
	if err != nil {
		fail(err)
	}
	fmt.Printf("applycrds: %d CRDs installed and served\n", len(crds))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "applycrds:", err)
	os.Exit(1)
}
