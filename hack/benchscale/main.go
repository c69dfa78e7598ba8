// Command benchscale measures one provider process holding many managed
// resources: it starts a local control plane (internal/devenv/controlplane), runs
// the benchmark's provider (hack/benchprovider: the KVMProxy kind on the
// in-memory reference driver, so the backend costs nothing and the provider and the control plane are what is
// measured), creates KVMProxies in stages (1,000, 5,000, 10,000 by
// default, up to -n) and prints, at each stage:
//
//   - the time from the stage's first create until all of its resources
//     are Ready (this program's watch saw Ready=True);
//   - the provider's peak RSS (VmHWM) and its steady RSS after a poll
//     interval at rest, split anonymous / file-backed, and the slope of
//     the anonymous part per resource between stages;
//   - at steady state, over one poll interval: the provider's CPU seconds
//     per reconcile (every Ready resource is observed once a poll, so per
//     resource per poll), the reconciles against the N x window / poll
//     expected, and the API writes (target: none), split by resource and
//     verb (hack/benchprovider counts its requests); the
//     window starts once the provider has sent no write for 5 s, and the
//     writes from Ready until then are printed apart;
//
// then restarts the provider with every resource Ready and prints the
// time until the new process has observed each one again (its
// egressproxy_bench_observed_instances metric) and the API writes that
// caused, counted at the provider and at the API server (target: none).
//
// Run it through hack/bench-scale.sh. It prints figures; it asserts
// nothing.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/hack/benchutil"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

type options struct {
	benchutil.ProviderFlags
	n       int
	stages  string
	poll    time.Duration
	jitter  time.Duration
	timeout time.Duration
	restart bool
	secrets bool
	profile string
	heap    string
}

const ctlFilter = `controller="managed/kvmproxy.`

func main() {
	var o options
	flag.IntVar(&o.n, "n", 10000, "Managed resources in the end.")
	flag.StringVar(&o.stages, "stages", "", "Comma-separated resource counts to measure at on the way to -n (default: 1000, 5000 and 10000 below -n, and -n).")
	o.Register("bin/benchprovider")
	flag.DurationVar(&o.poll, "poll", time.Minute, "The provider's --poll: how often a Ready resource is observed; the steady-state window is one poll.")
	flag.DurationVar(&o.jitter, "poll-jitter", 10*time.Second, "The provider's --poll-jitter.")
	flag.DurationVar(&o.timeout, "timeout", 15*time.Minute, "Give up waiting for a stage after this long.")
	flag.BoolVar(&o.restart, "restart", true, "Restart the provider at the end and measure the re-observation.")
	flag.BoolVar(&o.secrets, "connection-secrets", true, "Give every resource a connection Secret (writeConnectionSecretToRef).")
	flag.StringVar(&o.profile, "provider-profile", "", "Write the provider's CPU profile over the last stage's steady-state window to this file.")
	flag.StringVar(&o.heap, "provider-heap", "", "Write the provider's heap profile, taken after the last stage's steady state, to this file.")
	flag.Parse()
	benchutil.Main("benchscale", func(ctx context.Context) error { return run(ctx, o) })
}

func stageList(o options) ([]int, error) {
	var out []int
	if o.stages == "" {
		for _, s := range []int{1000, 5000, 10000} {
			if s < o.n {
				out = append(out, s)
			}
		}
	} else {
		for _, f := range strings.Split(o.stages, ",") {
			v, err := strconv.Atoi(strings.TrimSpace(f))
			if err != nil || v <= 0 || v > o.n {
				return nil, fmt.Errorf("-stages: %q is not a count between 1 and -n (%d)", f, o.n)
			}
			out = append(out, v)
		}
	}
	out = append(out, o.n)
	sort.Ints(out)
	return slicesCompact(out), nil
}

func slicesCompact(s []int) []int {
	var out []int
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// stage is what was measured at one count.
type stage struct {
	n     int
	ready time.Duration
	// readyCPU is the provider's CPU seconds from the stage's first create
	// until all were Ready: the managed-resource machinery without a
	// backend's own objects, beside bench-podproxy's figure.
	readyCPU float64
	peakKiB  int
	// peakAnonKiB and peakFileKiB split the sampled peak RSS so far.
	peakAnonKiB, peakFileKiB int
	// pages is the binary's resident sections when all were Ready.
	pages string
	// events are the provider's event counts at the steady window's end,
	// eventRequests the events it sent during the window.
	events           benchutil.Events
	eventRequests    float64
	anonKiB, fileKiB int
	cpuPerPoll       float64 // seconds
	reconciles       float64
	expected         float64
	writes           float64
	writesBy         map[string]float64 // "resource VERB" (counted by hack/benchprovider)
	// settleWrites are the writes from Ready to the window (the last
	// creates finishing), settleWritesBy split as writesBy.
	settleWrites   float64
	settleWritesBy map[string]float64
	reads          float64
	load           string
}

func run(ctx context.Context, o options) error {
	stages, err := stageList(o)
	if err != nil {
		return err
	}
	cl, err := benchutil.StartCluster(ctx, benchutil.ClusterOptions{Name: "benchscale", KeepLogs: o.KeepLogs,
		Namespaces: []string{"crossplane-system", "bench"}})
	if err != nil {
		return err
	}
	defer func() { _ = cl.Stop() }()
	cp, s, cfg, kube, dir := cl.CP, cl.Scheme, cl.Config, cl.Client, cl.Dir
	if err := benchutil.CreateMemoryConfig(ctx, kube); err != nil {
		return err
	}

	state := filepath.Join(dir, "backend.jsonl")
	prov, err := startProvider(ctx, o, cp, dir, state, "provider.log")
	if err != nil {
		return err
	}
	defer func() { prov.Stop() }()
	startRSS, _ := benchutil.PeakRSS(prov.PID)
	startPages := benchutil.BinaryPagesLine(prov.PID)
	rss := benchutil.SampleRSS(prov.PID, 100*time.Millisecond)
	defer rss.Stop()
	runDir := filepath.Join(benchutil.DataDir(), "scale-"+time.Now().UTC().Format("20060102T150405"))
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return err
	}
	var heapTops []string

	ready, err := benchutil.WatchReady(ctx, cfg, cache.Options{Scheme: s}, &nsproxy.KVMProxy{}, nil)
	if err != nil {
		return err
	}

	var results []stage
	created := 0
	for _, target := range stages {
		benchutil.Logf("creating KVMProxies %d to %d (%d in parallel)", created, target-1, o.Creators)
		t0 := time.Now()
		cpu0, _ := benchutil.CPUSeconds(prov.PID)
		from := created
		if err := benchutil.InParallel(target-from, o.Creators, func(i int) error {
			return kube.Create(ctx, benchutil.MemoryProxy(fmt.Sprintf("s-%05d", from+i), o.secrets))
		}); err != nil {
			return err
		}
		created = target
		benchutil.Logf("created in %.1f s; waiting for all %d to be Ready", time.Since(t0).Seconds(), target)
		if err := waitReady(ctx, o, ready, target); err != nil {
			return err
		}
		st := stage{n: target, ready: time.Since(t0), load: benchutil.Load()}
		if cpu1, err := benchutil.CPUSeconds(prov.PID); err == nil {
			st.readyCPU = cpu1 - cpu0
		}
		st.peakKiB, _ = benchutil.PeakRSS(prov.PID)
		st.peakAnonKiB, st.peakFileKiB = rss.Peak()
		st.pages = benchutil.BinaryPagesLine(prov.PID)
		benchutil.Logf("all %d Ready after %.1f s; measuring the steady state for one poll (%v)", target, st.ready.Seconds(), o.poll)
		profile := ""
		if target == stages[len(stages)-1] {
			profile = o.profile
		}
		if err := steady(ctx, o, prov, &st, profile); err != nil {
			return err
		}
		results = append(results, st)
		printStage(st)
		heap := filepath.Join(runDir, fmt.Sprintf("heap-%d.pprof", target))
		if o.heap != "" && target == stages[len(stages)-1] {
			heap = o.heap
		}
		if err := prov.SaveProfile(ctx, "heap", heap); err != nil {
			benchutil.Logf("provider heap profile: %v", err)
		} else if top, err := benchutil.PprofTop(ctx, o.Provider, []string{heap}, 15, "-sample_index=inuse_space"); err == nil {
			heapTops = append(heapTops, fmt.Sprintf("provider heap at %d after the steady state (%s), top holders of live memory:\n%s", target, heap, benchutil.Indent(top, "  ")))
		}
		if _, err := benchutil.AppendResult("scale", map[string]any{
			"at": time.Now().UTC().Format(time.RFC3339), "n": target, "load": st.load, "stageReadySeconds": st.ready.Seconds(), "stageCPUSeconds": st.readyCPU,
			"peakRSSMiB": float64(st.peakKiB) / 1024, "peakAnonMiB": float64(st.peakAnonKiB) / 1024, "peakFileMiB": float64(st.peakFileKiB) / 1024,
			"steadyAnonMiB": float64(st.anonKiB) / 1024, "steadyFileMiB": float64(st.fileKiB) / 1024, "cpuPerResourcePerPollMs": 1000 * st.cpuPerPoll, "writesAtRest": st.writes,
		}); err != nil {
			benchutil.Logf("results: %v", err)
		}
	}

	var rs *restartResult
	if o.restart {
		benchutil.Logf("restarting the provider with %d Ready resources", created)
		r, p, err := restart(ctx, o, cp, cfg, dir, state, prov, created)
		if p != nil {
			prov = p
		}
		if err != nil {
			return err
		}
		rs = r
	}

	fmt.Printf("\nScale benchmark: %d KVMProxies (namespaced, one ClusterProviderConfig%s) on the in-memory reference driver\n", o.n, map[bool]string{true: ", connection Secrets", false: ""}[o.secrets])
	fmt.Printf("provider: %s --poll %v --poll-jitter %v --max-reconcile-rate %d --max-concurrent-reconciles %d%s\n",
		o.Provider, o.poll, o.jitter, o.Rate, o.Concurrent, map[bool]string{true: " (env " + o.Env + ")", false: ""}[o.Env != ""])
	fmt.Printf("machine: %d CPUs shared by kube-apiserver, etcd, the provider and this program; load (1, 5, 15 min) is given per figure\n", benchutil.NumCPU())
	fmt.Printf("provider RSS before the first create: peak %.1f MiB; the binary resident %s\n\n", float64(startRSS)/1024, startPages)
	fmt.Printf("%8s %10s %10s %22s %14s %30s %8s %8s  %s\n", "N", "all Ready", "peak RSS", "steady RSS anon+file", "anon slope", "CPU per resource/poll", "GETs", "writes", "load")
	for i, st := range results {
		slope := "-"
		if i > 0 {
			prev := results[i-1]
			slope = fmt.Sprintf("%.1f KiB/MR", float64(st.anonKiB-prev.anonKiB)/float64(st.n-prev.n))
		}
		fmt.Printf("%8d %9.1fs %7.1f MiB %9.1f + %5.1f MiB %14s %12.3f ms (%3.0f%% polled) %8.0f %8.0f  %s\n", st.n, st.ready.Seconds(), float64(st.peakKiB)/1024,
			float64(st.anonKiB)/1024, float64(st.fileKiB)/1024, slope, 1000*st.cpuPerPoll, 100*st.reconciles/st.expected, st.reads, st.writes, st.load)
	}
	fmt.Printf("\n  all Ready: from the stage's first create until this program saw every resource of the stage Ready=True\n")
	for i, st := range results {
		made := st.n
		if i > 0 {
			made -= results[i-1].n
		}
		fmt.Printf("  provider CPU from the first create of the stage at %d until all Ready: %.2f s (%.2f ms per resource created)\n", st.n, st.readyCPU, 1000*st.readyCPU/float64(made))
	}
	fmt.Printf("  steady RSS: after one poll interval at rest; CPU: the provider's CPU over that poll divided by its reconciles\n")
	fmt.Printf("  (each Ready resource is observed once a poll; %% polled is those reconciles against N x window / poll)\n")
	fmt.Printf("  GETs, writes: the provider's GET and other requests over that window (target 0 writes)\n")
	for _, st := range results {
		fmt.Printf("  events at %d, at the steady window's end: %s since the provider started; %.0f of them sent in the window (the creates', at the provider's event rate; not counted as writes at rest)\n", st.n, st.events, st.eventRequests)
	}
	for _, st := range results {
		fmt.Printf("  peak RSS at %d, sampled every 100 ms: anonymous %.1f + file-backed %.1f MiB (target at Go's defaults: under 200 MiB at 10,000)\n",
			st.n, float64(st.peakAnonKiB)/1024, float64(st.peakFileKiB)/1024)
		fmt.Printf("    the binary resident: %s\n", st.pages)
	}
	for _, t := range heapTops {
		fmt.Printf("\n%s\n", t)
	}
	for _, st := range results {
		if st.writes > 0 {
			fmt.Printf("  writes at rest at %d, by resource and verb: %s\n", st.n, formatCounts(st.writesBy))
		}
		fmt.Printf("  writes at %d after all were Ready, before the window (the last creates finishing): %.0f (%s)\n", st.n, st.settleWrites, formatCounts(st.settleWritesBy))
	}
	if rs != nil {
		fmt.Printf("\nrestart with %d Ready: every resource observed again %.1f s after the new process started (%.1f s after its controllers did); load %s\n",
			created, rs.observed.Seconds(), rs.sinceControllers.Seconds(), rs.load)
		fmt.Printf("  API writes it caused: %.0f at the provider (%s), %.0f at the API server (%s)\n",
			benchutil.Writes(rs.provWrites), formatCounts(rs.provWrites), benchutil.Writes(rs.apiWrites), formatCounts(rs.apiWrites))
		fmt.Printf("  the provider's writes by resource and verb: %s\n", formatCounts(rs.provWritesBy))
		fmt.Printf("  new process: peak RSS %.1f MiB, CPU %.1f s until all were observed\n", float64(rs.peakKiB)/1024, rs.cpu)
	}
	if o.KeepLogs {
		fmt.Printf("\nlogs in %s\n", dir)
	}
	return nil
}

func printStage(st stage) {
	benchutil.Logf("N=%d: all Ready %.1f s (provider CPU %.2f s), peak RSS %.1f MiB, steady anon %.1f + file %.1f MiB, %.3f ms CPU per resource per poll, %.0f writes (%s; load %s)",
		st.n, st.ready.Seconds(), st.readyCPU, float64(st.peakKiB)/1024, float64(st.anonKiB)/1024, float64(st.fileKiB)/1024, 1000*st.cpuPerPoll, st.writes, formatCounts(st.writesBy), st.load)
}

func formatCounts(m map[string]float64) string {
	var rows []string
	for k, v := range m {
		rows = append(rows, fmt.Sprintf("%s %.0f", k, v))
	}
	sort.Strings(rows)
	if len(rows) == 0 {
		return "none"
	}
	return strings.Join(rows, ", ")
}

func waitReady(ctx context.Context, o options, ready *benchutil.Readiness, target int) error {
	ok, err := ready.Await(ctx, target, o.timeout, 10*time.Second, func(n int) {
		benchutil.Logf("%d of %d Ready (load %s)", n, target, benchutil.Load())
	})
	if err == nil && !ok {
		err = fmt.Errorf("only %d of %d Ready after %v", ready.Len(), target, o.timeout)
	}
	return err
}

// steady waits for the reconciles that follow Ready to settle (a quarter
// poll, and until the provider has sent no write for quietFor), then
// measures one poll interval.
func steady(ctx context.Context, o options, p *benchutil.Provider, st *stage, profile string) error {
	before, err := p.Scrape(ctx)
	if err != nil {
		return err
	}
	if err := benchutil.Sleep(ctx, o.poll/4); err != nil {
		return err
	}
	if err := settle(ctx, o, p, st, before); err != nil {
		return err
	}
	var saved chan error
	if profile != "" {
		saved = make(chan error, 1)
		go func() {
			saved <- p.SaveProfile(ctx, fmt.Sprintf("profile?seconds=%d", int(o.poll.Seconds())), profile)
		}()
	}
	text0, err := p.Scrape(ctx)
	if err != nil {
		return err
	}
	cpu0, _ := benchutil.CPUSeconds(p.PID)
	t0 := time.Now()
	if err := benchutil.Sleep(ctx, o.poll); err != nil {
		return err
	}
	text1, err := p.Scrape(ctx)
	if err != nil {
		return err
	}
	cpu1, _ := benchutil.CPUSeconds(p.PID)
	window := time.Since(t0)
	st.anonKiB, st.fileKiB, _ = benchutil.RSSNow(p.PID)
	st.reconciles = benchutil.MetricSum(text1, "controller_runtime_reconcile_total", ctlFilter) - benchutil.MetricSum(text0, "controller_runtime_reconcile_total", ctlFilter)
	st.expected = float64(st.n) * window.Seconds() / o.poll.Seconds()
	if st.reconciles > 0 {
		st.cpuPerPoll = (cpu1 - cpu0) / st.reconciles
	}
	reqs := benchutil.Delta(benchutil.ClientRequests(text0), benchutil.ClientRequests(text1))
	// The provider sends the creates' events at its event rate after the
	// resources are Ready (10 a second: the events of 10,000 creates take
	// half an hour): they are counted apart, not as writes at rest.
	by := benchutil.Delta(benchutil.ResourceRequests(text0), benchutil.ResourceRequests(text1))
	st.eventRequests = by["events POST"] + by["events PATCH"]
	st.events = benchutil.EventCounts(text1)
	st.writes = benchutil.Writes(reqs) - st.eventRequests
	st.writesBy = benchutil.OnlyWrites(withoutEvents(by))
	st.reads = reqs["GET"]
	st.load = benchutil.Load()
	if saved != nil {
		if err := <-saved; err != nil {
			benchutil.Logf("provider profile: %v", err)
		}
	}
	return nil
}

// withoutEvents is by without the events' requests.
func withoutEvents(by map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range by {
		if !strings.HasPrefix(k, "events ") {
			out[k] = v
		}
	}
	return out
}

// quietFor is how long the provider must send no write before the
// steady-state window starts: under load the writes of the last creates
// (events above all, which client-go sends one at a time) drain well
// after every resource is Ready, and they are not writes at rest.
const quietFor = 5 * time.Second

// settle waits, for at most one poll, until the provider has sent no
// write for quietFor, and notes in st the writes it sent since before
// (the stage's Ready).
func settle(ctx context.Context, o options, p *benchutil.Provider, st *stage, before string) error {
	deadline := time.Now().Add(o.poll)
	last, quiet := -1.0, time.Now()
	for {
		text, err := p.Scrape(ctx)
		if err != nil {
			return err
		}
		w := benchutil.Writes(withoutEvents(benchutil.ResourceRequests(text)))
		if w != last {
			last, quiet = w, time.Now()
		}
		if time.Since(quiet) >= quietFor || time.Now().After(deadline) {
			st.settleWritesBy = benchutil.OnlyWrites(benchutil.Delta(benchutil.ResourceRequests(before), benchutil.ResourceRequests(text)))
			st.settleWrites = benchutil.Writes(benchutil.Delta(benchutil.ClientRequests(before), benchutil.ClientRequests(text)))
			return nil
		}
		if err := benchutil.Sleep(ctx, time.Second); err != nil {
			return err
		}
	}
}

type restartResult struct {
	observed, sinceControllers time.Duration
	provWrites, apiWrites      map[string]float64
	provWritesBy               map[string]float64 // "resource VERB" (counted by hack/benchprovider)
	peakKiB                    int
	cpu                        float64
	load                       string
}

// restart stops the provider, starts a new one on the same backend state
// and measures the re-observation.
func restart(ctx context.Context, o options, cp *controlplane.ControlPlane, cfg *rest.Config, dir, state string, old *benchutil.Provider, n int) (*restartResult, *benchutil.Provider, error) {
	old.Stop()
	apiBefore, err := benchutil.APIServerRequests(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	t0 := time.Now()
	p, err := startProvider(ctx, o, cp, dir, state, "provider-restarted.log")
	if err != nil {
		return nil, nil, err
	}
	tCtl := time.Now()
	deadline := time.Now().Add(o.timeout)
	var text string
	for {
		text, err = p.Scrape(ctx)
		if err != nil {
			return nil, p, err
		}
		if benchutil.MetricSum(text, "egressproxy_bench_observed_instances", "") >= float64(n) {
			break
		}
		if time.Now().After(deadline) {
			return nil, p, fmt.Errorf("after the restart only %.0f of %d were observed within %v", benchutil.MetricSum(text, "egressproxy_bench_observed_instances", ""), n, o.timeout)
		}
		if err := benchutil.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, p, err
		}
	}
	r := &restartResult{observed: time.Since(t0), sinceControllers: time.Since(tCtl), load: benchutil.Load()}
	r.cpu, _ = benchutil.CPUSeconds(p.PID)
	r.peakKiB, _ = benchutil.PeakRSS(p.PID)
	// The last reconciles finish their writes, if any, shortly after their
	// Observe: wait for the reconcile count to reach n, and a little more.
	for benchutil.MetricSum(text, "controller_runtime_reconcile_total", ctlFilter) < float64(n) && time.Now().Before(deadline) {
		if err := benchutil.Sleep(ctx, 200*time.Millisecond); err != nil {
			return nil, p, err
		}
		if text, err = p.Scrape(ctx); err != nil {
			return nil, p, err
		}
	}
	if err := benchutil.Sleep(ctx, 5*time.Second); err != nil {
		return nil, p, err
	}
	if text, err = p.Scrape(ctx); err != nil {
		return nil, p, err
	}
	r.provWrites = benchutil.OnlyWrites(benchutil.ClientRequests(text))
	r.provWritesBy = benchutil.OnlyWrites(benchutil.ResourceRequests(text))
	apiAfter, err := benchutil.APIServerRequests(ctx, cfg)
	if err != nil {
		return nil, p, err
	}
	r.apiWrites = benchutil.OnlyWrites(benchutil.Delta(apiBefore, apiAfter))
	return r, p, nil
}

// startProvider runs the benchmark's provider on the backend state file
// and waits until its KVMProxy controller runs.
func startProvider(ctx context.Context, o options, cp *controlplane.ControlPlane, dir, state, logName string) (*benchutil.Provider, error) {
	po := benchutil.ProviderOptions{
		Binary: o.Provider, Kubeconfig: cp.KubeconfigPath, LogPath: filepath.Join(dir, logName),
		Rate: o.Rate, Concurrent: o.Concurrent,
		Args: []string{"--poll", o.poll.String(), "--poll-jitter", o.jitter.String(), "--poll-not-ready", "30s", "--config-check-interval", "10m"},
		Env:  []string{"EGRESSPROXY_BENCH_STATE=" + state},
		// Registered in the benchmark build only.
		Controller: "kvmproxy.proxy.m.egressproxy.io",
		Check: func(metrics string) error {
			if !strings.Contains(metrics, "egressproxy_bench_observed_instances") {
				return fmt.Errorf("%s has no egressproxy_bench_observed_instances metric: run hack/benchprovider (hack/bench-scale.sh builds it)", o.Provider)
			}
			return nil
		},
	}
	po.Env = append(po.Env, o.Environment()...)
	return benchutil.StartProvider(ctx, po)
}
