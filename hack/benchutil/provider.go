package benchutil

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

// ProviderOptions says how to run the provider binary for a benchmark.
type ProviderOptions struct {
	// Binary is the provider's path.
	Binary string
	// Kubeconfig is the control plane's.
	Kubeconfig string
	// LogPath receives the provider's stdout and stderr.
	LogPath string
	// Rate and Concurrent are --max-reconcile-rate and
	// --max-concurrent-reconciles; 0 leaves the provider's default.
	Rate, Concurrent int
	// Health is --health-probe-bind-address; "" is "0" (none).
	Health string
	// OwnInstallationID leaves --installation-id out, so that the
	// provider finds (or makes) its own, as installed; otherwise it is
	// "bench".
	OwnInstallationID bool
	// Args are further flags.
	Args []string
	// Env is added to this program's environment.
	Env []string
	// Controller is the managed resource controller (say
	// "podproxy.proxy.m.egressproxy.io") whose metrics StartProvider waits
	// for; "" waits for none.
	Controller string
	// Check, if set, is called with the metrics once the controller is
	// there; an error stops the provider and is returned.
	Check func(metrics string) error
}

// Provider is a running provider process.
type Provider struct {
	PID int
	// Metrics is the URL of its Prometheus metrics, Pprof the host:port of
	// its pprof endpoint.
	Metrics, Pprof string
	// Started is when its process was started.
	Started time.Time
	// Exited is closed when the process has exited.
	Exited <-chan struct{}

	logPath string
	stop    func()
}

// StartProvider runs the provider with its metrics and pprof on free
// loopback ports, its namespace crossplane-system and installation ID
// "bench", and waits (up to 60 s) until o.Controller's metrics show.
func StartProvider(ctx context.Context, o ProviderOptions) (*Provider, error) {
	port, err := controlplane.FreePort()
	if err != nil {
		return nil, err
	}
	pprofPort, err := controlplane.FreePort()
	if err != nil {
		return nil, err
	}
	logFile, err := os.Create(o.LogPath)
	if err != nil {
		return nil, err
	}
	if o.Health == "" {
		o.Health = "0"
	}
	args := []string{
		"--metrics-bind-address", fmt.Sprintf("127.0.0.1:%d", port),
		"--health-probe-bind-address", o.Health,
		"--pprof-bind-address", fmt.Sprintf("127.0.0.1:%d", pprofPort),
		"--namespace", "crossplane-system",
	}
	if !o.OwnInstallationID {
		args = append(args, "--installation-id", "bench")
	}
	if o.Rate > 0 {
		args = append(args, "--max-reconcile-rate", strconv.Itoa(o.Rate))
	}
	if o.Concurrent > 0 {
		args = append(args, "--max-concurrent-reconciles", strconv.Itoa(o.Concurrent))
	}
	cmd := exec.Command(o.Binary, append(args, o.Args...)...)
	cmd.Env = append(append(os.Environ(), "KUBECONFIG="+o.Kubeconfig), o.Env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	Logf("starting the provider (%s)", o.Binary)
	started := time.Now()
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p := &Provider{PID: cmd.Process.Pid, Metrics: fmt.Sprintf("http://127.0.0.1:%d/metrics", port), Pprof: fmt.Sprintf("127.0.0.1:%d", pprofPort),
		Started: started, Exited: exited, logPath: o.LogPath}
	var once sync.Once
	p.stop = func() {
		once.Do(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-exited:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
			_ = logFile.Close()
		})
	}
	if o.Controller == "" {
		return p, nil
	}
	want := `controller="managed/` + o.Controller + `"`
	deadline := time.Now().Add(60 * time.Second)
	for {
		body, err := p.Scrape(ctx)
		if err == nil && strings.Contains(body, want) {
			if o.Check != nil {
				if err := o.Check(body); err != nil {
					p.Stop()
					return nil, err
				}
			}
			return p, nil
		}
		select {
		case <-exited:
			return nil, fmt.Errorf("the provider exited:\n%s", p.LogTail(40))
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			p.Stop()
			return nil, fmt.Errorf("the provider's %s controller did not start within 60 s:\n%s", o.Controller, p.LogTail(40))
		}
	}
}

// Stop sends SIGTERM and waits up to 15 s before killing; it may be
// called more than once.
func (p *Provider) Stop() { p.stop() }

// LogTail is the last n lines of the provider's log.
func (p *Provider) LogTail(n int) string {
	b, _ := os.ReadFile(p.logPath)
	return Tail(string(b), n)
}

// Scrape returns the provider's metrics text.
func (p *Provider) Scrape(ctx context.Context) (string, error) {
	return Scrape(ctx, p.Metrics)
}

// Requests is the provider's rest_client_requests_total by HTTP method.
func (p *Provider) Requests(ctx context.Context) (map[string]float64, error) {
	body, err := p.Scrape(ctx)
	if err != nil {
		return nil, err
	}
	return ClientRequests(body), nil
}

// SaveProfile writes the provider's pprof profile of the given name and
// query ("heap", "profile?seconds=10") to path.
func (p *Provider) SaveProfile(ctx context.Context, name, path string) error {
	b, err := Scrape(ctx, "http://"+p.Pprof+"/debug/pprof/"+name)
	if err != nil {
		return err
	}
	if b == "" {
		return errors.New("empty profile")
	}
	return os.WriteFile(path, []byte(b), 0o600)
}

// ProviderFlags are the flags the benchmarks that run the provider share.
type ProviderFlags struct {
	Provider         string
	Rate, Concurrent int
	Creators         int
	KeepLogs         bool
	Env              string
}

// Register defines -provider (default binary), -max-reconcile-rate,
// -max-concurrent-reconciles, -creators, -keep-logs and -provider-env.
func (f *ProviderFlags) Register(binary string) {
	flag.StringVar(&f.Provider, "provider", binary, "The provider binary.")
	flag.IntVar(&f.Rate, "max-reconcile-rate", 500, "The provider's --max-reconcile-rate (its client allows twice as many requests per second).")
	flag.IntVar(&f.Concurrent, "max-concurrent-reconciles", 50, "The provider's --max-concurrent-reconciles.")
	flag.IntVar(&f.Creators, "creators", 16, "Managed resources created in parallel.")
	flag.BoolVar(&f.KeepLogs, "keep-logs", false, "Keep the control plane's and the provider's logs.")
	flag.StringVar(&f.Env, "provider-env", "", "Extra environment of the provider, as NAME=VALUE[,NAME=VALUE] (GOGC=100, GOMEMLIMIT=80MiB, say).")
}

// Environment is -provider-env as a list.
func (f *ProviderFlags) Environment() []string {
	if f.Env == "" {
		return nil
	}
	return strings.Split(f.Env, ",")
}
