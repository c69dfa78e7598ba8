package docs

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/statemetrics"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/prometheus/client_golang/prometheus"
)

// runtimeMetrics are the managed-resource metrics crossplane-runtime
// registers for the provider, read from its collectors.
func runtimeMetrics() []string {
	ch := make(chan *prometheus.Desc, 64)
	go func() {
		managed.NewMRMetricRecorder().Describe(ch)
		statemetrics.NewMRStateMetrics().Describe(ch)
		close(ch)
	}()
	var out []string
	for d := range ch {
		// Desc has no accessor; its String is Desc{fqName: "name", ...}.
		s := d.String()
		if _, rest, ok := strings.Cut(s, `fqName: "`); ok {
			if name, _, ok := strings.Cut(rest, `"`); ok {
				out = append(out, name)
			}
		}
	}
	return out
}

// runtimeReasons are the condition reasons crossplane-runtime writes on
// the provider's resources.
var runtimeReasons = []string{
	string(xpv2.ReasonAvailable), string(xpv2.ReasonUnavailable), string(xpv2.ReasonCreating), string(xpv2.ReasonDeleting),
	string(xpv2.ReasonReconcileSuccess), string(xpv2.ReasonReconcileError), string(xpv2.ReasonReconcilePaused),
}

func check(t *testing.T, root string) (bad []string, kinds map[string]int) {
	t.Helper()
	metrics := runtimeMetrics()
	if len(metrics) == 0 {
		t.Fatal("read no metric of crossplane-runtime's collectors")
	}
	k, err := Scan(root, metrics, runtimeReasons)
	if err != nil {
		t.Fatal(err)
	}
	pages, err := Pages(root)
	if err != nil {
		t.Fatal(err)
	}
	kinds = map[string]int{}
	for _, p := range pages {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, p)
		refs := Extract(rel, string(b))
		for _, r := range refs {
			kinds[r.Kind]++
		}
		bad = append(bad, Check(refs, k)...)
	}
	return bad, kinds
}

// TestDocsNameWhatExists: every flag, environment variable, metric,
// condition reason and make target that README.md and docs/*.md give in
// code exists in the code or the Makefile (Scan says how each is found).
func TestDocsNameWhatExists(t *testing.T) {
	bad, kinds := check(t, filepath.Join("..", ".."))
	for _, b := range bad {
		t.Error(b)
	}
	// The pages give names of every kind: a check that read none of a
	// kind would pass for nothing.
	for _, k := range []string{Flag, Env, Metric, Reason, Target, FlagEnv} {
		if kinds[k] == 0 {
			t.Errorf("found no %s in the pages: the check reads them wrong", k)
		}
	}
}

// TestCheckFindsPlantedNames runs the check over a small repository
// (testdata/fixture) whose pages give one real and one wrong name of
// each kind: each wrong one is reported, with its page and line, and no
// real one is.
func TestCheckFindsPlantedNames(t *testing.T) {
	got, _ := check(t, filepath.Join("testdata", "fixture"))
	// A wrong name in a flags table is also a flag and a variable that
	// do not exist: each is said.
	want := []string{
		`README.md:5: flag "pol": no program of this repository defines it`,
		`README.md:7: make target "tset": the Makefile has no such target`,
		`docs/ops.md:5: environment variable "POLL_INTERVAL": no code, script or Makefile reads or sets it`,
		`docs/ops.md:5: flag's environment variable "poll": its environment variable is EGRESSPROXY_POLL, not POLL_INTERVAL`,
		`docs/ops.md:6: flag "no-such-flag": no program of this repository defines it`,
		`docs/ops.md:6: environment variable "NO_SUCH_FLAG": no code, script or Makefile reads or sets it`,
		`docs/ops.md:6: flag's environment variable "no-such-flag": the provider has no such flag`,
		`docs/ops.md:10: metric "egressproxy_orphan": no such metric is registered`,
		`docs/ops.md:12: environment variable "EGRESSPROXY_NO_SUCH": no code, script or Makefile reads or sets it`,
		`docs/ops.md:18: condition reason "NodeGone": no code writes such a reason`,
		`docs/ops.md:20: condition reason "PoolMissing": no code writes such a reason`,
		`docs/ops.md:25: make target "bench-sacle": the Makefile has no such target`,
	}
	for _, w := range want {
		found := false
		for _, g := range got {
			if strings.HasPrefix(g, w) {
				found = true
			}
		}
		if !found {
			t.Errorf("not reported: %s", w)
		}
	}
	if len(got) != len(want) {
		t.Errorf("reported %d problems, want the %d planted:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
}
