// Command benchpodproxy measures the PodProxy controller: it starts a local
// control plane (internal/devenv/controlplane, plus a kube-controller-manager of
// its own with rate limits raised for a thousand Deployments), runs the
// built provider binary against it, creates N PodProxies, plays the
// kubelet with internal/backend/kubernetes/kubelettest, and prints the
// figures below. The stand-in, not the local node (internal/devenv/controlplane's
// Options.Node), because a thousand real pods do not fit this machine's 2
// cores; this is the one place it stays (hack/bench-node.sh measures real
// pods, a few at a time). It prints:
//
//   - the time from the first create until all N are Ready;
//   - the median, p95 and maximum delay from a pod turning Ready (the
//     stand-in's status write returned) to its PodProxy turning Ready (this
//     program's watch saw Ready=True);
//   - the provider's peak RSS (VmHWM) and CPU seconds, from /proc;
//   - the provider's API requests per PodProxy until all were Ready: the
//     growth of its rest_client_requests_total (every request its clients
//     sent, by HTTP method) from just before the first create, divided by N.
//
// By default it measures the floor first (floor: the same Deployments and
// Secrets through the kubernetes driver, no provider), then the provider,
// each on a fresh control plane, and ends with a summary of both beside
// the targets (summary.go); -only runs one side.
//
// Run it through hack/bench-podproxy.sh.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/hack/benchutil"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes/kubelettest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

type options struct {
	benchutil.ProviderFlags
	n           int
	delay       time.Duration
	timeout     time.Duration
	listen      bool
	deleteAfter bool
	debug       bool
	profile     string
	profiles    bool
	provHeap    string
	floor       bool
	only        string
	// networkPolicy false leaves each proxy's NetworkPolicy out: what
	// that piece costs, as the same run without it.
	networkPolicy bool
}

func main() {
	var o options
	flag.IntVar(&o.n, "n", 200, "PodProxies to create.")
	flag.DurationVar(&o.delay, "kubelet-delay", 0, "How long the kubelet stand-in takes from seeing a pod to reporting it Ready.")
	o.Register("bin/benchprovider")
	flag.DurationVar(&o.timeout, "timeout", 5*time.Minute, "Give up waiting for Ready after this long.")
	flag.BoolVar(&o.listen, "listen", true, "Run a TCP listener per pod (the provider checks that the proxy answers); false runs nothing and no PodProxy becomes Ready.")
	flag.BoolVar(&o.deleteAfter, "delete", true, "Delete the PodProxies at the end and time it.")
	flag.StringVar(&o.profile, "apiserver-profile", "", "Write a 10 s CPU profile of kube-apiserver, taken from the first create, to this file.")
	flag.BoolVar(&o.profiles, "profiles", true, "Profile the provider's CPU from the first create until all are Ready (back-to-back 2 s profiles, merged) and its heap when all are Ready, into the run's folder under BENCH_DATA, and print their top entries.")
	flag.StringVar(&o.provHeap, "provider-heap", "", "Write the heap profile of the provider, taken when all are Ready, to this file instead.")
	flag.StringVar(&o.only, "only", "", "Run one side only: provider, or floor (no provider and no PodProxies; this program creates the N proxies' Deployments and Secrets with the kubernetes driver itself, and times until all their pods are Ready: what kube-controller-manager, the stand-in and the API server take on their own). By default the floor, then the provider, each on a fresh control plane, then a summary of both.")
	flag.BoolVar(&o.floor, "floor", false, "Measure the floor only (-only floor).")
	flag.BoolVar(&o.networkPolicy, "network-policy", true, "Give each proxy its NetworkPolicy (the config's kubernetes.networkPolicy); false measures the same run without that piece.")
	flag.BoolVar(&o.debug, "provider-debug", false, "Run the provider with --debug (slower: it logs every reconcile).")
	flag.Parse()
	benchutil.Main("benchpodproxy", func(ctx context.Context) error { return run(ctx, o) })
}

func run(ctx context.Context, o options) error {
	if o.floor {
		if o.only != "" && o.only != "floor" {
			return fmt.Errorf("-floor and -only %s: choose one", o.only)
		}
		o.only = "floor"
	}
	if o.only != "" && o.only != "provider" && o.only != "floor" {
		return fmt.Errorf("-only %q: want provider or floor", o.only)
	}
	sum := summary{n: o.n, delay: o.delay}
	if o.only != "provider" {
		f, l, err := onCluster(ctx, o, floor)
		if err != nil {
			return err
		}
		sum.floor, sum.floorLoad = f, l
	}
	if o.only == "floor" {
		return nil
	}
	p, l, err := onCluster(ctx, o, measureProvider)
	if err != nil {
		return err
	}
	sum.prov, sum.provLoad = p, l
	if o.only == "" {
		sum.print(os.Stdout)
	}
	if p.timedOut {
		return errors.New("not all PodProxies became Ready")
	}
	return nil
}

// side is what one side of the benchmark runs on: a fresh control plane
// with a kube-controller-manager of its own and the ClusterProviderConfig
// "pods".
type side struct {
	cl *benchutil.Cluster
	// pids are the processes whose CPU is reported, by name.
	pids map[string]int
}

// load is /proc/loadavg at a side's start (before its control plane) and
// end (its figures taken, its control plane still running): other work on
// the machine moves the figures.
type load struct{ start, end string }

// onCluster runs measure on a control plane of its own, started for it and
// stopped after it, so that neither side inherits the other's etcd or
// caches.
func onCluster[R any](ctx context.Context, o options, measure func(context.Context, options, side) (R, error)) (R, load, error) {
	var r R
	l := load{start: benchutil.Load()}
	cl, err := benchutil.StartCluster(ctx, benchutil.ClusterOptions{Name: "benchpodproxy", KeepLogs: o.KeepLogs,
		Namespaces: []string{"crossplane-system", "egress-proxies", "bench"}})
	if err != nil {
		return r, l, err
	}
	defer func() { _ = cl.Stop() }()
	stopKCM, kcmPID, err := startControllerManager(cl.CP, cl.Dir)
	if err != nil {
		return r, l, err
	}
	defer stopKCM()
	pids := cl.CP.PIDs()
	pids["kube-controller-manager"] = kcmPID
	pids["benchpodproxy (kubelet stand-in, watches)"] = os.Getpid()
	if err := benchutil.CreatePodsConfig(ctx, cl.Client, "", o.networkPolicy); err != nil {
		return r, l, err
	}
	r, err = measure(ctx, o, side{cl: cl, pids: pids})
	l.end = benchutil.Load()
	if o.KeepLogs {
		fmt.Printf("\nlogs in %s\n", cl.Dir)
	}
	return r, l, err
}

// providerResult is what the provider side measured, for the summary.
type providerResult struct {
	timedOut bool
	// took is from the first create until all were Ready.
	took time.Duration
	// delays, sorted, are each proxy's pod Ready to PodProxy Ready.
	delays []time.Duration
	// peakRSS is the provider's VmHWM in KiB.
	peakRSS int
	// requests is the provider's API requests per PodProxy until all were
	// Ready.
	requests float64
	// cpu is the CPU seconds of every process (the provider's and the
	// control plane's) from the first create until all were Ready.
	cpu float64
	// deleted says the delete phase ran; the figures below are its.
	deleted bool
	// delProvider and delAll are its API requests per proxy, the
	// provider's and every client's.
	delProvider, delAll float64
	// delOthers is the delete phase's requests per proxy of every other
	// client (all but the provider's).
	delOthers float64
	// provCPU is the provider's CPU seconds from the first create until
	// all were Ready; peakAnon and peakFile the sampled peak RSS split, in
	// KiB; events what it recorded from the first create until every
	// event was sent, and eventsAtReady until all were Ready.
	provCPU               float64
	peakAnon, peakFile    int
	events, eventsAtReady benchutil.Events
	// afterReady is the provider's requests per proxy from all Ready
	// until its events were sent.
	afterReady float64
	load       string
	// afterPod is each PodProxy's end after its last pod's.
	afterPod gaps
}

// gaps are, sorted, how long after an event each PodProxy went, and how
// many within 2 s.
type gaps struct {
	d      []time.Duration
	within int
}

// measureProvider runs the provider, creates the PodProxies, waits until
// they are Ready, deletes them, and prints the figures.
func measureProvider(ctx context.Context, o options, sd side) (providerResult, error) {
	var res providerResult
	cp, s, cfg, kube, dir, pids := sd.cl.CP, sd.cl.Scheme, sd.cl.Config, sd.cl.Client, sd.cl.Dir, sd.pids
	prov, err := startProvider(ctx, o, cp, dir)
	if err != nil {
		return res, err
	}
	defer prov.Stop()
	startRSS, _ := benchutil.PeakRSS(prov.PID)
	startPages := benchutil.BinaryPagesLine(prov.PID)
	rss := benchutil.SampleRSS(prov.PID, 100*time.Millisecond)
	defer rss.Stop()
	pids["provider"] = prov.PID
	runDir := filepath.Join(benchutil.DataDir(), fmt.Sprintf("podproxy-%d-%s", o.n, time.Now().UTC().Format("20060102T150405")))
	if err := os.MkdirAll(runDir, 0o755); err != nil {
		return res, err
	}
	cpuBefore := map[string]float64{}

	// The kubelet stand-in, and the times pods turned Ready.
	var mu sync.Mutex
	podReady := map[string]time.Time{} // by PodProxy UID
	mode := kubelettest.Listen
	if !o.listen {
		mode = kubelettest.NoListener
	}
	kl, err := kubelettest.New(cfg, kubelettest.Options{Mode: mode, Delay: o.delay, Workers: 64,
		OnReady: func(p *corev1.Pod, _ string, at time.Time) {
			mu.Lock()
			defer mu.Unlock()
			if uid := p.Labels[kubernetes.LabelUID]; uid != "" {
				if _, ok := podReady[uid]; !ok {
					podReady[uid] = at
				}
			}
		}})
	if err != nil {
		return res, err
	}
	defer kl.Stop()
	if err := kl.Run(ctx); err != nil {
		return res, err
	}

	// Watch the PodProxies turn Ready, and their Deployments and pods
	// appear, for the timeline.
	mrCreated := map[string]time.Time{} // by name
	depSeen := map[string]time.Time{}   // by PodProxy UID
	podSeen := map[string]time.Time{}   // by PodProxy UID
	depGone := map[string]time.Time{}   // by PodProxy UID
	podGone := map[string]time.Time{}   // by PodProxy UID: its last pod's deletion
	// at is the first time an object of the PodProxy with label UID was
	// seen (first) or the time it went (gone).
	at := func(m map[string]time.Time, first bool) func(client.Object, time.Time) {
		return func(o client.Object, t time.Time) {
			mu.Lock()
			defer mu.Unlock()
			if uid := o.GetLabels()[kubernetes.LabelUID]; uid != "" {
				if _, ok := m[uid]; !ok || !first {
					m[uid] = t
				}
			}
		}
	}
	mrs, err := benchutil.WatchReady(ctx, cfg, cache.Options{Scheme: s, ByObject: kubernetes.CacheByObject()}, &nsproxy.PodProxy{}, func(ca cache.Cache) error {
		if err := benchutil.Watch(ctx, ca, &appsv1.Deployment{}, at(depSeen, true), at(depGone, false)); err != nil {
			return err
		}
		return benchutil.Watch(ctx, ca, &corev1.Pod{}, at(podSeen, true), at(podGone, false))
	})
	if err != nil {
		return res, err
	}

	before, err := prov.Requests(ctx)
	if err != nil {
		return res, err
	}
	byBefore, _ := byResource(ctx, prov)
	apiBefore, err := benchutil.APIServerRequests(ctx, cfg)
	if err != nil {
		return res, err
	}
	closedBefore, _ := benchutil.TerminatedWatchers(ctx, cfg)
	for name, pid := range pids {
		cpuBefore[name], _ = benchutil.CPUSeconds(pid)
	}
	beforeText, _ := prov.Scrape(ctx)
	eventsBefore := benchutil.EventCounts(beforeText)
	var cpuProf *benchutil.CPUProfiles
	if o.profiles {
		cpuProf = benchutil.StartCPUProfiles(ctx, prov, runDir, 2*time.Second)
	}
	benchutil.Logf("creating %d PodProxies (%d in parallel); the kubelet stand-in takes %v per pod", o.n, o.Creators, o.delay)
	if o.profile != "" {
		go func() {
			rc, err := rest.RESTClientFor(benchutil.WithCodec(cfg))
			if err != nil {
				return
			}
			b, err := rc.Get().AbsPath("/debug/pprof/profile").Param("seconds", "10").Timeout(30 * time.Second).Do(ctx).Raw()
			if err == nil {
				_ = os.WriteFile(o.profile, b, 0o644)
			}
		}()
	}
	start := time.Now()
	if err := benchutil.InParallel(o.n, o.Creators, func(i int) error {
		p := podProxy(i)
		at := time.Now()
		err := kube.Create(ctx, p)
		mu.Lock()
		mrCreated[p.Name] = at
		mu.Unlock()
		return err
	}); err != nil {
		return res, err
	}
	created := time.Since(start)
	benchutil.Logf("created all in %.2fs; waiting for Ready", created.Seconds())

	allReady, err := mrs.Await(ctx, o.n, o.timeout, 5*time.Second, func(ready int) {
		mu.Lock()
		defer mu.Unlock()
		benchutil.Logf("%d of %d Ready (%d pods Ready)", ready, o.n, len(podReady))
	})
	if err != nil {
		return res, err
	}
	timedOut := !allReady
	took := time.Since(start)
	after, err := prov.Requests(ctx)
	if err != nil {
		return res, err
	}
	byAfter, _ := byResource(ctx, prov)
	metricsText, _ := prov.Scrape(ctx)
	apiAfter, err := benchutil.APIServerRequests(ctx, cfg)
	if err != nil {
		return res, err
	}
	closedAfter, _ := benchutil.TerminatedWatchers(ctx, cfg)
	endCPU, _ := benchutil.CPUSeconds(prov.PID)
	peakRSS, _ := benchutil.PeakRSS(prov.PID)
	peakAnon, peakFile := rss.Peak()
	loadAtReady := benchutil.Load()
	eventsAtReady := benchutil.EventCounts(metricsText).Sub(eventsBefore)
	var cpuFiles []string
	if cpuProf != nil {
		cpuFiles = cpuProf.Stop()
	}
	heapFile := o.provHeap
	if heapFile == "" && o.profiles {
		heapFile = filepath.Join(runDir, "heap.pprof")
	}
	if heapFile != "" {
		if err := prov.SaveProfile(ctx, "heap", heapFile); err != nil {
			benchutil.Logf("provider heap profile: %v", err)
			heapFile = ""
		}
	}
	cpuRows := benchutil.CPUSince(pids, cpuBefore)
	cpu := benchutil.CPUTotalSince(pids, cpuBefore)

	mrReady, _, mrUID := mrs.Snapshot()
	mu.Lock()
	var delays []time.Duration
	for uid, m := range mrReady {
		if p, ok := podReady[uid]; ok {
			delays = append(delays, m.Sub(p))
		}
	}
	ready := len(mrReady)
	var stages [4][]time.Duration
	for uid, m := range mrReady {
		c, ok := mrCreated[mrUID[uid]]
		if !ok {
			continue
		}
		for i, t := range []time.Time{depSeen[uid], podSeen[uid], podReady[uid], m} {
			if !t.IsZero() {
				stages[i] = append(stages[i], t.Sub(c))
			}
		}
	}
	type slow struct {
		name   string
		stages [4]time.Duration
	}
	var slowest []slow
	for uid, m := range mrReady {
		c, ok := mrCreated[mrUID[uid]]
		if !ok {
			continue
		}
		var sl slow
		sl.name = mrUID[uid]
		for i, t := range []time.Time{depSeen[uid], podSeen[uid], podReady[uid], m} {
			if !t.IsZero() {
				sl.stages[i] = t.Sub(c)
			}
		}
		slowest = append(slowest, sl)
	}
	if o.KeepLogs {
		// Each proxy's pod Ready and PodProxy Ready, to read against the
		// provider's log (-provider-debug).
		var b strings.Builder
		for uid, m := range mrReady {
			fmt.Fprintf(&b, "%s\t%s\t%s\n", mrUID[uid], podReady[uid].UTC().Format(time.RFC3339Nano), m.UTC().Format(time.RFC3339Nano))
		}
		_ = os.WriteFile(filepath.Join(dir, "ready.tsv"), []byte(b.String()), 0o644)
	}
	mu.Unlock()
	sort.Slice(delays, func(i, j int) bool { return delays[i] < delays[j] })
	sort.Slice(slowest, func(i, j int) bool { return slowest[i].stages[3] > slowest[j].stages[3] })
	if len(slowest) > 3 {
		slowest = slowest[:3]
	}

	fmt.Printf("\nPodProxy benchmark: %d PodProxies (namespaced, ClusterProviderConfig, connection Secret%s), kubelet stand-in delay %v\n", o.n, map[bool]string{true: "", false: ", no NetworkPolicy"}[o.networkPolicy], o.delay)
	fmt.Printf("kubelet stand-in: %s; one status write per pod\n", mode)
	fmt.Printf("provider: %s --max-reconcile-rate %d --max-concurrent-reconciles %d --poll-not-ready 30s (Ready comes from watches, not polls)\n", o.Provider, o.Rate, o.Concurrent)
	if o.Env != "" {
		fmt.Printf("provider environment: %s\n", o.Env)
	}
	fmt.Printf("machine: %d CPUs; control plane, provider, kube-controller-manager and this program share them\n\n", benchutil.NumCPU())
	if timedOut {
		fmt.Printf("TIMED OUT after %v: %d of %d Ready\n", o.timeout, ready, o.n)
	}
	fmt.Printf("created all:                     %7.2f s\n", created.Seconds())
	fmt.Printf("all Ready:                       %7.2f s after the first create\n", took.Seconds())
	if len(delays) > 0 {
		fmt.Printf("pod Ready -> PodProxy Ready:     %s (%d proxies)\n", quantiles(delays), len(delays))
	}
	var timeline []string
	for i, name := range []string{"Deployment seen", "pod seen", "pod Ready", "PodProxy Ready"} {
		d := stages[i]
		sort.Slice(d, func(a, b int) bool { return d[a] < d[b] })
		if len(d) > 0 {
			timeline = append(timeline, fmt.Sprintf("%s %.2f/%.2f", name, benchutil.Pct(d, 50).Seconds(), benchutil.Pct(d, 95).Seconds()))
		}
	}
	fmt.Printf("timeline after each create:      %s s (median/p95)\n", strings.Join(timeline, ", "))
	for _, sl := range slowest {
		fmt.Printf("  slowest %s: Deployment seen %.2f, pod seen %.2f, pod Ready %.2f, PodProxy Ready %.2f s\n", sl.name, sl.stages[0].Seconds(), sl.stages[1].Seconds(), sl.stages[2].Seconds(), sl.stages[3].Seconds())
	}
	fmt.Printf("provider peak RSS (VmHWM):       %7.1f MiB (%.1f MiB before the first create; now %s); load %s\n", float64(peakRSS)/1024, float64(startRSS)/1024, benchutil.RSSParts(prov.PID), loadAtReady)
	fmt.Printf("provider peak RSS, sampled:      %7.1f MiB: anonymous %.1f MiB (heap, stacks) + file-backed %.1f MiB (the binary's pages), every 100 ms\n",
		float64(peakAnon+peakFile)/1024, float64(peakAnon)/1024, float64(peakFile)/1024)
	fmt.Printf("provider binary resident:        before the first create %s; at all Ready %s\n", startPages, benchutil.BinaryPagesLine(prov.PID))
	provCPU := endCPU - cpuBefore["provider"]
	profiling := ""
	if o.profiles {
		// The profiler's signals, unwinding and encoding are the
		// provider's CPU too (docs/benchmarks.md has the difference).
		profiling = ", the CPU profiler running (-profiles=false for the figure without it)"
	}
	fmt.Printf("provider CPU until all Ready:    %7.2f s from the first create (%.2f s in total since its start%s); load %s\n", provCPU, endCPU, profiling, loadAtReady)
	fmt.Printf("provider events until Ready:     %s\n", eventsAtReady)
	perMR, methods := benchutil.PerMethod(before, after, o.n)
	res.timedOut, res.took, res.delays, res.peakRSS, res.requests, res.cpu = timedOut, took, delays, peakRSS, perMR, cpu
	fmt.Printf("CPU of every process meanwhile:  %s (%.1f s of wall time on %d CPUs)\n", strings.Join(cpuRows, ", "), took.Seconds(), benchutil.NumCPU())
	fmt.Printf("provider API requests per MR:    %7.2f until all were Ready (%s)\n", perMR, strings.Join(methods, ", "))
	fmt.Printf("                                 counted: the growth of the provider's rest_client_requests_total from just before the first create\n")
	fmt.Printf("                                 (every request of its clients, events included, for every controller), divided by %d\n", o.n)
	if rows := benchutil.PerProxy(byBefore, byAfter, o.n); len(rows) > 0 {
		fmt.Printf("provider requests per MR by resource and verb (egressproxy_bench_requests_total):\n%s\n", strings.Join(rows, "\n"))
	}
	// Each such watch is opened again: one of the WATCH rows above.
	fmt.Printf("watches the API server closed as too slow to read (apiserver_terminated_watchers_total, every client): %s\n", benchutil.Grown(closedBefore, closedAfter))

	ctl := `controller="managed/podproxy.proxy.m.egressproxy.io"`
	wq := `name="managed/podproxy.proxy.m.egressproxy.io"`
	mean := func(name, filter string) float64 {
		c := benchutil.MetricSum(metricsText, name+"_count", filter)
		if c == 0 {
			return 0
		}
		return benchutil.MetricSum(metricsText, name+"_sum", filter) / c
	}
	fmt.Printf("provider Go heap at the end:     %.1f MiB in use, %.1f MiB from the OS (go_memstats)\n",
		benchutil.MetricSum(metricsText, "go_memstats_heap_inuse_bytes", "")/(1<<20), benchutil.MetricSum(metricsText, "go_memstats_sys_bytes", "")/(1<<20))
	fmt.Printf("provider internals (whole run):  %.2f reconciles per MR, mean reconcile %.0f ms, mean wait in the work queue %.0f ms, %.2f requests per MR answered 409 Conflict\n",
		benchutil.MetricSum(metricsText, "controller_runtime_reconcile_total", ctl)/float64(o.n),
		1000*mean("controller_runtime_reconcile_time_seconds", ctl), 1000*mean("workqueue_queue_duration_seconds", wq),
		benchutil.MetricSum(metricsText, "rest_client_requests_total", `code="409"`)/float64(o.n))
	if len(cpuFiles) > 0 {
		if top, err := benchutil.PprofTop(ctx, o.Provider, cpuFiles, 25); err == nil {
			fmt.Printf("\nprovider CPU profile from the first create until all were Ready (%d profiles of 2 s, merged; %s), top functions:\n%s\n", len(cpuFiles), runDir, benchutil.Indent(top, "  "))
		} else {
			benchutil.Logf("provider CPU profile: %v", err)
		}
		if top, err := benchutil.PprofTop(ctx, o.Provider, cpuFiles, 25, "-cum"); err == nil {
			fmt.Printf("the same, by cumulative time:\n%s\n", benchutil.Indent(top, "  "))
		}
	}
	if heapFile != "" {
		if top, err := benchutil.PprofTop(ctx, o.Provider, []string{heapFile}, 20, "-sample_index=inuse_space"); err == nil {
			fmt.Printf("\nprovider heap when all were Ready (%s), top holders of live memory:\n%s\n", heapFile, benchutil.Indent(top, "  "))
		}
	}
	fmt.Printf("\nAPI server requests per MR by resource and verb, all clients (the provider; kube-controller-manager on\n")
	fmt.Printf("deployments, replicasets, pods and events; the stand-in on pods; this program: one podproxies create per MR):\n")
	rows := benchutil.PerProxy(apiBefore, apiAfter, o.n)
	fmt.Println(strings.Join(rows, "\n"))

	res.provCPU, res.peakAnon, res.peakFile, res.eventsAtReady, res.load = provCPU, peakAnon, peakFile, eventsAtReady, loadAtReady
	// The events the provider still holds go out at its event rate after
	// Ready: what they and anything else cost until then is counted apart
	// from the requests until Ready.
	if !timedOut {
		evEnd, err := benchutil.AwaitEvents(ctx, prov, 10*time.Minute)
		if err == nil {
			res.events = evEnd.Sub(eventsBefore)
			drained, _ := prov.Requests(ctx)
			res.afterReady, _ = benchutil.PerMethod(after, drained, o.n)
			byDrained, _ := byResource(ctx, prov)
			fmt.Printf("\nprovider events from the first create until all were sent: %s (%.2f per proxy sent; %s at all Ready), %.1f s after the first create\n",
				res.events, res.events.Sent/float64(o.n), eventsAtReady, time.Since(start).Seconds())
			fmt.Printf("provider requests per MR after all were Ready until its events were sent: %.2f\n", res.afterReady)
			if rows := benchutil.PerProxy(byAfter, byDrained, o.n); len(rows) > 0 {
				fmt.Println(strings.Join(rows, "\n"))
			}
		}
	}
	if o.deleteAfter && !timedOut {
		benchutil.Logf("deleting the PodProxies")
		delBefore, err := prov.Requests(ctx)
		if err != nil {
			return res, err
		}
		delByBefore, _ := byResource(ctx, prov)
		var delProvBy map[string]float64
		delAPIBefore, err := benchutil.APIServerRequests(ctx, cfg)
		if err != nil {
			return res, err
		}
		t0 := time.Now()
		if err := benchutil.InParallel(o.n, o.Creators, func(i int) error {
			return client.IgnoreNotFound(kube.Delete(ctx, podProxy(i)))
		}); err != nil {
			return res, err
		}
		var depsGone time.Duration
		for {
			l := &nsproxy.PodProxyList{}
			if err := kube.List(ctx, l, client.InNamespace("bench")); err != nil {
				return res, err
			}
			if depsGone == 0 {
				deps := &appsv1.DeploymentList{}
				if err := kube.List(ctx, deps, client.InNamespace("egress-proxies")); err != nil {
					return res, err
				}
				if len(deps.Items) == 0 {
					depsGone = time.Since(t0)
				}
			}
			if len(l.Items) == 0 {
				break
			}
			if time.Since(t0) > o.timeout {
				fmt.Printf("deleting: %d PodProxies left after %v\n", len(l.Items), o.timeout)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
		fmt.Printf("all deleted:                     %7.2f s after deleting them (the last Deployment gone after %.2f s)\n", time.Since(t0).Seconds(), depsGone.Seconds())
		// Each PodProxy's end against its own Deployment's (target: within
		// 2 s) and its last pod's, and what the delete phase cost (target:
		// under 15 API requests per proxy, every client). The PodProxies'
		// deletions are read now: the watch may deliver the last ones a
		// moment after the list came back empty.
		mrGone := awaitGone(mrs, o.n)
		res.deleted = true
		for _, g := range []struct {
			what string
			at   map[string]time.Time
			keep *gaps // for the summary
		}{{"Deployment gone -> PodProxy gone:", depGone, nil}, {"last pod gone -> PodProxy gone:  ", podGone, &res.afterPod}} {
			mu.Lock()
			gp := gapsAfter(g.at, mrGone)
			mu.Unlock()
			if g.keep != nil {
				*g.keep = gp
			}
			fmt.Printf("%s %s\n", g.what, gp)
		}
		if delAfter, err := prov.Requests(ctx); err == nil {
			perProxy, methods := benchutil.PerMethod(delBefore, delAfter, o.n)
			res.delProvider = perProxy
			fmt.Printf("delete phase, provider requests per proxy: %.2f (%s)\n", perProxy, strings.Join(methods, ", "))
			if delByAfter, err := byResource(ctx, prov); err == nil {
				fmt.Println(strings.Join(benchutil.PerProxy(delByBefore, delByAfter, o.n), "\n"))
				delProvBy = benchutil.Delta(delByBefore, delByAfter)
			}
		}
		if delAPIAfter, err := benchutil.APIServerRequests(ctx, cfg); err == nil {
			total := 0.0
			for k, v := range delAPIAfter {
				total += v - delAPIBefore[k]
			}
			res.delAll = total / float64(o.n)
			fmt.Printf("delete phase, API server requests per proxy, all clients: %.2f (target under 15); by resource and verb:\n", res.delAll)
			fmt.Println(strings.Join(benchutil.PerProxy(delAPIBefore, delAPIAfter, o.n), "\n"))
			if delProvBy != nil {
				// Everyone but the provider: kube-controller-manager (the
				// garbage collector reads each dependent and, unless its
				// cache of 500 owners known absent holds it, the owner, then
				// deletes the dependent; the ReplicaSet controller), the
				// stand-in's pod deletions and this program's deletes and
				// lists.
				others := benchutil.Delta(delAPIBefore, delAPIAfter)
				for k, v := range delProvBy {
					others[k] -= v
				}
				otherTotal := 0.0
				for _, v := range others {
					otherTotal += v
				}
				res.delOthers = otherTotal / float64(o.n)
				fmt.Printf("delete phase, API server requests per proxy from everyone but the provider: %.2f (kube-controller-manager, the stand-in, this program); by resource and verb:\n", res.delOthers)
				fmt.Println(strings.Join(benchutil.PerProxy(map[string]float64{}, others, o.n), "\n"))
			}
		}
	}
	if _, err := benchutil.AppendResult("podproxy", map[string]any{
		"at": time.Now().UTC().Format(time.RFC3339), "side": "provider", "n": o.n, "delaySeconds": o.delay.Seconds(), "load": loadAtReady, "networkPolicy": o.networkPolicy,
		"readySeconds": took.Seconds(), "timedOut": timedOut, "peakRSSMiB": float64(peakRSS) / 1024,
		"peakAnonMiB": float64(peakAnon) / 1024, "peakFileMiB": float64(peakFile) / 1024, "providerCPUSeconds": provCPU,
		"requestsPerProxy": perMR, "afterReadyPerProxy": res.afterReady, "eventsSent": res.events.Sent, "eventsDropped": res.events.Dropped,
		"deleteRequestsPerProxy": res.delAll, "deleteProviderPerProxy": res.delProvider, "deleteOthersPerProxy": res.delOthers,
		"goneWithin2s": res.afterPod.within, "gone": len(res.afterPod.d),
	}); err != nil {
		benchutil.Logf("results: %v", err)
	}

	return res, nil
}

// quantiles is the median, p90, p95 and maximum of d, which is sorted and
// not empty.
func quantiles(d []time.Duration) string {
	return fmt.Sprintf("median %.3f s, p90 %.3f s, p95 %.3f s, max %.3f s",
		benchutil.Pct(d, 50).Seconds(), benchutil.Pct(d, 90).Seconds(), benchutil.Pct(d, 95).Seconds(), d[len(d)-1].Seconds())
}

// awaitGone waits up to 5 s for the watch to have delivered n deletions
// of PodProxies and returns when each went, by UID.
func awaitGone(mrs *benchutil.Readiness, n int) map[string]time.Time {
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, gone, _ := mrs.Snapshot()
		if len(gone) >= n || time.Now().After(deadline) {
			return gone
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// gapsAfter is how long after its event in before each PodProxy in gone
// went.
func gapsAfter(before, gone map[string]time.Time) gaps {
	var g gaps
	for uid, m := range gone {
		if d, ok := before[uid]; ok {
			g.d = append(g.d, m.Sub(d))
			if m.Sub(d) <= 2*time.Second {
				g.within++
			}
		}
	}
	sort.Slice(g.d, func(i, j int) bool { return g.d[i] < g.d[j] })
	return g
}

func (g gaps) String() string {
	if len(g.d) == 0 {
		return "no deletion recorded"
	}
	return fmt.Sprintf("median %.2f s, p95 %.2f s, max %.2f s (min %.2f s); %d of %d within 2 s",
		benchutil.Pct(g.d, 50).Seconds(), benchutil.Pct(g.d, 95).Seconds(), g.d[len(g.d)-1].Seconds(), g.d[0].Seconds(), g.within, len(g.d))
}

// floorResult is what the floor side measured, for the summary.
type floorResult struct {
	// took is from the first create until all pods were Ready.
	took time.Duration
	// cpu is the CPU seconds of every process meanwhile.
	cpu float64
}

// floor creates n proxies through the kubernetes driver directly (the two
// requests a PodProxy's Create sends: the Deployment and its Secret) and
// times until the stand-in reports all their pods Ready.
func floor(ctx context.Context, o options, sd side) (floorResult, error) {
	cfg, kube, pids := sd.cl.Config, sd.cl.Client, sd.pids
	var mu sync.Mutex
	ready := 0
	all := make(chan struct{})
	kl, err := kubelettest.New(cfg, kubelettest.Options{Mode: kubelettest.Listen, Delay: o.delay, Workers: 64,
		OnReady: func(*corev1.Pod, string, time.Time) {
			mu.Lock()
			defer mu.Unlock()
			ready++
			if ready == o.n {
				close(all)
			}
		}})
	if err != nil {
		return floorResult{}, err
	}
	defer kl.Stop()
	if err := kl.Run(ctx); err != nil {
		return floorResult{}, err
	}
	// The driver reads through a cache, as in the provider.
	ca, err := cache.New(cfg, cache.Options{Scheme: kube.Scheme(), ByObject: kubernetes.CacheByObject()})
	if err != nil {
		return floorResult{}, err
	}
	for _, obj := range []client.Object{&corev1.Pod{}, &appsv1.Deployment{}, &corev1.Service{}} {
		if _, err := ca.GetInformer(ctx, obj); err != nil {
			return floorResult{}, err
		}
	}
	if err := benchutil.StartCache(ctx, ca); err != nil {
		return floorResult{}, err
	}
	cached, err := client.New(cfg, client.Options{Scheme: kube.Scheme(), Cache: &client.CacheOptions{Reader: ca, DisableFor: []client.Object{&corev1.Secret{}}}})
	if err != nil {
		return floorResult{}, err
	}
	d := kubernetes.New(kubernetes.Options{Provider: "benchpodproxy", Config: kubernetes.Config{Namespace: "egress-proxies"}, Client: cached, Live: kube})
	apiBefore, err := benchutil.APIServerRequests(ctx, cfg)
	if err != nil {
		return floorResult{}, err
	}
	cpuBefore := map[string]float64{}
	for name, pid := range pids {
		cpuBefore[name], _ = benchutil.CPUSeconds(pid)
	}
	benchutil.Logf("creating %d proxies with the driver (%d in parallel); the kubelet stand-in takes %v per pod", o.n, o.Creators, o.delay)
	start := time.Now()
	if err := benchutil.InParallel(o.n, o.Creators, func(i int) error {
		_, err := d.Create(ctx, proxy.Request{
			Name:  fmt.Sprintf("floor-%04d", i),
			Mark:  proxy.Mark{UID: fmt.Sprintf("00000000-0000-0000-0000-%012d", i), InstallationID: "bench"},
			Proxy: proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443}},
		})
		return err
	}); err != nil {
		return floorResult{}, err
	}
	created := time.Since(start)
	select {
	case <-all:
	case <-time.After(o.timeout):
		return floorResult{}, fmt.Errorf("not all pods Ready after %v", o.timeout)
	case <-ctx.Done():
		return floorResult{}, ctx.Err()
	}
	took := time.Since(start)
	apiAfter, err := benchutil.APIServerRequests(ctx, cfg)
	if err != nil {
		return floorResult{}, err
	}
	cpuRows := benchutil.CPUSince(pids, cpuBefore)
	cpu := benchutil.CPUTotalSince(pids, cpuBefore)
	fmt.Printf("\nFloor: %d proxies created by the kubernetes driver itself (no provider, no PodProxies), kubelet stand-in delay %v\n", o.n, o.delay)
	fmt.Printf("machine: %d CPUs; control plane, kube-controller-manager and this program share them\n\n", benchutil.NumCPU())
	fmt.Printf("created all:                     %7.2f s\n", created.Seconds())
	fmt.Printf("all pods Ready:                  %7.2f s after the first create\n", took.Seconds())
	fmt.Printf("CPU of every process meanwhile:  %s (%.1f s of wall time)\n", strings.Join(cpuRows, ", "), took.Seconds())
	rows := benchutil.PerProxy(apiBefore, apiAfter, o.n)
	fmt.Printf("\nAPI server requests per proxy by resource and verb, all clients:\n%s\n", strings.Join(rows, "\n"))
	if _, err := benchutil.AppendResult("podproxy", map[string]any{
		"at": time.Now().UTC().Format(time.RFC3339), "side": "floor", "n": o.n, "delaySeconds": o.delay.Seconds(), "load": benchutil.Load(),
		"readySeconds": took.Seconds(),
	}); err != nil {
		benchutil.Logf("results: %v", err)
	}
	return floorResult{took: took, cpu: cpu}, nil
}

func podProxy(i int) *nsproxy.PodProxy {
	name := fmt.Sprintf("p-%04d", i)
	return &nsproxy.PodProxy{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "bench"},
		Spec: nsproxy.PodProxySpec{
			ManagedResourceSpec: xpv2.ManagedResourceSpec{
				ProviderConfigReference:          &xpv2.ProviderConfigReference{Kind: "ClusterProviderConfig", Name: "pods"},
				WriteConnectionSecretToReference: &xpv2.LocalSecretReference{Name: name + "-proxy"},
			},
			ForProvider: spec.PodProxyParameters{Proxy: spec.ProxySettings{AllowedClientCIDRs: []string{"10.0.0.0/8"}}},
		},
	}
}

// startControllerManager runs kube-controller-manager with the garbage
// collector and the Deployment and ReplicaSet controllers, with API rate
// limits and worker counts raised: at its defaults (20 requests per second,
// 5 workers) a thousand Deployments take minutes to get their pods.
func startControllerManager(cp *controlplane.ControlPlane, dir string) (func(), int, error) {
	logFile, err := os.Create(filepath.Join(dir, "kube-controller-manager.log"))
	if err != nil {
		return nil, 0, err
	}
	cmd := exec.Command(filepath.Join(cp.BinDir, "kube-controller-manager"),
		"--kubeconfig="+cp.KubeconfigPath,
		"--controllers=garbage-collector-controller,namespace-controller,deployment-controller,replicaset-controller",
		"--leader-elect=false", "--secure-port=0", "--use-service-account-credentials=false",
		"--kube-api-qps=1000", "--kube-api-burst=2000",
		"--concurrent-deployment-syncs=20", "--concurrent-replicaset-syncs=20", "--concurrent-gc-syncs=50",
	)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, 0, err
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
		}
		_ = logFile.Close()
	}, cmd.Process.Pid, nil
}

// startProvider runs the provider binary on the control plane and waits
// until its PodProxy controllers run.
func startProvider(ctx context.Context, o options, cp *controlplane.ControlPlane, dir string) (*benchutil.Provider, error) {
	po := benchutil.ProviderOptions{
		Binary: o.Provider, Kubeconfig: cp.KubeconfigPath, LogPath: filepath.Join(dir, "provider.log"),
		Rate: o.Rate, Concurrent: o.Concurrent,
		Args:       []string{"--poll", "10m", "--poll-not-ready", "30s", "--poll-jitter", "0s", "--config-check-interval", "10m"},
		Controller: "podproxy.proxy.m.egressproxy.io",
	}
	if o.debug {
		po.Args = append(po.Args, "--debug")
	}
	po.Env = o.Environment()
	return benchutil.StartProvider(ctx, po)
}

// byResource sums the provider's egressproxy_bench_requests_total
// (hack/benchprovider counts them) by "resource VERB", watches opened
// included (rest_client_requests_total counts each as a GET); empty for
// the shipped provider.
func byResource(ctx context.Context, p *benchutil.Provider) (map[string]float64, error) {
	body, err := p.Scrape(ctx)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, smp := range benchutil.Samples(body, "egressproxy_bench_requests_total") {
		out[smp.Labels["resource"]+" "+smp.Labels["verb"]] += smp.Value
	}
	return out, nil
}
