package main

// The KVMProxy kind's backend here is the in-memory reference driver
// (internal/proxy/proxytest.Memory), so that thousands of managed
// resources cost the control plane and the provider, not libvirt.
// Everything above the driver (config resolution, catalogue checks,
// names, marks, conditions, connection Secrets, the writes client) is the
// production code.
//
// The environment steers it:
//
//	EGRESSPROXY_BENCH_STATE   a file the backend's instances are kept in
//	                          (one JSON line per change), read back at
//	                          start, so a restarted provider finds what it
//	                          created (the restart measurement)
//	EGRESSPROXY_BENCH_SETTLE  how long an instance provisions before Get
//	                          reports it Running (a Go duration; default 0,
//	                          Running at the first Get after Create)
//
// It adds the metric egressproxy_bench_observed_instances: the number of
// distinct instances this process has read with Get, which tells the
// benchmark when a restarted provider has observed every resource again.

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"hash/maphash"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/metrics"

	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/controller/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// memoryBindings are the production bindings with the KVMProxy kind on
// the in-memory driver.
func memoryBindings() func(ctrl.Manager, external.Options) []external.Binding {
	d, err := newBenchDriver(os.Getenv("EGRESSPROXY_BENCH_STATE"), os.Getenv("EGRESSPROXY_BENCH_SETTLE"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchprovider:", err)
		os.Exit(2)
	}
	metrics.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "egressproxy_bench_observed_instances",
		Help: "Distinct instances read with Get since this process started (benchmark program only).",
	}, d.observedCount))
	return func(mgr ctrl.Manager, o external.Options) []external.Binding {
		bs := pcontroller.Bindings(mgr, o)
		k := kvm.New(mgr, kvm.Options{})
		k.Backend.Connect = func(context.Context, *external.Config) (proxy.Driver, error) { return d, nil }
		for i, b := range bs {
			if be, _ := b.Describe(); be.Name == k.Backend.Name {
				bs[i] = k
			}
		}
		return bs
	}
}

// benchDriver is Memory with its instances written through to a file.
type benchDriver struct {
	*proxytest.Memory

	mu       sync.Mutex
	state    *os.File
	observed map[string]bool
	// saved holds a hash of each instance's record as last written: the
	// backend's state is not the provider's, and a copy of every record
	// would be counted in the provider's memory.
	saved map[string]uint64
	seed  maphash.Seed
}

type stateLine struct {
	proxytest.MemoryRecord
	Deleted bool `json:"deleted,omitempty"`
}

func newBenchDriver(path, settle string) (*benchDriver, error) {
	mem := proxytest.NewMemory("memory", "")
	mem.Quiet()
	d := &benchDriver{Memory: mem, observed: map[string]bool{}, saved: map[string]uint64{}, seed: maphash.MakeSeed()}
	if settle != "" {
		s, err := time.ParseDuration(settle)
		if err != nil {
			return nil, errors.Wrap(err, "EGRESSPROXY_BENCH_SETTLE")
		}
		mem.SettleAfter(s)
	} else {
		mem.SettleAfter(time.Nanosecond)
	}
	if path == "" {
		return d, nil
	}
	if f, err := os.Open(path); err == nil { //nolint:gosec // the benchmark names its own state file.
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		records := map[string]proxytest.MemoryRecord{}
		for sc.Scan() {
			var l stateLine
			if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
				_ = f.Close()
				return nil, errors.Wrapf(err, "EGRESSPROXY_BENCH_STATE %s", path)
			}
			if l.Deleted {
				delete(records, l.Name)
				continue
			}
			records[l.Name] = l.MemoryRecord
		}
		_ = f.Close()
		for name, r := range records {
			if err := mem.Restore(r); err != nil {
				return nil, err
			}
			d.saved[name] = maphash.Comparable(d.seed, r)
		}
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // as above.
	if err != nil {
		return nil, errors.Wrap(err, "EGRESSPROXY_BENCH_STATE")
	}
	d.state = f
	return d, nil
}

func (d *benchDriver) observedCount() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return float64(len(d.observed))
}

// save writes the instance's record when it changed.
func (d *benchDriver) save(name string) {
	if d.state == nil {
		return
	}
	r, ok := d.Record(name)
	d.mu.Lock()
	defer d.mu.Unlock()
	h := maphash.Comparable(d.seed, r)
	prev, had := d.saved[name]
	if ok == had && (!ok || prev == h) {
		return
	}
	l := stateLine{MemoryRecord: r, Deleted: !ok}
	l.Name = name
	b, _ := json.Marshal(l)
	_, _ = d.state.Write(append(b, '\n'))
	if ok {
		d.saved[name] = h
	} else {
		delete(d.saved, name)
	}
}

func (d *benchDriver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	inst, err := d.Memory.Create(ctx, req)
	d.save(req.Name)
	return inst, err
}

func (d *benchDriver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	inst, err := d.Memory.Get(ctx, ref)
	if err == nil {
		d.mu.Lock()
		d.observed[inst.Name] = true
		d.mu.Unlock()
		d.save(inst.Name)
	}
	return inst, err
}

func (d *benchDriver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	inst, err := d.Memory.Update(ctx, ref, req)
	if err == nil {
		d.save(inst.Name)
	}
	return inst, err
}

func (d *benchDriver) Delete(ctx context.Context, ref proxy.Ref) error {
	err := d.Memory.Delete(ctx, ref)
	if err == nil {
		name := ref.Name
		if n, ok := strings.CutPrefix(ref.ID, proxytest.MemoryIDPrefix); ok {
			name = n
		}
		d.save(name)
	}
	return err
}
