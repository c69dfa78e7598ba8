// Command runcluster is what `make run` with KUBECONFIG set
// (hack/run-cluster.sh) asks of the cluster KUBECONFIG names, with no
// kubectl needed:
//
//	runcluster crossplane       prints "yes" when the cluster runs Crossplane
//	                            (it serves providers.pkg.crossplane.io), "no"
//	                            when it does not; fails, saying why, when the
//	                            cluster cannot be reached or read
//	runcluster installed KIND/NAME...
//	                            prints the first of the packages named
//	                            (provider/NAME, function/NAME,
//	                            configuration/NAME) that is installed
//	runcluster apply-crds DIR...
//	                            installs or updates the CRDs in the folders
//	                            and waits until they are served
//	runcluster namespace NAME   creates the namespace when it is missing
//	                            (the provider's own: its leader-election
//	                            lease and installation-ID ConfigMap live
//	                            there); prints "created" or "exists"
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

const usage = "usage: runcluster crossplane | installed KIND/NAME... | apply-crds DIR... | namespace NAME"

func main() {
	if len(os.Args) < 2 {
		fail(usage)
	}
	cfg, err := ctrl.GetConfig()
	if err != nil {
		fail("reading KUBECONFIG: %v", err)
	}
	// Every call answers quickly or fails: a cluster that does not
	// answer is said so, not waited for.
	cfg.Timeout = 30 * time.Second
	ctx := context.Background()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		fail("%v", err)
	}
	switch cmd, args := os.Args[1], os.Args[2:]; {
	case cmd == "crossplane" && len(args) == 0:
		dc, err := discovery.NewDiscoveryClientForConfig(cfg)
		if err != nil {
			fail("%v", err)
		}
		if _, err := dc.ServerVersion(); err != nil {
			fail("cannot reach the cluster in KUBECONFIG=%s: %v", os.Getenv("KUBECONFIG"), err)
		}
		crds := schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
		_, err = dyn.Resource(crds).Get(ctx, "providers.pkg.crossplane.io", metav1.GetOptions{})
		switch {
		case err == nil:
			fmt.Println("yes")
		case apierrors.IsNotFound(err):
			fmt.Println("no")
		default:
			fail("reading the CRD providers.pkg.crossplane.io (does your identity in KUBECONFIG=%s may get CRDs?): %v", os.Getenv("KUBECONFIG"), err)
		}
	case cmd == "installed" && len(args) > 0:
		for _, a := range args {
			kind, name, ok := strings.Cut(a, "/")
			if !ok || (kind != "provider" && kind != "function" && kind != "configuration") {
				fail("installed %s: want provider/NAME, function/NAME or configuration/NAME", a)
			}
			gvr := schema.GroupVersionResource{Group: "pkg.crossplane.io", Version: "v1", Resource: kind + "s"}
			_, err := dyn.Resource(gvr).Get(ctx, name, metav1.GetOptions{})
			if err == nil {
				fmt.Printf("%s.pkg.crossplane.io/%s\n", kind, name)
				return
			}
			if !apierrors.IsNotFound(err) {
				fail("reading %s.pkg.crossplane.io/%s: %v", kind, name, err)
			}
		}
	case cmd == "apply-crds" && len(args) > 0:
		crds, err := envtest.InstallCRDs(cfg, envtest.CRDInstallOptions{
			Paths: args, ErrorIfPathMissing: true, MaxTime: time.Minute, PollInterval: 200 * time.Millisecond,
		})
		if err != nil {
			fail("%v", err)
		}
		fmt.Printf("%d CRDs installed and served\n", len(crds))
	case cmd == "namespace" && len(args) == 1:
		nsr := schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}
		ns := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace", "metadata": map[string]any{"name": args[0]}}}
		_, err := dyn.Resource(nsr).Create(ctx, ns, metav1.CreateOptions{})
		switch {
		case err == nil:
			fmt.Println("created")
		case apierrors.IsAlreadyExists(err):
			fmt.Println("exists")
		case apierrors.IsForbidden(err):
			// Forbidden to create says nothing of whether it is there.
			if _, gerr := dyn.Resource(nsr).Get(ctx, args[0], metav1.GetOptions{}); gerr == nil {
				fmt.Println("exists")
				return
			}
			fail("the provider's namespace %s is missing and your identity in KUBECONFIG=%s may not create it: create it, or name one that exists with ARGS=--namespace=NAME: %v", args[0], os.Getenv("KUBECONFIG"), err)
		default:
			fail("creating the provider's namespace %s: %v", args[0], err)
		}
	default:
		fail(usage)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "runcluster: "+format+"\n", args...)
	os.Exit(1)
}
