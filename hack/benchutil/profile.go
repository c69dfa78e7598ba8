package benchutil

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// CPUProfiles takes back-to-back CPU profiles of the provider (each of
// span, the last one cut short by Stop) into dir, so that a window whose
// length is not known in advance (from the first create until all are
// Ready) is profiled whole; pprof merges them.
type CPUProfiles struct {
	p     *Provider
	dir   string
	span  time.Duration
	mu    sync.Mutex
	files []string
	stop  chan struct{}
	done  chan struct{}
}

// StartCPUProfiles starts profiling p into dir in spans of span.
func StartCPUProfiles(ctx context.Context, p *Provider, dir string, span time.Duration) *CPUProfiles {
	c := &CPUProfiles{p: p, dir: dir, span: span, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(c.done)
		for i := 0; ; i++ {
			select {
			case <-c.stop:
				return
			case <-ctx.Done():
				return
			default:
			}
			// A span ends early when Stop is called: the profile of a
			// span that did not end is lost, so spans are short.
			path := filepath.Join(dir, fmt.Sprintf("cpu-%03d.pprof", i))
			if err := p.SaveProfile(ctx, fmt.Sprintf("profile?seconds=%d", int(span.Seconds())), path); err != nil {
				return
			}
			c.mu.Lock()
			c.files = append(c.files, path)
			c.mu.Unlock()
		}
	}()
	return c
}

// Stop waits for the span in progress to end and returns the profiles.
func (c *CPUProfiles) Stop() []string {
	close(c.stop)
	<-c.done
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.files
}

// PprofTop is `go tool pprof -top` of the profiles (merged), its first
// lines: the functions that took the most, flat and cumulative.
func PprofTop(ctx context.Context, binary string, files []string, lines int, extra ...string) (string, error) {
	if len(files) == 0 {
		return "", fmt.Errorf("no profile")
	}
	args := append([]string{"tool", "pprof", "-top", fmt.Sprintf("-nodecount=%d", lines)}, extra...)
	if binary != "" {
		args = append(args, binary)
	}
	args = append(args, files...)
	out, err := exec.CommandContext(ctx, "go", args...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go tool pprof: %w: %s", err, Tail(string(out), 5))
	}
	return strings.TrimRight(string(out), "\n"), nil
}

// Indent prefixes every line of s with prefix.
func Indent(s, prefix string) string {
	return prefix + strings.ReplaceAll(s, "\n", "\n"+prefix)
}

// RSSSampler samples a process's resident set every interval and keeps
// its peak, split anonymous and file-backed at that moment: VmHWM alone
// does not say how much of the peak is the binary's pages.
type RSSSampler struct {
	mu                 sync.Mutex
	peakAnon, peakFile int // KiB, at the sampled peak of their sum
	stop               chan struct{}
	done               chan struct{}
}

// SampleRSS starts sampling pid every interval.
func SampleRSS(pid int, interval time.Duration) *RSSSampler {
	s := &RSSSampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		t := time.NewTicker(interval)
		defer t.Stop()
		for {
			if anon, file, err := RSSNow(pid); err == nil {
				s.mu.Lock()
				if anon+file > s.peakAnon+s.peakFile {
					s.peakAnon, s.peakFile = anon, file
				}
				s.mu.Unlock()
			}
			select {
			case <-s.stop:
				return
			case <-t.C:
			}
		}
	}()
	return s
}

// Peak is the sampled peak so far, anonymous and file-backed, in KiB.
func (s *RSSSampler) Peak() (anon, file int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.peakAnon, s.peakFile
}

// Stop stops sampling.
func (s *RSSSampler) Stop() {
	select {
	case <-s.stop:
	default:
		close(s.stop)
	}
	<-s.done
}

// DataDir is where the benchmarks append their results (BENCH_DATA,
// default .cache/bench under the repository), one JSON object a line per
// file, for hack/benchchart to draw.
func DataDir() string {
	if d := os.Getenv("BENCH_DATA"); d != "" {
		return d
	}
	return filepath.Join(".cache", "bench")
}

// AppendResult appends row as one JSON line to DataDir()/name.jsonl and
// returns the file's path.
func AppendResult(name string, row any) (string, error) {
	dir := DataDir()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	b, err := json.Marshal(row)
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".jsonl")
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644) //nolint:gosec // The benchmark's own results.
	if err != nil {
		return "", err
	}
	defer f.Close()
	_, err = f.Write(append(b, '\n'))
	return path, err
}

// Events is the provider's event counts (package events' metrics):
// sent, dropped, still queued.
type Events struct{ Sent, Dropped, Queued float64 }

// EventCounts reads them from the provider's metrics text.
func EventCounts(metrics string) Events {
	return Events{
		Sent:    MetricSum(metrics, "egressproxy_events_sent_total", ""),
		Dropped: MetricSum(metrics, "egressproxy_events_dropped_total", ""),
		Queued:  MetricSum(metrics, "egressproxy_events_queued", ""),
	}
}

// Sub is e minus before (Queued stays e's).
func (e Events) Sub(before Events) Events {
	return Events{Sent: e.Sent - before.Sent, Dropped: e.Dropped - before.Dropped, Queued: e.Queued}
}

func (e Events) String() string {
	return fmt.Sprintf("%.0f sent, %.0f dropped, %.0f queued", e.Sent, e.Dropped, e.Queued)
}

// AwaitEvents waits up to timeout until the provider has no event queued,
// and returns the counts then.
func AwaitEvents(ctx context.Context, p *Provider, timeout time.Duration) (Events, error) {
	deadline := time.Now().Add(timeout)
	for {
		body, err := p.Scrape(ctx)
		if err != nil {
			return Events{}, err
		}
		e := EventCounts(body)
		if e.Queued == 0 || time.Now().After(deadline) {
			return e, nil
		}
		if err := Sleep(ctx, 200*time.Millisecond); err != nil {
			return e, err
		}
	}
}
