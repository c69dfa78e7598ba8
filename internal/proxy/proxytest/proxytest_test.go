package proxytest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// TestMemoryConforms runs the suite, as a driver's test would, on Memory.
func TestMemoryConforms(t *testing.T) {
	t.Parallel()
	Run(t, MemoryHarness())
}

// recorder is a tb that records instead of failing the test; Fatalf and
// Skipf end the check's goroutine, as they do in package testing.
type recorder struct {
	mu      sync.Mutex
	failed  bool
	skipped bool
	lines   []string
}

func (r *recorder) Helper() {}

func (r *recorder) add(prefix, format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, prefix+fmt.Sprintf(format, args...))
}

func (r *recorder) Errorf(format string, args ...any) {
	r.add("FAIL: ", format, args...)
	r.mu.Lock()
	r.failed = true
	r.mu.Unlock()
}

func (r *recorder) Fatalf(format string, args ...any) {
	r.Errorf(format, args...)
	runtime.Goexit()
}

func (r *recorder) Skipf(format string, args ...any) {
	r.add("SKIP: ", format, args...)
	r.mu.Lock()
	r.skipped = true
	r.mu.Unlock()
	runtime.Goexit()
}

func (r *recorder) Logf(format string, args ...any) { r.add("log: ", format, args...) }

// suiteResult is which checks failed and which were skipped, with what
// each check reported.
type suiteResult struct {
	failed, skipped []string
	report          map[string][]string
}

// runRecorded runs every check, each on a fresh fixture, against recorders.
func runRecorded(newFixture func() Fixture) suiteResult { return runRecordedAs(newFixture, false) }

// runRecordedAs is runRecorded for a harness that is complete or not.
func runRecordedAs(newFixture func() Fixture, complete bool) suiteResult {
	cs := checks()
	recs := make([]*recorder, len(cs))
	var wg sync.WaitGroup
	for i, c := range cs {
		recs[i] = &recorder{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			runCheck(recs[i], newFixture(), c, complete)
		}()
	}
	wg.Wait()
	res := suiteResult{report: map[string][]string{}}
	for i, c := range cs {
		if recs[i].failed {
			res.failed = append(res.failed, c.name)
		}
		if recs[i].skipped {
			res.skipped = append(res.skipped, c.name)
		}
		res.report[c.name] = recs[i].lines
	}
	slices.Sort(res.failed)
	slices.Sort(res.skipped)
	return res
}

func (r suiteResult) dump(t *testing.T) {
	t.Helper()
	for name, lines := range r.report {
		for _, l := range lines {
			t.Logf("%s: %s", name, l)
		}
	}
}

func TestMemoryPassesEveryCheckWithoutSkipping(t *testing.T) {
	t.Parallel()
	res := runRecorded(func() Fixture { return NewMemory("memory-test", "proxytest-installation").Fixture() })
	if len(res.failed) != 0 || len(res.skipped) != 0 {
		res.dump(t)
		t.Errorf("failed %v, skipped %v; want none", res.failed, res.skipped)
	}
}

// TestCompleteHarnessFailsWhatWouldSkip: with Harness.Complete, a check
// that a missing poke would skip fails, saying which poke: no driver's
// suite can pass while a check of the contract did not run.
func TestCompleteHarnessFailsWhatWouldSkip(t *testing.T) {
	t.Parallel()
	res := runRecordedAs(func() Fixture {
		m := NewMemory("memory-test", "proxytest-installation")
		f := m.Fixture()
		f.PartialCreate = nil
		return f
	}, true)
	if want := []string{"DeletionRemovesWhatACutShortCreateLeft", "ListReportsWhatACutShortCreateLeft"}; !slices.Equal(res.failed, want) || len(res.skipped) != 0 {
		res.dump(t)
		t.Fatalf("failed %v, skipped %v; want failed %v and none skipped", res.failed, res.skipped, want)
	}
	if lines := res.report[res.failed[0]]; len(lines) == 0 || !strings.Contains(lines[len(lines)-1], "PartialCreate poke") {
		t.Errorf("the failure %q does not name the missing poke", lines)
	}
}

// TestMissingPokesSkip: a fixture with nothing but a driver and requests
// skips exactly the checks that need a poke, and passes the rest.
func TestMissingPokesSkip(t *testing.T) {
	t.Parallel()
	res := runRecorded(func() Fixture {
		m := NewMemory("memory-test", "proxytest-installation")
		return Fixture{Driver: m, Provider: m.Provider(), Request: m.Request}
	})
	wantSkipped := []string{
		"BusyBackendIsTransientNeverNotFound",
		"CreateRefusesToAdoptForeignMarkedInstance",
		"CreateRefusesToAdoptUnmarkedInstance",
		"DeleteRefusesForeignMarkedInstance",
		"DeleteRefusesUnmarkedInstance",
		"DeletionRemovesWhatACutShortCreateLeft",
		"EgressReportedOnlyFromAValidLineWhenUnreached",
		"GetDuringDeleteIsNeverNotFound",
		"ListExcludesUnmarkedInstances",
		"ListReportsWhatACutShortCreateLeft",
		"MalformedIDsArePermanent",
		"TenantGuestsReportedAddressIsRefused",
		"UnknownBackendStateReadsAsStopped",
		"UpdateRefusesForeignMarkedInstance",
		"UpdateRefusesUnmarkedInstance",
	}
	if diff := cmp.Diff(wantSkipped, res.skipped); diff != "" {
		res.dump(t)
		t.Errorf("skipped checks (-want +got):\n%s", diff)
	}
	if len(res.failed) != 0 {
		res.dump(t)
		t.Errorf("failed %v; want none", res.failed)
	}
	for _, name := range res.skipped {
		if lines := res.report[name]; len(lines) == 0 || !strings.Contains(lines[len(lines)-1], "poke") && !strings.Contains(lines[len(lines)-1], "MalformedIDs") {
			t.Errorf("%s: skip message %q does not name the missing capability", name, lines)
		}
	}
}

func TestRunRejectsBrokenFixtures(t *testing.T) {
	t.Parallel()
	m := NewMemory("memory-test", "proxytest-installation")
	cases := map[string]Fixture{
		"no driver":  {Request: m.Request},
		"no request": {Driver: m},
		"request without installation": {Driver: m, Request: func(name, uid string) proxy.Request {
			r := m.Request(name, uid)
			r.Mark.InstallationID = ""
			return r
		}},
	}
	for name, f := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := &recorder{}
			done := make(chan struct{})
			go func() { defer close(done); runCheck(r, f, checks()[0], false) }()
			<-done
			if !r.failed || !strings.Contains(strings.Join(r.lines, "\n"), "proxytest: Fixture") {
				t.Errorf("runCheck with %s: failed=%v, %q; want a failure naming the fixture", name, r.failed, r.lines)
			}
		})
	}
}

// hooked is Memory with some Driver methods replaced; the replacements
// call the Memory to do the real work, then get something wrong.
type hooked struct {
	*Memory
	create func(context.Context, proxy.Request) (proxy.Instance, error)
	get    func(context.Context, proxy.Ref) (proxy.Instance, error)
	update func(context.Context, proxy.Ref, proxy.Request) (proxy.Instance, error)
	del    func(context.Context, proxy.Ref) error
	list   func(context.Context, string) ([]proxy.Instance, error)
	check  func(context.Context) proxy.Health
}

// onRefusedCreate is m with a Create that, where m refuses (Permanent) an
// instance that is not the request's, does instead what takeOver does.
func onRefusedCreate(m *Memory, takeOver func(context.Context, proxy.Request) (proxy.Instance, error)) *hooked {
	return &hooked{Memory: m, create: func(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
		inst, err := m.Create(ctx, req)
		if proxy.IsPermanent(err) {
			return takeOver(ctx, req)
		}
		return inst, err
	}}
}

func (h *hooked) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	if h.create != nil {
		return h.create(ctx, req)
	}
	return h.Memory.Create(ctx, req)
}

func (h *hooked) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	if h.get != nil {
		return h.get(ctx, ref)
	}
	return h.Memory.Get(ctx, ref)
}

func (h *hooked) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	if h.update != nil {
		return h.update(ctx, ref, req)
	}
	return h.Memory.Update(ctx, ref, req)
}

func (h *hooked) Delete(ctx context.Context, ref proxy.Ref) error {
	if h.del != nil {
		return h.del(ctx, ref)
	}
	return h.Memory.Delete(ctx, ref)
}

func (h *hooked) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	if h.list != nil {
		return h.list(ctx, installationID)
	}
	return h.Memory.List(ctx, installationID)
}

func (h *hooked) Check(ctx context.Context) proxy.Health {
	if h.check != nil {
		return h.check(ctx)
	}
	return h.Memory.Check(ctx)
}

// mapInstances changes every instance Get and List return.
func mapInstances(m *Memory, fn func(*proxy.Instance)) *hooked {
	return &hooked{
		Memory: m,
		get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
			inst, err := m.Get(ctx, ref)
			if err == nil {
				fn(&inst)
			}
			return inst, err
		},
		list: func(ctx context.Context, installationID string) ([]proxy.Instance, error) {
			l, err := m.List(ctx, installationID)
			for i := range l {
				fn(&l[i])
			}
			return l, err
		},
	}
}

// stateOf reads the Memory's own state of an instance, as a driver reads
// its backend's.
func stateOf(m *Memory, name string) memState {
	m.mu.Lock()
	defer m.mu.Unlock()
	if in, ok := m.instances[name]; ok {
		return in.state
	}
	return ""
}

// TestSuiteCatchesBrokenDrivers: each broken driver fails exactly the
// checks for the property it breaks, and no other.
func TestSuiteCatchesBrokenDrivers(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name  string
		wrap  func(m *Memory) proxy.Driver
		fixup func(f *Fixture, m *Memory)
		want  []string
	}{
		{
			name: "Get publishes a reported address beside one the provider reached",
			wrap: func(m *Memory) proxy.Driver {
				return mapInstances(m, func(i *proxy.Instance) {
					if i.EgressSource == proxy.EgressReported {
						i.ProxyAddress = i.IP + ":3128"
					}
				})
			},
			want: []string{"EgressReportedOnlyFromAValidLineWhenUnreached"},
		},
		{
			name: "Get reads a guest's report that is no address",
			wrap: func(m *Memory) proxy.Driver {
				return mapInstances(m, func(i *proxy.Instance) {
					if i.State == proxy.StateRunning && !i.ProxyReachable {
						i.ProxyReachable, i.EgressIP, i.EgressSource = true, "203.0.113.77", proxy.EgressReported
					}
				})
			},
			// A refused address reads as reachable too.
			want: []string{"EgressReportedOnlyFromAValidLineWhenUnreached", "TenantGuestsReportedAddressIsRefused"},
		},
		{
			name: "Get probes what a tenant's guest names",
			wrap: func(m *Memory) proxy.Driver {
				return mapInstances(m, func(i *proxy.Instance) {
					if i.IP == TenantRefusedIP {
						i.ProxyReachable, i.ProxyAddress, i.Progress = true, i.IP+":3128", ""
					}
				})
			},
			want: []string{"TenantGuestsReportedAddressIsRefused"},
		},
		{
			name: "Get says NotFound when the backend is busy",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
					inst, err := m.Get(ctx, ref)
					if proxy.IsTransient(err) && ctx.Err() == nil {
						return inst, proxy.WithContext(proxy.NotFoundf("no instance %q", ref.Name), m.Provider(), OpGet)
					}
					return inst, err
				}}
			},
			want: []string{"BusyBackendIsTransientNeverNotFound"},
		},
		{
			name: "Get and Delete of a Ref without a location say a plain Permanent",
			wrap: func(m *Memory) proxy.Driver {
				unplaced := func(ref proxy.Ref) error {
					if ref.ID == "" && ref.Placement.Location == "" {
						return proxy.WithContext(proxy.Permanentf("no location"), m.Provider(), OpGet)
					}
					return nil
				}
				return &hooked{Memory: m,
					get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
						if err := unplaced(ref); err != nil {
							return proxy.Instance{}, err
						}
						return m.Get(ctx, ref)
					},
					del: func(ctx context.Context, ref proxy.Ref) error {
						if err := unplaced(ref); err != nil {
							return err
						}
						return m.Delete(ctx, ref)
					}}
			},
			want: []string{"UnplacedRefIsNotFoundOrUnresolved"},
		},
		{
			name: "List swallows a busy backend and returns nothing",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, list: func(ctx context.Context, id string) ([]proxy.Instance, error) {
					l, err := m.List(ctx, id)
					if err != nil && ctx.Err() == nil {
						return nil, nil
					}
					return l, err
				}}
			},
			want: []string{"BusyBackendIsTransientNeverNotFound"},
		},
		{
			name: "Create adopts an instance it does not own",
			wrap: func(m *Memory) proxy.Driver {
				return onRefusedCreate(m, func(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
					return m.Get(ctx, proxy.Ref{Name: req.Name})
				})
			},
			want: takeovers("Create"),
		},
		{
			name: "Create replaces an instance it does not own",
			wrap: func(m *Memory) proxy.Driver {
				return onRefusedCreate(m, func(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
					m.Remove(req.Name)
					return m.Create(ctx, req)
				})
			},
			want: takeovers("Create"),
		},
		{
			name: "Delete removes another resource's instance",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, del: func(ctx context.Context, ref proxy.Ref) error {
					if inst, err := m.Get(ctx, ref); err == nil && inst.Mark != (proxy.Mark{}) {
						ref.Mark = inst.Mark // trusts whatever mark it finds
					}
					return m.Delete(ctx, ref)
				}}
			},
			want: []string{
				"DeleteRefusesForeignMarkedInstance",
				"DeleteRefusesInstanceOfAnotherInstallation",
				"DeleteRefusesInstanceOfAnotherUID",
			},
		},
		{
			name: "Get of a resource being deleted ignores what a cut-short create left",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
					ref.Deleting = false
					return m.Get(ctx, ref)
				}}
			},
			want: []string{"DeletionRemovesWhatACutShortCreateLeft"},
		},
		{
			name: "Tidy removes what instances use",
			wrap: func(m *Memory) proxy.Driver { return &tidyingAll{Memory: m} },
			want: []string{"TidyKeepsWhatInstancesUse"},
		},
		{
			name: "List leaves out what a cut-short create left",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, list: func(ctx context.Context, id string) ([]proxy.Instance, error) {
					l, err := m.List(ctx, id)
					return slices.DeleteFunc(l, func(i proxy.Instance) bool { return len(i.Leftovers) > 0 }), err
				}}
			},
			want: []string{"ListReportsWhatACutShortCreateLeft"},
		},
		{
			name: "List reports another installation's leftovers as this one's",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, list: func(ctx context.Context, id string) ([]proxy.Instance, error) {
					l, err := m.List(ctx, id)
					if ours, _ := m.List(ctx, m.installation); id != m.installation {
						for _, o := range ours {
							if len(o.Leftovers) > 0 {
								o.Mark.InstallationID = id
								l = append(l, o)
							}
						}
					}
					return l, err
				}}
			},
			want: []string{"ListReportsWhatACutShortCreateLeft"},
		},
		{
			name: "Delete of a missing instance leaves what its create left",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, del: func(ctx context.Context, ref proxy.Ref) error {
					if _, err := m.Get(ctx, proxy.Ref{ID: ref.ID, Name: ref.Name, Placement: ref.Placement}); proxy.IsNotFound(err) {
						return nil
					}
					return m.Delete(ctx, ref)
				}}
			},
			want: []string{"DeletionRemovesWhatACutShortCreateLeft", "ListReportsWhatACutShortCreateLeft"},
		},
		{
			name: "Delete removes any instance of the name, marked or not",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, del: func(ctx context.Context, ref proxy.Ref) error {
					m.mu.Lock()
					err := m.enter(ctx, OpDelete, refString(ref))
					m.mu.Unlock()
					if err != nil {
						return err
					}
					inst, err := m.Get(ctx, ref)
					switch {
					case err == nil:
						m.Remove(inst.Name)
					case !proxy.IsNotFound(err):
						return err
					}
					return nil
				}}
			},
			want: append(takeovers("Delete"), "ListReportsWhatACutShortCreateLeft"),
		},
		{
			name: "Update rewrites another resource's instance as its own",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, update: func(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
					inst, err := m.Update(ctx, ref, req)
					if proxy.IsPermanent(err) {
						m.Remove(req.Name)
						if _, err := m.Create(ctx, req); err != nil {
							return proxy.Instance{}, err
						}
						return m.Update(ctx, ref, req)
					}
					return inst, err
				}}
			},
			want: takeovers("Update"),
		},
		{
			name: "Get reports the caller's mark for an instance it does not own",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
					inst, err := m.Get(ctx, ref)
					if err == nil && ref.Live && ref.Mark == (proxy.Mark{}) {
						inst.Mark = proxy.Mark{UID: uidA, InstallationID: m.installation}
					}
					return inst, err
				}}
			},
			want: takeovers("Create", "Delete", "Update"),
		},
		{
			name: "repeat Create makes a second instance",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, create: func(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
					if existing, err := m.Get(ctx, proxy.Ref{Name: req.Name}); err == nil && existing.Mark == req.Mark {
						req.Name += "-2"
					}
					return m.Create(ctx, req)
				}}
			},
			want: []string{"RepeatCreateCreatesNothingNew"},
		},
		{
			name: "a booted domain without lease reads as Running",
			wrap: func(m *Memory) proxy.Driver {
				return mapInstances(m, func(i *proxy.Instance) {
					if i.State == proxy.StateProvisioning {
						i.State = proxy.StateRunning
					}
				})
			},
			want: []string{"NeverStartedIsProvisioningNotStopped", "RunningRequiresAddress"},
		},
		{
			name: "a never-started instance reads as Stopped",
			wrap: func(m *Memory) proxy.Driver {
				return mapInstances(m, func(i *proxy.Instance) {
					if i.State == proxy.StateProvisioning {
						i.State = proxy.StateStopped
					}
				})
			},
			want: []string{"NeverStartedIsProvisioningNotStopped"},
		},
		{
			name: "an unknown backend state reads as Running",
			wrap: func(m *Memory) proxy.Driver {
				return mapInstances(m, func(i *proxy.Instance) {
					if stateOf(m, i.Name) == memUnknown {
						i.State = proxy.StateRunning
					}
				})
			},
			want: []string{"UnknownBackendStateReadsAsStopped"},
		},
		{
			name: "CreatedAt is not read back",
			wrap: func(m *Memory) proxy.Driver {
				return mapInstances(m, func(i *proxy.Instance) { i.CreatedAt = i.CreatedAt.AddDate(-3, 0, 0) })
			},
			want: []string{"MarkAndCreatedAtReadBack"},
		},
		{
			name: "Get during a deletion says NotFound",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
					inst, err := m.Get(ctx, ref)
					if err == nil && inst.Progress == "deleting" {
						return proxy.Instance{}, proxy.WithContext(proxy.NotFoundf("gone"), m.Provider(), OpGet)
					}
					return inst, err
				}}
			},
			want: []string{"GetDuringDeleteIsNeverNotFound"},
		},
		{
			name: "Delete of a missing instance fails NotFound",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, del: func(ctx context.Context, ref proxy.Ref) error {
					if _, err := m.Get(ctx, ref); proxy.IsNotFound(err) {
						return err
					}
					return m.Delete(ctx, ref)
				}}
			},
			want: []string{"DeleteOfNeverCreatedSucceeds", "DeleteTwiceSucceeds", "GetDuringDeleteIsNeverNotFound", "ListReportsWhatACutShortCreateLeft", "UnplacedRefIsNotFoundOrUnresolved"},
		},
		{
			name: "a malformed ID falls back to the name",
			wrap: func(m *Memory) proxy.Driver {
				fallback := func(ref proxy.Ref) proxy.Ref {
					if _, ok := parseID(ref.ID); !ok {
						ref.ID = ""
					}
					return ref
				}
				return &hooked{
					Memory: m,
					get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
						return m.Get(ctx, fallback(ref))
					},
					del: func(ctx context.Context, ref proxy.Ref) error { return m.Delete(ctx, fallback(ref)) },
				}
			},
			want: []string{"MalformedIDsArePermanent"},
		},
		{
			name: "the context is ignored",
			wrap: func(m *Memory) proxy.Driver {
				bg := context.WithoutCancel
				return &hooked{
					Memory: m,
					create: func(ctx context.Context, req proxy.Request) (proxy.Instance, error) { return m.Create(bg(ctx), req) },
					get:    func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) { return m.Get(bg(ctx), ref) },
					update: func(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
						return m.Update(bg(ctx), ref, req)
					},
					del:  func(ctx context.Context, ref proxy.Ref) error { return m.Delete(bg(ctx), ref) },
					list: func(ctx context.Context, id string) ([]proxy.Instance, error) { return m.List(bg(ctx), id) },
				}
			},
			want: []string{"CancelledContextReturnsPromptly"},
		},
		{
			name: "Get finishes its backend call before looking at the context",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
					if ctx.Err() != nil {
						time.Sleep(promptly + 100*time.Millisecond)
					}
					return m.Get(ctx, ref)
				}}
			},
			want: []string{"CancelledContextReturnsPromptly"},
		},
		{
			name: "the request, password included, is put into errors",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{
					Memory: m,
					create: func(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
						inst, err := m.Create(ctx, req)
						if err != nil {
							return inst, fmt.Errorf("creating %+v: %w", req.Proxy, err)
						}
						return inst, nil
					},
				}
			},
			want: []string{"SecretsNeverLeak"},
		},
		{
			name: "the user-data is logged base64-encoded",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, create: func(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
					m.log.Info("metadata", "user-data", base64.StdEncoding.EncodeToString([]byte("#!/bin/sh\n"+req.CloudInit)))
					return m.Create(ctx, req)
				}}
			},
			want: []string{"SecretsNeverLeak"},
		},
		{
			name: "a configured token is logged",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, check: func(ctx context.Context) proxy.Health {
					m.log.Info("probing", "authorization", "PVEAPIToken=root@pam!ci=tok-0123456789abcdef")
					return m.Check(ctx)
				}}
			},
			fixup: func(f *Fixture, _ *Memory) { f.Secrets = []string{"tok-0123456789abcdef"} },
			want:  []string{"SecretsNeverLeak"},
		},
		{
			name: "errors do not name the provider",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, get: func(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
					inst, err := m.Get(ctx, ref)
					var pe *proxy.Error
					if errors.As(err, &pe) {
						cp := *pe
						cp.Provider = ""
						return inst, &cp
					}
					return inst, err
				}}
			},
			want: []string{"ErrorsAreClassifiedWithProvider"},
		},
		{
			name: "errors are not classified",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, update: func(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
					inst, err := m.Update(ctx, ref, req)
					if err != nil {
						return inst, errors.New(err.Error())
					}
					return inst, nil
				}}
			},
			// The takeover checks want Update's refusal Permanent.
			want: append([]string{"ErrorsAreClassifiedWithProvider"}, takeovers("Update")...),
		},
		{
			name: "errors name another provider",
			wrap: func(m *Memory) proxy.Driver { return m },
			fixup: func(f *Fixture, _ *Memory) {
				f.Provider = "the-configured-name"
			},
			want: []string{"ErrorsAreClassifiedWithProvider"},
		},
		{
			name: "List returns every instance in the backend",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, list: func(ctx context.Context, id string) ([]proxy.Instance, error) {
					if _, err := m.List(ctx, id); err != nil {
						return nil, err
					}
					return m.Instances(), nil
				}}
			},
			want: append(takeovers("Create", "Delete", "Update"),
				"ListExcludesUnmarkedInstances",
				"ListIncludesOursAndExcludesOtherInstallations",
				"ListReportsWhatACutShortCreateLeft",
			),
		},
		{
			name: "List drops instances it did not create",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, list: func(ctx context.Context, id string) ([]proxy.Instance, error) {
					l, err := m.List(ctx, id)
					return slices.DeleteFunc(l, func(i proxy.Instance) bool { return i.SpecHash == "" }), err
				}}
			},
			want: []string{
				"CreateRefusesToAdoptForeignMarkedInstance",
				"DeleteRefusesForeignMarkedInstance",
				"ListIncludesOursAndExcludesOtherInstallations",
				"ListReportsWhatACutShortCreateLeft",
				"UpdateRefusesForeignMarkedInstance",
			},
		},
		{
			name: "Update does not rewrite SpecHash",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, update: func(ctx context.Context, ref proxy.Ref, _ proxy.Request) (proxy.Instance, error) {
					return m.Get(ctx, ref)
				}}
			},
			// It also "succeeds" on instances that are not the caller's.
			want: append([]string{"UpdateRewritesSpecHash"}, takeovers("Update")...),
		},
		{
			name: "Check reports no targets",
			wrap: func(m *Memory) proxy.Driver {
				return &hooked{Memory: m, check: func(context.Context) proxy.Health { return proxy.Health{} }}
			},
			want: []string{"CheckReturnsTargets"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			res := runRecorded(func() Fixture {
				m := NewMemory("memory-test", "proxytest-installation")
				f := m.Fixture()
				f.Driver = tc.wrap(m)
				if tc.fixup != nil {
					tc.fixup(&f, m)
				}
				return f
			})
			want := slices.Clone(tc.want)
			slices.Sort(want)
			if diff := cmp.Diff(want, res.failed); diff != "" {
				res.dump(t)
				t.Errorf("failing checks (-want +got):\n%s", diff)
			}
			if len(res.skipped) != 0 {
				t.Errorf("skipped %v; want none", res.skipped)
			}
		})
	}
}

// takeovers names the takeover checks of ops (Create, Update, Delete) for
// every kind of instance that is not the caller's, sorted.
func takeovers(ops ...string) []string {
	var out []string
	for _, op := range ops {
		prefix := op + "Refuses"
		if op == "Create" {
			prefix = "CreateRefusesToAdopt"
		}
		for _, a := range adoptCases() {
			out = append(out, prefix+a.name)
		}
	}
	slices.Sort(out)
	return out
}

// TestLeaks covers the secret detector itself: plain and base64 at every
// alignment, and no alarm for unrelated text.
func TestLeaks(t *testing.T) {
	t.Parallel()
	const secret = sentinelPassword1
	for prefix := range 3 {
		data := strings.Repeat("x", prefix) + "user: proxytest\npassword: " + secret + "\n"
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding, base64.RawStdEncoding} {
			if _, ok := leaks("metadata="+enc.EncodeToString([]byte(data)), secret); !ok {
				t.Errorf("base64 at alignment %d not detected", prefix)
			}
		}
	}
	if _, ok := leaks("prefix "+secret+" suffix", secret); !ok {
		t.Error("plain secret not detected")
	}
	if form, ok := leaks(base64.StdEncoding.EncodeToString([]byte("an unrelated, harmless value")), secret); ok {
		t.Errorf("false alarm on %q", form)
	}
}

// tidyingAll is a Tidier that removes every instance.
type tidyingAll struct{ *Memory }

func (t *tidyingAll) Tidy(context.Context) ([]string, error) {
	var out []string
	for _, i := range t.Instances() {
		t.Remove(i.Name)
		out = append(out, i.Name)
	}
	return out, nil
}
