// Command benchstart measures the provider's start: from exec until its
// /readyz answers 200, and until the first reconcile of a managed
// resource that exists already (Ready, created by an earlier run of the
// provider). It starts a local control plane (internal/devenv/controlplane), runs
// the benchmark's provider (hack/benchprovider: the KVMProxy kind on the
// in-memory reference driver, so no backend is in the way) once to make
// the resource Ready, then starts it -rounds times and prints each round
// and min/median/max, with the provider's own log lines on the way
// (relative to the exec) so that where the time goes can be read off.
//
// Run it through hack/bench-start.sh (make bench-start). It prints
// figures; it asserts nothing.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/cache"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/hack/benchutil"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

const controllerName = "kvmproxy.proxy.m.egressproxy.io"

func main() {
	rounds := flag.Int("rounds", 5, "Provider starts to measure.")
	provider := flag.String("provider", "bin/benchprovider", "The provider binary: hack/benchprovider's.")
	timeline := flag.Bool("timeline", true, "Print the provider's log lines of the median round, relative to its exec.")
	keep := flag.Bool("keep-logs", false, "Keep the control plane's and the provider's logs.")
	args := flag.String("provider-args", "", "Extra provider flags, space-separated.")
	ownID := flag.Bool("own-installation-id", true, "Start the provider without --installation-id, as installed: it reads (the first time, makes) its ConfigMap.")
	flag.Parse()
	benchutil.Main("benchstart", func(ctx context.Context) error {
		return run(ctx, *rounds, *provider, *timeline, *keep, *ownID, strings.Fields(*args))
	})
}

type round struct {
	readyz, reconcile, started time.Duration
	log                        []string
}

func run(ctx context.Context, rounds int, binary string, timeline, keep, ownID bool, extra []string) error {
	cl, err := benchutil.StartCluster(ctx, benchutil.ClusterOptions{Name: "benchstart", KeepLogs: keep, Namespaces: []string{"crossplane-system", "bench"}})
	if err != nil {
		return err
	}
	defer func() { _ = cl.Stop() }()
	kube := cl.Client
	if err := benchutil.CreateMemoryConfig(ctx, kube); err != nil {
		return err
	}
	if err := kube.Create(ctx, benchutil.MemoryProxy("existing", false)); err != nil {
		return err
	}
	state := filepath.Join(cl.Dir, "backend.jsonl")
	ready, err := benchutil.WatchReady(ctx, cl.Config, cache.Options{Scheme: cl.Scheme}, &nsproxy.KVMProxy{}, nil)
	if err != nil {
		return err
	}
	// The first run makes the resource Ready: what the next ones find.
	p, err := start(ctx, cl, binary, state, "provider-0.log", "", ownID, extra)
	if err != nil {
		return err
	}
	ok, err := ready.Await(ctx, 1, 2*time.Minute, 10*time.Second, func(int) {})
	p.Stop()
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("the KVMProxy did not become Ready:\n%s", p.LogTail(20))
	}

	var all []round
	for i := range rounds {
		r, err := measure(ctx, cl, binary, state, fmt.Sprintf("provider-%d.log", i+1), ownID, extra)
		if err != nil {
			return fmt.Errorf("round %d: %w", i+1, err)
		}
		benchutil.Logf("round %d: /readyz %.3f s, first reconcile %.3f s, \"provider started\" %.3f s (load %s)",
			i+1, r.readyz.Seconds(), r.reconcile.Seconds(), r.started.Seconds(), benchutil.Load())
		all = append(all, r)
	}
	fmt.Printf("\nStart benchmark: %s, one existing Ready KVMProxy (in-memory backend), %d starts\n", binary, rounds)
	fmt.Printf("machine: %d CPUs shared with kube-apiserver and etcd; load %s\n\n", benchutil.NumCPU(), benchutil.Load())
	pick := func(f func(round) time.Duration) string {
		var d []time.Duration
		for _, r := range all {
			d = append(d, f(r))
		}
		sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
		return fmt.Sprintf("%.3f / %.3f / %.3f s", d[0].Seconds(), d[len(d)/2].Seconds(), d[len(d)-1].Seconds())
	}
	fmt.Printf("exec -> /readyz 200 (min/median/max):                   %s\n", pick(func(r round) time.Duration { return r.readyz }))
	fmt.Printf("exec -> first reconcile of the existing resource:       %s (target under 1 s)\n", pick(func(r round) time.Duration { return r.reconcile }))
	fmt.Printf("exec -> its \"provider started\" log line:               %s\n", pick(func(r round) time.Duration { return r.started }))
	if timeline {
		sort.Slice(all, func(i, j int) bool { return all[i].reconcile < all[j].reconcile })
		fmt.Printf("\nthe median round's log, seconds after exec:\n%s\n", strings.Join(all[len(all)/2].log, "\n"))
	}
	return nil
}

func start(ctx context.Context, cl *benchutil.Cluster, binary, state, logName, health string, ownID bool, extra []string) (*benchutil.Provider, error) {
	return benchutil.StartProvider(ctx, benchutil.ProviderOptions{
		Binary: binary, Kubeconfig: cl.CP.KubeconfigPath, LogPath: filepath.Join(cl.Dir, logName),
		Health: health, OwnInstallationID: ownID, Args: append([]string{"--debug", "--log-format", "json"}, extra...),
		Env: []string{"EGRESSPROXY_BENCH_STATE=" + state},
	})
}

// measure starts the provider and polls its /readyz and metrics every
// 5 ms.
func measure(ctx context.Context, cl *benchutil.Cluster, binary, state, logName string, ownID bool, extra []string) (round, error) {
	var r round
	port, err := controlplane.FreePort()
	if err != nil {
		return r, err
	}
	health := fmt.Sprintf("127.0.0.1:%d", port)
	p, err := start(ctx, cl, binary, state, logName, health, ownID, extra)
	if err != nil {
		return r, err
	}
	defer p.Stop()
	want := `controller_runtime_reconcile_total{controller="managed/` + controllerName + `",result="success"}`
	deadline := time.Now().Add(time.Minute)
	for r.readyz == 0 || r.reconcile == 0 {
		at := time.Since(p.Started)
		if r.readyz == 0 {
			if resp, err := http.Get("http://" + health + "/readyz"); err == nil { //nolint:noctx // Loopback, answered at once.
				_ = resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					r.readyz = at
				}
			}
		}
		if r.reconcile == 0 {
			if text, err := p.Scrape(ctx); err == nil && benchutil.MetricSum(text, strings.SplitN(want, "{", 2)[0], `controller="managed/`+controllerName+`"`) > 0 {
				r.reconcile = at
			}
		}
		select {
		case <-p.Exited:
			return r, fmt.Errorf("the provider exited:\n%s", p.LogTail(20))
		case <-ctx.Done():
			return r, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return r, fmt.Errorf("not serving after a minute (readyz %v, reconcile %v):\n%s", r.readyz, r.reconcile, p.LogTail(20))
		}
	}
	p.Stop()
	r.log, r.started = timeline(filepath.Join(cl.Dir, logName), p.Started)
	return r, nil
}

// timeline reads the provider's JSON log: each line's time after exec and
// message, and the time of "provider started".
func timeline(path string, exec time.Time) ([]string, time.Duration) {
	f, err := os.Open(path)
	if err != nil {
		return nil, 0
	}
	defer f.Close()
	var out []string
	var started time.Duration
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var l struct {
			TS         time.Time `json:"ts"`
			Msg        string    `json:"msg"`
			Logger     string    `json:"logger"`
			Controller string    `json:"controller"`
			Source     string    `json:"source"`
			Startup    string    `json:"startupSeconds"`
		}
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.TS.IsZero() {
			continue
		}
		at := l.TS.Sub(exec)
		if l.Msg == "provider started" {
			if s, err := time.ParseDuration(l.Startup + "s"); err == nil {
				started = s
			}
		}
		if at > 3*time.Second {
			break
		}
		out = append(out, fmt.Sprintf("  %6.3f  %s %s %s %s", at.Seconds(), l.Logger, l.Msg, l.Controller, l.Source))
	}
	return out, started
}
