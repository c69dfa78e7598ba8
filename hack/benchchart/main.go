// Command benchchart draws the benchmarks' results as SVG charts with
// gonum.org/v1/plot: it reads the JSON lines the benchmarks append to
// their data folder (hack/benchutil.AppendResult; BENCH_DATA, default
// .cache/bench) and writes the charts beside them. A module of its own, so
// the plotting library is not a dependency of the provider.
//
//	go run . -data ../../.cache/bench
//
// Charts (each only when its data is there):
//
//	podproxy-ready.svg  time to all Ready against N, the floor and the provider, per kubelet delay
//	podproxy-rss.svg    the provider's peak RSS against N: in all, anonymous, file-backed
//	scale-ready.svg     bench-scale: time to all Ready against N
//	scale-rss.svg       bench-scale: peak and steady RSS against N
//	kvm-phases.svg      bench-kvm: the median time from a KVMProxy's create to each phase
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

func main() {
	data := flag.String("data", filepath.Join(".cache", "bench"), "The benchmarks' data folder.")
	flag.Parse()
	if err := run(*data); err != nil {
		fmt.Fprintln(os.Stderr, "benchchart:", err)
		os.Exit(1)
	}
}

func run(dir string) error {
	for _, c := range []struct {
		file string
		draw func(dir string, rows []row) ([]string, error)
	}{{"podproxy", podproxy}, {"scale", scale}, {"kvm", kvm}} {
		rows, err := read(filepath.Join(dir, c.file+".jsonl"))
		if err != nil {
			return err
		}
		if len(rows) == 0 {
			continue
		}
		files, err := c.draw(dir, rows)
		if err != nil {
			return fmt.Errorf("%s: %w", c.file, err)
		}
		for _, f := range files {
			fmt.Println(f)
		}
	}
	return nil
}

// row is one JSON line.
type row map[string]any

func (r row) num(k string) float64 {
	f, _ := r[k].(float64)
	return f
}

func (r row) str(k string) string {
	s, _ := r[k].(string)
	return s
}

func read(path string) ([]row, error) {
	f, err := os.Open(path) //nolint:gosec // The benchmarks' own data.
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var rows []row
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		var r row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		rows = append(rows, r)
	}
	return rows, sc.Err()
}

// latest keeps, for each key, the last row (runs are appended in order):
// a run repeated replaces the earlier one on the chart.
func latest(rows []row, key func(row) string) []row {
	idx := map[string]int{}
	var out []row
	for _, r := range rows {
		k := key(r)
		if i, ok := idx[k]; ok {
			out[i] = r
			continue
		}
		idx[k] = len(out)
		out = append(out, r)
	}
	return out
}

// series is the points of rows (x, y), sorted by x.
func series(rows []row, x, y string) plotter.XYs {
	var pts plotter.XYs
	for _, r := range rows {
		if _, ok := r[y]; !ok {
			continue
		}
		pts = append(pts, plotter.XY{X: r.num(x), Y: r.num(y)})
	}
	sort.Slice(pts, func(i, j int) bool { return pts[i].X < pts[j].X })
	return pts
}

// lines draws named series on one chart and saves it.
func lines(path, title, xl, yl string, named []any) error {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, xl, yl
	p.Y.Min = 0
	p.Legend.Top, p.Legend.Left = true, true
	if err := plotutil.AddLinePoints(p, named...); err != nil {
		return err
	}
	return p.Save(16*vg.Centimeter, 10*vg.Centimeter, path)
}

func podproxy(dir string, rows []row) ([]string, error) {
	// A run that timed out has no time to Ready.
	rows = slices.DeleteFunc(rows, func(r row) bool { b, _ := r["timedOut"].(bool); return b })
	// A run without the proxies' NetworkPolicies measures that piece's
	// cost, not the provider as it ships.
	rows = slices.DeleteFunc(rows, func(r row) bool { b, ok := r["networkPolicy"].(bool); return ok && !b })
	rows = latest(rows, func(r row) string { return fmt.Sprintf("%s/%v/%v", r.str("side"), r.num("n"), r.num("delaySeconds")) })
	delays := map[float64]bool{}
	for _, r := range rows {
		delays[r.num("delaySeconds")] = true
	}
	var ready, rss []any
	for _, d := range sortedKeys(delays) {
		var floor, prov []row
		for _, r := range rows {
			if r.num("delaySeconds") != d {
				continue
			}
			if r.str("side") == "floor" {
				floor = append(floor, r)
			} else {
				prov = append(prov, r)
			}
		}
		ready = append(ready, fmt.Sprintf("floor, kubelet %gs", d), series(floor, "n", "readySeconds"),
			fmt.Sprintf("provider, kubelet %gs", d), series(prov, "n", "readySeconds"))
		rss = append(rss, fmt.Sprintf("peak RSS, kubelet %gs", d), series(prov, "n", "peakRSSMiB"),
			fmt.Sprintf("anonymous at the peak, kubelet %gs", d), series(prov, "n", "peakAnonMiB"),
			fmt.Sprintf("file-backed at the peak, kubelet %gs", d), series(prov, "n", "peakFileMiB"))
	}
	a, b := filepath.Join(dir, "podproxy-ready.svg"), filepath.Join(dir, "podproxy-rss.svg")
	if err := lines(a, "PodProxy: all Ready after the first create", "PodProxies", "seconds", drop(ready)); err != nil {
		return nil, err
	}
	if err := lines(b, "PodProxy: the provider's peak RSS", "PodProxies", "MiB", drop(rss)); err != nil {
		return nil, err
	}
	return []string{a, b}, nil
}

func scale(dir string, rows []row) ([]string, error) {
	rows = latest(rows, func(r row) string { return fmt.Sprint(r.num("n")) })
	a, b := filepath.Join(dir, "scale-ready.svg"), filepath.Join(dir, "scale-rss.svg")
	if err := lines(a, "bench-scale: all Ready after the stage's first create", "managed resources", "seconds",
		drop([]any{"all Ready (stage)", series(rows, "n", "stageReadySeconds")})); err != nil {
		return nil, err
	}
	if err := lines(b, "bench-scale: the provider's RSS", "managed resources", "MiB", drop([]any{
		"peak", series(rows, "n", "peakRSSMiB"),
		"steady, anonymous", series(rows, "n", "steadyAnonMiB"),
		"steady, file-backed", series(rows, "n", "steadyFileMiB"),
	})); err != nil {
		return nil, err
	}
	return []string{a, b}, nil
}

// kvm draws, for the last run, the median time from the create until
// each phase was reached (phases need not come in order: cloud-init may
// end after the provider's Ready).
func kvm(dir string, rows []row) ([]string, error) {
	run := rows[len(rows)-1].str("run")
	phases := []string{}
	byPhase := map[string][]float64{}
	for _, r := range rows {
		if r.str("run") != run {
			continue
		}
		ph := r.str("phase")
		if _, ok := byPhase[ph]; !ok {
			phases = append(phases, ph)
		}
		byPhase[ph] = append(byPhase[ph], r.num("sinceCreate"))
	}
	vals := make(plotter.Values, len(phases))
	for i, ph := range phases {
		vals[i] = median(byPhase[ph])
	}
	p := plot.New()
	p.Title.Text = "KVMProxy: each phase reached, median seconds after the create (" + run + ")"
	p.Y.Label.Text = "seconds after the create"
	bars, err := plotter.NewBarChart(vals, vg.Points(28))
	if err != nil {
		return nil, err
	}
	bars.Color = color.RGBA{R: 70, G: 110, B: 170, A: 255}
	p.Add(bars)
	p.NominalX(phases...)
	path := filepath.Join(dir, "kvm-phases.svg")
	if err := p.Save(20*vg.Centimeter, 10*vg.Centimeter, path); err != nil {
		return nil, err
	}
	return []string{path}, nil
}

// drop leaves out the named series without points.
func drop(named []any) []any {
	var out []any
	for i := 0; i+1 < len(named); i += 2 {
		if pts, ok := named[i+1].(plotter.XYs); ok && len(pts) == 0 {
			continue
		}
		out = append(out, named[i], named[i+1])
	}
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func sortedKeys(m map[float64]bool) []float64 {
	var out []float64
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
