package envflag

import (
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
		wantErr string
	}{
		"Defaults":                 {poll: time.Minute, rate: 100},
		"FromTheEnvironment":       {env: map[string]string{"POLL": "5m", "MAX_RECONCILE_RATE": "7", "LEADER_ELECTION": "true"}, poll: 5 * time.Minute, rate: 7, le: true},
		"CommandLineWins":          {env: map[string]string{"POLL": "5m"}, args: []string{"--poll=2m"}, poll: 2 * time.Minute, rate: 100},
		"OtherVariablesIgnored":    {env: map[string]string{"poll": "5m", "EGRESSPROXY_POLL": "5m"}, poll: time.Minute, rate: 100},
		"ExceptedFlag":             {env: map[string]string{"KUBECONFIG": "/a:/b"}, poll: time.Minute, rate: 100},
		"BadValueNamesTheVariable": {env: map[string]string{"POLL": "soon"}, wantErr: `environment variable POLL (flag --poll) is "soon"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fs := flag.NewFlagSet("provider", flag.ContinueOnError)
			fs.SetOutput(io.Discard)
			poll := fs.Duration("poll", time.Minute, "")
			rate := fs.Int("max-reconcile-rate", 100, "")
			le := fs.Bool("leader-election", false, "")
			kc := fs.String("kubeconfig", "", "")
			err := Parse(fs, tc.args, func(k string) (string, bool) { v, ok := tc.env[k]; return v, ok }, "kubeconfig")
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
				t.Errorf("--kubeconfig = %q from KUBECONFIG; want it left to client-go", *kc)
			}
			if *poll != tc.poll || *rate != tc.rate || *le != tc.le {
				t.Errorf("poll %v rate %d leader-election %v; want %v %d %v", *poll, *rate, *le, tc.poll, tc.rate, tc.le)
			}
		})
	}
}
