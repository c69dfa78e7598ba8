package main

import (
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/egressproxy/provider-egressproxy/hack/benchutil"
)

// summary is both sides of one run, printed together beside the issue's
// targets.
type summary struct {
	n                   int
	delay               time.Duration
	floor               floorResult
	floorLoad, provLoad load
	prov                providerResult
}

// print writes the summary block: each row's figure and its target.
func (s summary) print(out io.Writer) {
	fmt.Fprintf(out, "\nSummary: %d proxies, kubelet stand-in delay %v; the floor, then the provider, each on a fresh control plane\n", s.n, s.delay)
	w := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	row := func(what, measured, target string) { fmt.Fprintf(w, "%s\t%s\t%s\n", what, measured, target) }
	row("", "measured", "target")
	for _, l := range []struct {
		side string
		load load
	}{{"floor", s.floorLoad}, {"provider", s.provLoad}} {
		row("load average (1, 5, 15 min), "+l.side, fmt.Sprintf("%s at its start, %s at its end", l.load.start, l.load.end), "")
	}
	row("all Ready (floor)", fmt.Sprintf("%.2f s", s.floor.took.Seconds()), "")
	p := s.prov
	if p.timedOut {
		row("all Ready (provider)", fmt.Sprintf("TIMED OUT after %.2f s", p.took.Seconds()), "")
	} else {
		row("all Ready (provider)", fmt.Sprintf("%.2f s", p.took.Seconds()), "")
		over := p.took - s.floor.took
		row("over the floor", fmt.Sprintf("%.2f s, %.0f %% of the floor", over.Seconds(), 100*over.Seconds()/s.floor.took.Seconds()), overheadTarget(s.n))
		// On a saturated machine the time over the floor cannot be less
		// than the CPU the provider's side adds (its own, and the API
		// server's, etcd's and the controllers' for its requests and
		// objects) spread over every CPU.
		cpus := float64(benchutil.NumCPU())
		busy := func(cpu float64, took time.Duration) string {
			return fmt.Sprintf("%.1f s in %.2f s (%.0f %% of %d CPUs)", cpu, took.Seconds(), 100*cpu/(cpus*took.Seconds()), int(cpus))
		}
		row("CPU of every process, floor", busy(s.floor.cpu, s.floor.took), "")
		row("CPU of every process, provider", busy(p.cpu, p.took), "")
		extra := p.cpu - s.floor.cpu
		row("CPU over the floor", fmt.Sprintf("%.1f s, %.2f s of wall time on %d CPUs: the least time over the floor on a busy machine", extra, extra/cpus, int(cpus)), "")
	}
	delays := "none recorded"
	if len(p.delays) > 0 {
		delays = quantiles(p.delays)
	}
	row("pod Ready -> PodProxy Ready", delays, "p90 under 0.2 s")
	row("provider peak RSS (VmHWM)", fmt.Sprintf("%.1f MiB (sampled peak: anonymous %.1f + file-backed %.1f MiB); load %s", float64(p.peakRSS)/1024, float64(p.peakAnon)/1024, float64(p.peakFile)/1024, p.load), "under 80 MiB at 1000, at Go's defaults")
	row("provider CPU until all Ready", fmt.Sprintf("%.2f s; load %s", p.provCPU, p.load), cpuTarget(s.n))
	row("provider requests per proxy until Ready", fmt.Sprintf("%.2f (%.2f more per proxy after Ready until its events were sent)", p.requests, p.afterReady), "at most 9, every event sent")
	row("provider events", fmt.Sprintf("%s by all Ready; %s in all", p.eventsAtReady, p.events), "none dropped")
	if p.deleted {
		row("delete phase, requests per proxy", fmt.Sprintf("%.2f all clients: %.2f the provider's, %.2f everyone else's", p.delAll, p.delProvider, p.delOthers), "under 15")
		row("PodProxy gone after its last pod", p.afterPod.String(), "95 % within 2 s")
	} else {
		row("delete phase", "not run", "")
	}
	_ = w.Flush()
}

// cpuTarget is the target for the provider's CPU until all are
// Ready.
func cpuTarget(n int) string {
	switch n {
	case 200:
		return "at most 1.6 s at 200"
	case 1000:
		return "at most 7 s at 1000"
	default:
		return "at most 1.6 s at 200, 7 s at 1000"
	}
}

// overheadTarget is the target for the time over the floor: at 200
// proxies with a 3 s kubelet, and at 1000 with an instant one.
func overheadTarget(n int) string {
	switch {
	case n >= 1000:
		return "under 50 % of the floor (at 1000, instant kubelet)"
	case n == 200:
		return "under 0.5 s (at 200, 3 s kubelet)"
	default:
		return "under 0.5 s at 200 (3 s kubelet); under 50 % of the floor at 1000 (instant)"
	}
}
