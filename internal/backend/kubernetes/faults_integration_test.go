package kubernetes_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"syscall"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// cutter cuts the connection of one write (the n-th POST, PUT, PATCH or
// DELETE it sees): before the API server has it, or after the server acted
// and before its answer arrives, which is where a provider loses track.
type cutter struct {
	next http.RoundTripper

	mu     sync.Mutex
	at     int // the write to cut, counted from 0; -1 for none
	after  bool
	writes int
	cut    bool
}

func (c *cutter) arm(at int, after bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at, c.after, c.writes, c.cut = at, after, 0, false
}

func (c *cutter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	cut := false
	if r.Method != http.MethodGet {
		cut = c.writes == c.at
		c.writes++
		c.cut = c.cut || cut
	}
	after := c.after
	c.mu.Unlock()
	if !cut {
		return c.next.RoundTrip(r)
	}
	if !after {
		return nil, &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	}
	resp, err := c.next.RoundTrip(r)
	if err == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
	}
	return nil, io.ErrUnexpectedEOF
}

func (c *cutter) didCut() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.cut
}

// faultTests: the connection to the API server cut in the middle of each
// write of a Create, before the server has it and after it acted, then of
// the Delete's Deployment. Each cut is a Transient error; the next Create
// finishes the proxy with exactly one Deployment, Secret and Service; the
// next Delete removes all of it.
func (e *env) faultTests(t *testing.T) {
	ctx := context.Background()
	for _, after := range []bool{false, true} {
		for at := 0; ; at++ {
			c := &cutter{at: -1}
			cfg := rest.CopyConfig(e.cp.Config)
			cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper { c.next = rt; return c }
			kube, err := client.New(cfg, client.Options{Scheme: e.scheme})
			if err != nil {
				t.Fatal(err)
			}
			ns := e.namespace(t)
			d := kubernetes.New(kubernetes.Options{Provider: testProvider, Config: kubernetes.Config{Namespace: ns}, Client: kube, Live: kube,
				Version: e.remote.Version, Host: e.cp.Config.Host, DialPods: true})
			req := request("cut")
			req.Extension = kubernetes.Exposure{ServiceType: "ClusterIP"}

			c.arm(at, after)
			_, err = d.Create(ctx, req)
			if !c.didCut() {
				if err != nil {
					t.Fatalf("Create with no cut: %v", err)
				}
				if at < 2 {
					t.Fatalf("a Create made only %d writes: the cuts tried nothing", at)
				}
				break
			}
			where := fmt.Sprintf("write %d cut %s", at, map[bool]string{false: "before the server has it", true: "after the server acted"}[after])
			t.Run(fmt.Sprintf("Create/%d/after=%v", at, after), func(t *testing.T) {
				if !proxy.IsTransient(err) {
					t.Fatalf("Create, %s = %v; want Transient", where, err)
				}
				c.arm(-1, false)
				inst, err := d.Create(ctx, req)
				for i := 0; err != nil && proxy.IsTransient(err) && i < 5; i++ {
					inst, err = d.Create(ctx, req)
				}
				if err != nil {
					t.Fatalf("Create after the cut (%s) = %v; want it finished", where, err)
				}
				counts := map[string]int{}
				var deps appsv1.DeploymentList
				var secrets corev1.SecretList
				var svcs corev1.ServiceList
				for _, l := range []client.ObjectList{&deps, &secrets, &svcs} {
					if err := e.live.List(ctx, l, client.InNamespace(ns), client.MatchingLabels{kubernetes.LabelUID: req.Mark.UID}); err != nil {
						t.Fatal(err)
					}
				}
				counts["Deployment"], counts["Secret"], counts["Service"] = len(deps.Items), len(secrets.Items), len(svcs.Items)
				for kind, n := range counts {
					if n != 1 {
						t.Errorf("after %s and a Create: %d %ss of the proxy; want 1", where, n, kind)
					}
				}

				// The Delete's first write, the Secret's deletecollection,
				// is best effort; its second is the Deployment's.
				c.arm(1, after)
				if err := d.Delete(ctx, proxy.Ref{ID: inst.ID, Mark: req.Mark}); !proxy.IsTransient(err) {
					t.Errorf("Delete with its Deployment's write cut = %v; want Transient", err)
				}
				c.arm(-1, false)
				waitFor(t, "the proxy to be gone after Delete", func() (bool, string) {
					if err := d.Delete(ctx, proxy.Ref{ID: inst.ID, Mark: req.Mark}); err != nil {
						return false, "Delete: " + err.Error()
					}
					_, err := d.Get(ctx, proxy.Ref{ID: inst.ID, Mark: req.Mark})
					return proxy.IsNotFound(err), fmt.Sprintf("Get: %v", err)
				})
			})
		}
	}
}
