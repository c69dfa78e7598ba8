// Command benchnode measures the local node (internal/devenv/controlplane's
// Options.Node) and PodProxy on it. For each of -rounds rounds it starts a
// control plane with a node and the Squid image of hack/squid-image.sh, runs
// the provider binary on it, creates -proxies PodProxies one after another
// (each waited for until Ready), deletes them, and stops everything. It
// prints, per round and as min/median/max over the rounds:
//
//   - the control plane's start (etcd, kube-apiserver, CRDs, controller
//     manager) and the node's (containerd, images, kubelet, scheduler,
//     kube-proxy, until the Node is Ready and schedulable);
//   - each PodProxy's create-to-Ready on a real pod (image present, so no
//     pull: sandbox, container start, readiness probe, the provider's
//     reachability check);
//   - the stop (every pod removed, the machine swept).
//
// Run it through hack/bench-node.sh (as root). The binaries and the image
// are built first, so this is the warm start; their cold build times are
// those of hack/node-bins.sh and hack/squid-image.sh.
package main

import (
	"context"
	"flag"
	"fmt"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/hack/benchutil"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

func main() {
	rounds := flag.Int("rounds", 3, "control planes with a node to start, one after another")
	proxies := flag.Int("proxies", 3, "PodProxies per round, created one after another")
	provider := flag.String("provider", "bin/provider", "the provider binary")
	image := flag.String("image", "", "Squid image tarball (default: hack/squid-image.sh's)")
	ref := flag.String("image-ref", "", "its name (default: hack/squid-image.sh's)")
	flag.Parse()
	benchutil.Main("benchnode", func(ctx context.Context) error { return run(ctx, *rounds, *proxies, *provider, *image, *ref) })
}

type round struct {
	controlPlane, node, stop, imports time.Duration
	ready                             []time.Duration
}

func run(ctx context.Context, rounds, proxies int, provider, image, ref string) error {
	root, err := controlplane.RepoRoot()
	if err != nil {
		return err
	}
	if image == "" {
		out, err := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "squid-image.sh")).Output()
		if err != nil {
			return fmt.Errorf("hack/squid-image.sh: %w", err)
		}
		f := strings.Fields(string(out))
		if len(f) < 2 {
			return fmt.Errorf("hack/squid-image.sh printed %q", out)
		}
		image, ref = f[0], f[1]
	}
	var all []round
	for i := range rounds {
		r, err := oneRound(ctx, proxies, provider, image, ref)
		if err != nil {
			return fmt.Errorf("round %d: %w", i+1, err)
		}
		fmt.Printf("round %d: control plane %.2fs, node %.2fs (importing the images %.2fs), PodProxy create-to-Ready %s, stop %.2fs\n",
			i+1, r.controlPlane.Seconds(), r.node.Seconds(), r.imports.Seconds(), seconds(r.ready), r.stop.Seconds())
		all = append(all, r)
	}
	var cps, nodes, imports, stops, ready []time.Duration
	for _, r := range all {
		cps, nodes, stops = append(cps, r.controlPlane), append(nodes, r.node), append(stops, r.stop)
		imports = append(imports, r.imports)
		ready = append(ready, r.ready...)
	}
	fmt.Printf("control plane start (min/median/max): %s\n", spread(cps))
	fmt.Printf("node start, warm (min/median/max):    %s\n", spread(nodes))
	fmt.Printf("  of which importing the images:      %s\n", spread(imports))
	fmt.Printf("PodProxy create-to-Ready on a real pod (min/median/max of %d): %s\n", len(ready), spread(ready))
	fmt.Printf("stop (min/median/max):                %s\n", spread(stops))
	return nil
}

func oneRound(ctx context.Context, proxies int, provider, image, ref string) (r round, err error) {
	start := time.Now()
	cl, err := benchutil.StartCluster(ctx, benchutil.ClusterOptions{Name: "benchnode",
		ControlPlane: controlplane.Options{Node: &controlplane.NodeOptions{Images: []string{image}}},
		Namespaces:   []string{"crossplane-system", "egress-proxies", "bench"}})
	if err != nil {
		return r, err
	}
	cp, kube := cl.CP, cl.Client
	defer func() {
		if cl != nil {
			_ = cl.Stop()
		}
	}()
	total := time.Since(start)
	r.node, r.imports, r.controlPlane = cp.Node.ReadyIn, cp.Node.ImportIn, total-cp.Node.ReadyIn

	if err := benchutil.CreatePodsConfig(ctx, kube, ref, true); err != nil {
		return r, err
	}
	// Its controllers running before the first create, so that
	// create-to-Ready is the PodProxy's and not the provider's start.
	prov, err := benchutil.StartProvider(ctx, benchutil.ProviderOptions{
		Binary: provider, Kubeconfig: cp.KubeconfigPath, LogPath: filepath.Join(cp.Dir, "provider.log"),
		Args: []string{"--poll-not-ready", "30s"}, Controller: "podproxy.proxy.m.egressproxy.io",
	})
	if err != nil {
		return r, err
	}
	// Before the control plane: its watches would hold kube-apiserver's
	// shutdown up.
	defer prov.Stop()

	for i := range proxies {
		p := &nsproxy.PodProxy{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "bench"},
			Spec: nsproxy.PodProxySpec{
				ManagedResourceSpec: xpv2.ManagedResourceSpec{ProviderConfigReference: &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "pods"}},
				ForProvider:         spec.PodProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{cp.Node.PodCIDR.String()}}},
			},
		}
		t0 := time.Now()
		if err := kube.Create(ctx, p); err != nil {
			return r, err
		}
		for {
			if err := kube.Get(ctx, client.ObjectKeyFromObject(p), p); err != nil {
				return r, err
			}
			if p.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue {
				break
			}
			if time.Since(t0) > 3*time.Minute {
				return r, fmt.Errorf("PodProxy %s not Ready after 3m: %+v", p.Name, p.GetCondition(xpv2.TypeReady))
			}
			select {
			case <-ctx.Done():
				return r, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
		r.ready = append(r.ready, time.Since(t0))
	}
	for i := range proxies {
		p := &nsproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p%d", i), Namespace: "bench"}}
		if err := kube.Delete(ctx, p); err != nil {
			return r, err
		}
	}
	prov.Stop()
	t0 := time.Now()
	err = cl.Stop()
	cl = nil
	r.stop = time.Since(t0)
	return r, err
}

func seconds(ds []time.Duration) string {
	var s []string
	for _, d := range ds {
		s = append(s, fmt.Sprintf("%.2fs", d.Seconds()))
	}
	return strings.Join(s, " ")
}

func spread(ds []time.Duration) string {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s) == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2fs / %.2fs / %.2fs", s[0].Seconds(), s[len(s)/2].Seconds(), s[len(s)-1].Seconds())
}
