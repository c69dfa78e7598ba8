package envflag

import (
	"bytes"
	"flag"
	"io"
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	cases := map[string]struct {
		env     map[string]string
		args    []string
		poll    time.Duration
		rate    int
		le      bool
		ns      string
		wantErr string
	}{
		"Defaults": {poll: time.Minute, rate: 100, ns: "crossplane-system"},
		"FromTheEnvironment": {env: map[string]string{"EGRESSPROXY_POLL": "5m", "EGRESSPROXY_MAX_RECONCILE_RATE": "7", "EGRESSPROXY_LEADER_ELECTION": "true"},
			poll: 5 * time.Minute, rate: 7, le: true, ns: "crossplane-system"},
		"CommandLineWins": {env: map[string]string{"EGRESSPROXY_POLL": "5m"}, args: []string{"--poll=2m"}, poll: 2 * time.Minute, rate: 100, ns: "crossplane-system"},
		// What a platform injects into every container sets nothing.
		"UnprefixedVariablesIgnored": {env: map[string]string{"POLL": "5m", "MAX_RECONCILE_RATE": "7", "NAMESPACE": "other", "egressproxy_poll": "5m"},
			poll: time.Minute, rate: 100, ns: "crossplane-system"},
		"Alias":                 {env: map[string]string{"LEADER_ELECTION": "true", "POD_NAMESPACE": "xp"}, poll: time.Minute, rate: 100, le: true, ns: "xp"},
		"PrefixedWinsOverAlias": {env: map[string]string{"POD_NAMESPACE": "xp", "EGRESSPROXY_NAMESPACE": "mine"}, poll: time.Minute, rate: 100, ns: "mine"},
		"ExceptedFlag":          {env: map[string]string{"KUBECONFIG": "/a:/b", "EGRESSPROXY_KUBECONFIG": "/a"}, poll: time.Minute, rate: 100, ns: "crossplane-system"},
		"BadValueNamesTheVariable": {env: map[string]string{"EGRESSPROXY_POLL": "soon"},
			wantErr: `environment variable EGRESSPROXY_POLL (flag --poll) is "soon"`},
		"BadAliasValueNamesTheAlias": {env: map[string]string{"LEADER_ELECTION": "maybe"},
			wantErr: `environment variable LEADER_ELECTION (flag --leader-election) is "maybe"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("provider", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			poll := fs.Duration("poll", time.Minute, "")
			rate := fs.Int("max-reconcile-rate", 100, "")
			le := fs.Bool("leader-election", false, "")
			ns := fs.String("namespace", "crossplane-system", "")
			kc := fs.String("kubeconfig", "", "")
			o := Options{Except: []string{"kubeconfig"}, Aliases: map[string][]string{"leader-election": {"LEADER_ELECTION"}, "namespace": {"POD_NAMESPACE"}}}
			err := Parse(fs, tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, o)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Parse: %v; want an error containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if *kc != "" {
				t.Errorf("--kubeconfig = %q from the environment; want it left to client-go", *kc)
			}
			if *poll != tc.poll || *rate != tc.rate || *le != tc.le || *ns != tc.ns {
				t.Errorf("poll %v rate %d leader-election %v namespace %q; want %v %d %v %q", *poll, *rate, *le, *ns, tc.poll, tc.rate, tc.le, tc.ns)
			}
		})
	}
}

func TestAliasOfNoFlag(t *testing.T) {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	fs.Bool("leader-election", false, "")
	err := Parse(fs, nil, func(string) (string, bool) { return "", false }, Options{Aliases: map[string][]string{"leader-elecion": {"LEADER_ELECTION"}}})
	if err == nil || !strings.Contains(err.Error(), "--leader-elecion") {
		t.Errorf("Parse with an alias of no flag: %v; want an error naming it", err)
	}
}

func TestUsage(t *testing.T) {
	fs := flag.NewFlagSet("provider", flag.ContinueOnError)
	fs.Bool("leader-election", false, "Use leader election.")
	fs.Duration("poll", time.Minute, "How often.")
	fs.String("kubeconfig", "", "A kubeconfig.")
	var b bytes.Buffer
	Usage(&b, fs, Options{Except: []string{"kubeconfig"}, Aliases: map[string][]string{"leader-election": {"LEADER_ELECTION"}}})
	for _, want := range []string{
		"  --kubeconfig (no variable, default \"\")\n",
		"  --leader-election (EGRESSPROXY_LEADER_ELECTION, also LEADER_ELECTION, default \"false\")\n",
		"  --poll (EGRESSPROXY_POLL, default \"1m0s\")\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("usage lacks %q:\n%s", want, b.String())
		}
	}
}
