// Package benchutil holds what the benchmarks under hack/ share: reading
// a process's CPU and memory from /proc, Prometheus text from the provider
// and the API server, and running work in parallel. Benchmarks print
// figures; nothing here asserts a time.
package benchutil

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// InParallel calls fn for 0..n-1 on workers goroutines and returns the
// first error.
func InParallel(n, workers int, fn func(i int) error) error {
	work := make(chan int)
	var wg sync.WaitGroup
	var first error
	var once sync.Once
	for range workers {
		wg.Go(func() {
			for i := range work {
				if err := fn(i); err != nil {
					once.Do(func() { first = err })
				}
			}
		})
	}
	for i := range n {
		work <- i
	}
	close(work)
	wg.Wait()
	return first
}

// CPUSince is each process's CPU seconds since before, sorted by name.
func CPUSince(pids map[string]int, before map[string]float64) []string {
	var rows []string
	for name, pid := range pids {
		c, _ := CPUSeconds(pid)
		rows = append(rows, fmt.Sprintf("%s %.1f s", name, c-before[name]))
	}
	sort.Strings(rows)
	return rows
}

// CPUTotalSince is the CPU seconds of all the processes since before.
func CPUTotalSince(pids map[string]int, before map[string]float64) float64 {
	var total float64
	for name, pid := range pids {
		c, _ := CPUSeconds(pid)
		total += c - before[name]
	}
	return total
}

// PerProxy is the growth of each API server request count, per proxy, for
// those of at least 0.005 (every one the two decimals show), and the
// counts of the others on one line, so that every request is shown.
func PerProxy(before, after map[string]float64, n int) []string {
	var rows, small []string
	for k, v := range after {
		d := v - before[k]
		switch {
		case d/float64(n) >= 0.005:
			rows = append(rows, fmt.Sprintf("  %-40s %6.2f", k, d/float64(n)))
		case d > 0:
			small = append(small, fmt.Sprintf("%s %.0f", k, d))
		}
	}
	sort.Strings(rows)
	if len(small) > 0 {
		sort.Strings(small)
		rows = append(rows, "  under 0.005 each, as counts: "+strings.Join(small, ", "))
	}
	return rows
}

// Pct is the p-th percentile of d, which is sorted.
func Pct(d []time.Duration, p int) time.Duration {
	i := (len(d)*p + 99) / 100
	if i > 0 {
		i--
	}
	return d[min(i, len(d)-1)]
}

// MetricSum sums the samples of one metric whose labels contain filter.
func MetricSum(text, name, filter string) float64 {
	total := 0.0
	for _, l := range strings.Split(text, "\n") {
		if !strings.HasPrefix(l, name+"{") && !strings.HasPrefix(l, name+" ") {
			continue
		}
		if filter != "" && !strings.Contains(l, filter) {
			continue
		}
		f := strings.Fields(l)
		if v, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
			total += v
		}
	}
	return total
}

// APIServerRequests reads the API server's apiserver_request_total, summed
// by "resource[/subresource] VERB", leaving out watches.
func APIServerRequests(ctx context.Context, cfg *rest.Config) (map[string]float64, error) {
	text, err := apiServerMetrics(ctx, cfg)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, smp := range Samples(text, "apiserver_request_total") {
		kv := smp.Labels
		if kv["verb"] == "WATCH" || kv["resource"] == "" {
			continue
		}
		res := kv["resource"]
		if kv["subresource"] != "" {
			res += "/" + kv["subresource"]
		}
		out[res+" "+kv["verb"]] += smp.Value
	}
	return out, nil
}

// TerminatedWatchers reads the API server's
// apiserver_terminated_watchers_total by resource: the watches it closed
// because their client did not read its events fast enough (the client
// then opens the watch again, one more request).
func TerminatedWatchers(ctx context.Context, cfg *rest.Config) (map[string]float64, error) {
	text, err := apiServerMetrics(ctx, cfg)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for _, smp := range Samples(text, "apiserver_terminated_watchers_total") {
		out[smp.Labels["resource"]] += smp.Value
	}
	return out, nil
}

// apiServerMetrics is the API server's /metrics.
func apiServerMetrics(ctx context.Context, cfg *rest.Config) (string, error) {
	rc, err := rest.RESTClientFor(WithCodec(cfg))
	if err != nil {
		return "", err
	}
	b, err := rc.Get().AbsPath("/metrics").Do(ctx).Raw()
	return string(b), err
}

// Grown are "key n" rows, sorted, of the keys whose count grew from before
// to after; "none" when none did.
func Grown(before, after map[string]float64) string {
	var rows []string
	for k, v := range after {
		if d := v - before[k]; d > 0 {
			rows = append(rows, fmt.Sprintf("%s %.0f", k, d))
		}
	}
	if len(rows) == 0 {
		return "none"
	}
	sort.Strings(rows)
	return strings.Join(rows, ", ")
}

// Sample is one line of a Prometheus text exposition: its labels and value.
type Sample struct {
	Labels map[string]string
	Value  float64
}

// Samples are the samples of the metric name (with labels) in text.
func Samples(text, name string) []Sample {
	var out []Sample
	for _, l := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(l, name+"{")
		if !ok {
			continue
		}
		labels, value, ok := strings.Cut(rest, "} ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			continue
		}
		kv := map[string]string{}
		for _, p := range strings.Split(labels, ",") {
			if k, val, ok := strings.Cut(p, "="); ok {
				kv[k] = strings.Trim(val, `"`)
			}
		}
		out = append(out, Sample{Labels: kv, Value: v})
	}
	return out
}

// WithCodec is cfg with the core API's codec, for a raw REST client (to
// GET /metrics or /debug/pprof of kube-apiserver).
func WithCodec(cfg *rest.Config) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.GroupVersion = &corev1.SchemeGroupVersion
	c.APIPath = "/api"
	c.NegotiatedSerializer = clientgoscheme.Codecs.WithoutConversion()
	return c
}

// CPUSeconds is utime+stime of pid (USER_HZ is 100 on Linux).
func CPUSeconds(pid int) (float64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	s = s[strings.LastIndexByte(s, ')')+2:]
	f := strings.Fields(s)
	if len(f) < 13 {
		return 0, errors.New("short /proc stat")
	}
	u, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	return (u + st) / 100, nil
}

// PeakRSS is VmHWM (peak resident set) of pid in KiB.
func PeakRSS(pid int) (int, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "VmHWM:"); ok {
			return strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return 0, errors.New("no VmHWM")
}

// RSSParts is the resident set's parts now, anonymous (heap, stacks) and
// file-backed (the binary's pages), as text.
func RSSParts(pid int) string {
	anon, file, err := RSSNow(pid)
	if err != nil {
		return "?"
	}
	return fmt.Sprintf("anon %.1f MiB, file %.1f MiB", float64(anon)/1024, float64(file)/1024)
}

// NumCPU is the machine's processors, from /proc/cpuinfo.
func NumCPU() int {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return 0
	}
	return strings.Count(string(b), "processor\t:")
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// RSSNow is pid's resident set now, in KiB: anonymous (heap, stacks) and
// file-backed (the binary's pages), from /proc/PID/status.
func RSSNow(pid int) (anon, file int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "RssAnon:"); ok {
			anon, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
		if v, ok := strings.CutPrefix(l, "RssFile:"); ok {
			file, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(v), " kB"))
		}
	}
	return anon, file, nil
}

// Load is /proc/loadavg's first three fields: the machine's load, printed
// next to every figure (other work on the machine moves them).
func Load() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}

// ClientRequests sums rest_client_requests_total in Prometheus text by
// HTTP method: every request a process's Kubernetes clients sent.
func ClientRequests(text string) map[string]float64 {
	out := map[string]float64{}
	for _, smp := range Samples(text, "rest_client_requests_total") {
		method := smp.Labels["method"]
		if method == "" {
			method = "?"
		}
		out[method] += smp.Value
	}
	return out
}

// ResourceRequests sums egressproxy_bench_requests_total in Prometheus
// text (hack/benchprovider counts them) by "resource VERB", leaving out
// watches: the requests ClientRequests counts, split by what they were
// sent to. It is empty for the shipped provider.
func ResourceRequests(text string) map[string]float64 {
	out := map[string]float64{}
	for _, smp := range Samples(text, "egressproxy_bench_requests_total") {
		if smp.Labels["verb"] != "WATCH" {
			out[smp.Labels["resource"]+" "+smp.Labels["verb"]] += smp.Value
		}
	}
	return out
}

// OnlyWrites is the part of by (keyed as Writes reads it) that changes
// something, leaving out keys that did not grow.
func OnlyWrites(by map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range by {
		if v > 0 && Writes(map[string]float64{k: v}) > 0 {
			out[k] = v
		}
	}
	return out
}

// PerMethod is the growth from before to after of requests counted by
// method (ClientRequests), in all and per proxy: the total per proxy and
// "METHOD n.nn" rows for those that grew.
func PerMethod(before, after map[string]float64, n int) (float64, []string) {
	total := 0.0
	var rows []string
	for m, v := range after {
		if d := v - before[m]; d > 0 {
			total += d
			rows = append(rows, fmt.Sprintf("%s %.2f", m, d/float64(n)))
		}
	}
	sort.Strings(rows)
	return total / float64(n), rows
}

// Writes is the number of requests in by (method or "resource VERB" as
// ClientRequests and APIServerRequests count them) that change
// something: every method or verb but GET, LIST and WATCH.
func Writes(by map[string]float64) float64 {
	total := 0.0
	for k, v := range by {
		f := strings.Fields(k)
		switch f[len(f)-1] {
		case "GET", "LIST", "WATCH":
		default:
			total += v
		}
	}
	return total
}

// Delta is after minus before, key by key.
func Delta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	return out
}

// Scrape GETs a Prometheus endpoint and returns its text.
func Scrape(ctx context.Context, url string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
