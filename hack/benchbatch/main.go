// Command benchbatch counts the backend calls of batched observation
// (internal/backend/batch): it brings N proxies of one config to Ready on
// the Proxmox fake (pvetest, every request checked against
// pve-apidoc.json) and on the Compute Engine fake (gcptest, checked
// against compute-api.json), through the real drivers, then polls every
// proxy once per poll interval, each at a random moment of it (as
// crossplane-runtime's jittered polls land), from a pool of concurrent
// workers, and prints the calls the fake received per proxy per poll, with
// the fake's schema violations (expected: none).
//
// Run it through hack/bench-batch.sh (make bench-batch). It prints
// figures; it asserts nothing.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/hack/benchutil"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

type options struct {
	n       int
	poll    time.Duration
	rounds  int
	workers int
	backend string
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 100, "Proxies of the one config.")
	flag.DurationVar(&o.poll, "poll", 8*time.Second, "Poll interval; the snapshots' max age is an eighth of it, as in the provider.")
	flag.IntVar(&o.rounds, "rounds", 3, "Polls of every proxy to count.")
	flag.IntVar(&o.workers, "workers", 10, "Concurrent Observes (the provider's --max-concurrent-reconciles).")
	flag.StringVar(&o.backend, "backend", "proxmox,gcp", "Backends to measure.")
	flag.Parse()
	benchutil.Main("benchbatch", func(ctx context.Context) error {
		for _, b := range strings.Split(o.backend, ",") {
			var err error
			switch b {
			case "proxmox":
				err = runProxmox(ctx, o)
			case "gcp":
				err = runGCP(ctx, o)
			default:
				err = fmt.Errorf("-backend: %q is neither proxmox nor gcp", b)
			}
			if err != nil {
				return err
			}
		}
		return nil
	})
}

// fleet is N requests and the status the controller would hold of each.
type fleet struct {
	reqs []proxy.Request
	refs []proxy.Ref
}

func newFleet(n int, placement proxy.Placement) *fleet {
	f := &fleet{}
	for i := range n {
		req := proxy.Request{
			Name:      fmt.Sprintf("bb-%04d", i),
			Mark:      proxy.Mark{UID: fmt.Sprintf("7d0c1a52-4a5e-4f7e-8d55-%012d", i), InstallationID: "bench"},
			Placement: placement,
			Proxy:     proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443}},
		}
		f.reqs = append(f.reqs, req)
		f.refs = append(f.refs, proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement})
	}
	return f
}

// ready brings every proxy to Ready (settle ends the fake's work in
// flight), then observes each once, as the Ready reconcile does: a direct
// read.
func (f *fleet) ready(ctx context.Context, backend string, d proxy.Driver, settle func()) error {
	benchutil.Logf("%s: bringing %d proxies to Ready", backend, len(f.reqs))
	for i := range f.reqs {
		if err := f.converge(ctx, d, i, settle); err != nil {
			return err
		}
	}
	for i := range f.refs {
		if _, err := d.Get(ctx, f.refs[i]); err != nil {
			return err
		}
	}
	return nil
}

// converge reconciles proxy i as the managed reconciler does until it is
// Ready.
func (f *fleet) converge(ctx context.Context, d proxy.Driver, i int, settle func()) error {
	for range 60 {
		inst, err := d.Get(ctx, f.refs[i])
		switch {
		case proxy.IsNotFound(err):
			inst, err = d.Create(ctx, f.reqs[i])
		case err == nil && inst.SpecHash != "" && inst.SpecHash != proxy.Hash(f.reqs[i]):
			inst, err = d.Update(ctx, f.refs[i], f.reqs[i])
		case err == nil && inst.State == proxy.StateRunning && inst.ProxyReachable:
			f.refs[i].ID, f.refs[i].Operation = inst.ID, inst.Operation
			if inst.Operation == "" {
				return nil
			}
		}
		if err == nil {
			f.refs[i].ID, f.refs[i].Operation = inst.ID, inst.Operation
		}
		settle()
		time.Sleep(5 * time.Millisecond)
	}
	return fmt.Errorf("%s did not become Ready", f.reqs[i].Name)
}

// poll observes every proxy once per round, each at a random moment of the
// round, with o.workers at a time.
func (f *fleet) poll(ctx context.Context, backend string, o options, d proxy.Driver) (notReady int, err error) {
	benchutil.Logf("%s: polling %d proxies %d times, %v apart", backend, len(f.refs), o.rounds, o.poll)
	type job struct {
		i  int
		at time.Time
	}
	start := time.Now()
	var jobs []job
	for r := range o.rounds {
		for i := range f.refs {
			jobs = append(jobs, job{i, start.Add(time.Duration(r)*o.poll + time.Duration(rand.Int64N(int64(o.poll))))})
		}
	}
	sort.Slice(jobs, func(a, b int) bool { return jobs[a].at.Before(jobs[b].at) })
	work := make(chan job)
	var mu sync.Mutex
	var wg sync.WaitGroup
	var errs []error
	for range o.workers {
		wg.Go(func() {
			for j := range work {
				time.Sleep(time.Until(j.at))
				inst, err := d.Get(ctx, f.refs[j.i])
				mu.Lock()
				switch {
				case err != nil:
					errs = append(errs, fmt.Errorf("%s: %w", f.refs[j.i].Name, err))
				case inst.State != proxy.StateRunning || !inst.ProxyReachable:
					notReady++
				}
				mu.Unlock()
			}
		})
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()
	return notReady, errors.Join(errs...)
}

func report(backend string, o options, calls map[string]int, total int, notReady int, violations []string) {
	polls := float64(o.n * o.rounds)
	fmt.Printf("\n%s: %d proxies of one config, %d polls each (%v apart, random moments), %d concurrent Observes, snapshots at most %v old\n",
		backend, o.n, o.rounds, o.poll, o.workers, o.poll/8)
	fmt.Printf("  backend calls per proxy per poll: %.3f (%d calls for %.0f Observes; target under 0.1 at 100 or more proxies)\n", float64(total)/polls, total, polls)
	var rows []string
	for k, v := range calls {
		rows = append(rows, fmt.Sprintf("    %-60s %d", k, v))
	}
	sort.Strings(rows)
	fmt.Println(strings.Join(rows, "\n"))
	fmt.Printf("  Observes that did not read Ready: %d\n", notReady)
	fmt.Printf("  requests or answers off the published schema: %d\n", len(violations))
	for _, v := range violations {
		fmt.Printf("    %s\n", v)
	}
}

func runProxmox(ctx context.Context, o options) error {
	fake, err := pvetest.Start(pvetest.Options{Durations: pvetest.FastDurations})
	if err != nil {
		return err
	}
	defer fake.Close()
	ca := fake.CAPEM()
	shared := &proxmox.Shared{ObserveMaxAge: o.poll / 8}
	d, err := proxmox.New(proxmox.Options{
		Provider: "ClusterProviderConfig bench-pve",
		Config: proxmox.Config{
			URL: fake.URL, Nodes: []string{"pve1", "pve2"}, ISOStorage: "local", Bridge: "vmbr0", DiskGiB: 10, InstallGuestAgent: true,
			Templates:    map[string]int{"debian-12": 9000},
			MachineTypes: map[string]proxmox.MachineType{"small": {Cores: 1, MemoryMiB: 1024}},
		},
		Credentials: func(context.Context) (proxmox.Credentials, error) {
			return proxmox.Credentials{Token: fake.Token(), CA: ca}, nil
		},
		Prober: &squid.Prober{Ask: fake.AskSquid},
		Shared: shared,
	})
	if err != nil {
		return err
	}
	f := newFleet(o.n, proxy.Placement{Location: "pve1", MachineType: "small", Image: "debian-12"})
	if err := f.ready(ctx, "proxmox", d, fake.FinishTasks); err != nil {
		return err
	}
	before := len(fake.Requests())
	notReady, err := f.poll(ctx, "proxmox", o, d)
	if err != nil {
		return err
	}
	reqs := fake.Requests()[before:]
	calls := map[string]int{}
	for _, r := range reqs {
		calls[r.Endpoint]++
	}
	report("proxmox", o, calls, len(reqs), notReady, fake.Violations())
	return nil
}

type cleanups []func()

func (c *cleanups) Cleanup(f func()) { *c = append(*c, f) }

func runGCP(ctx context.Context, o options) error {
	var cl cleanups
	defer func() {
		for i := len(cl) - 1; i >= 0; i-- {
			cl[i]()
		}
	}()
	srv := gcptest.New(&cl, "egressproxy-bench")
	srv.AutoComplete(time.Nanosecond)
	api, err := gcp.NewSDK(ctx, srv.Project, option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		return err
	}
	defer func() { _ = api.Close() }()
	d := gcp.New(gcp.Options{
		Provider: "ClusterProviderConfig bench-gcp",
		Config: gcp.Config{Project: srv.Project, Network: "default",
			Images:       map[string]string{"ubuntu-2404": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
			MachineTypes: map[string]string{"small": "e2-small"}},
		API:           api,
		Prober:        &squid.Prober{Ask: srv.AskSquid},
		ObserveMaxAge: o.poll / 8,
	})
	f := newFleet(o.n, proxy.Placement{Location: "europe-west1-b", MachineType: "small", Image: "ubuntu-2404"})
	for i := range f.reqs {
		f.reqs[i].Extension = gcp.Exposure{AddressType: gcp.AddressEphemeral}
	}
	if err := f.ready(ctx, "gcp", d, srv.SettleAll); err != nil {
		return err
	}
	srv.ResetRequests()
	notReady, err := f.poll(ctx, "gcp", o, d)
	if err != nil {
		return err
	}
	reqs := srv.Requests()
	calls := map[string]int{}
	for _, r := range reqs {
		k, _, _ := strings.Cut(r, "?")
		calls[k]++
	}
	report("gcp", o, calls, len(reqs), notReady, srv.Violations())
	return nil
}
