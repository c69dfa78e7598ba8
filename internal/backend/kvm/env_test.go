package kvm

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Secret sentinels of the test config: never to be seen in logs or errors.
const (
	sentinelKey        = "-----BEGIN OPENSSH PRIVATE KEY-----\nS3NT1NEL-key-material-9f8e7d6c5b4a\n-----END OPENSSH PRIVATE KEY-----\n"
	sentinelKnownHosts = "fake ssh-ed25519 S3NT1NEL-known-hosts-1a2b3c4d5e6f\n"
	testInstallation   = "test-install"
	testProvider       = "ClusterProviderConfig kvm-test"
)

// imageServer serves one image over HTTP, optionally holding the body
// half-way until released, or without Content-Length.
type imageServer struct {
	*httptest.Server
	content []byte
	chunked bool
	status  int
	// headSize, when set, is the Content-Length a HEAD claims (a lie).
	headSize int
	gets     atomic.Int32
	mu       sync.Mutex
	hold     chan struct{}
}

func newImageServer(t *testing.T, size int) *imageServer {
	s := &imageServer{content: make([]byte, size)}
	for i := range s.content {
		s.content[i] = byte(i * 7)
	}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.status != 0 {
			w.WriteHeader(s.status)
			return
		}
		if r.Method == http.MethodHead && s.headSize != 0 {
			w.Header().Set("Content-Length", strconv.Itoa(s.headSize))
			return
		}
		if !s.chunked {
			w.Header().Set("Content-Length", strconv.Itoa(len(s.content)))
		}
		if r.Method == http.MethodHead {
			return
		}
		s.gets.Add(1)
		s.mu.Lock()
		hold := s.hold
		s.mu.Unlock()
		half := len(s.content) / 2
		_, _ = w.Write(s.content[:half])
		if f, ok := w.(http.Flusher); ok {
			f.Flush()
		}
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
				return
			}
		}
		_, _ = w.Write(s.content[half:])
	}))
	t.Cleanup(s.Close)
	return s
}

func (s *imageServer) sha() string {
	h := sha256.Sum256(s.content)
	return hex.EncodeToString(h[:])
}

// holdBodies makes downloads stop half-way until the returned release.
func (s *imageServer) holdBodies() (release func()) {
	ch := make(chan struct{})
	s.mu.Lock()
	s.hold = ch
	s.mu.Unlock()
	var once sync.Once
	return func() { once.Do(func() { close(ch) }) }
}

// testEnv is a driver on a fake host with an image server.
type testEnv struct {
	t       *testing.T
	host    *fakeHost
	images  *imageServer
	cfg     Config
	logs    *testenv.Buffer
	spans   *tracetest.SpanRecorder
	b       *Backend
	d       *Driver
	dialErr error
	dials   atomic.Int32
	// resolver answers for the hosts' names.
	resolver fakeResolver
}

// fakeResolver resolves the names it holds; any other is not found.
type fakeResolver map[string][]netip.Addr

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, Server: "10.96.0.10:53", IsNotFound: true}
}

func newTestEnv(t *testing.T, mutate ...func(*testEnv)) *testEnv {
	t.Helper()
	e := &testEnv{t: t, host: newFakeHost(), images: newImageServer(t, 3<<20), logs: &testenv.Buffer{}, spans: tracetest.NewSpanRecorder(),
		resolver: fakeResolver{"fakehost": {netip.MustParseAddr("192.0.2.10")}, "fakehost2": {netip.MustParseAddr("192.0.2.11")}}}
	e.cfg = Config{
		Name:        testProvider,
		Credentials: Credentials{Key: []byte(sentinelKey), KnownHosts: []byte(sentinelKnownHosts)},
		DiskSizeGB:  10,
		// Every Tidy after the first evicts what it found unused.
		UnusedImageRetention: time.Nanosecond,
		InstallGuestAgent:    true,
		Images:               map[string]Image{"debian": {URL: e.images.URL + "/debian.qcow2", SHA256: e.images.sha()}},
		MachineTypes:         map[string]MachineType{"small": {VCPUs: 1, MemoryMiB: 1024}},
		Hosts:                []Host{{Name: "lab", Address: "fakehost:22", User: "proxy", Bridge: "br0"}},
	}
	for _, m := range mutate {
		m(e)
	}
	e.start()
	return e
}

// start builds a Backend and a Driver (again, after a simulated crash).
func (e *testEnv) start() {
	// Every tier: SecretsNeverLeak reads it all.
	log := funcr.New(func(prefix, args string) { e.logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 10})
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(e.spans))
	e.b = NewBackend(Options{
		Resolver: e.resolver,
		Log:      &log,
		Tracer:   tp.Tracer("test"),
		// Results kept for no time, and every check waits for its probe (the fake answers at once): every Get sees the fake's Squid as it is.
		Prober: &squid.Prober{Ask: e.host.squidAsk, Wait: time.Minute, PositiveTTL: time.Nanosecond, NegativeTTL: time.Nanosecond},
		dial: func(ctx context.Context, t Target) (*conn, error) {
			e.dials.Add(1)
			if e.dialErr != nil {
				return nil, e.dialErr
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			fc := e.host.conn()
			return &conn{api: fc, link: newLink(fc.Close, time.Second)}, nil
		},
	})
	b := e.b
	e.t.Cleanup(b.Close)
	e.d = e.b.Driver(e.cfg)
}

// crash drops every in-memory state, as a provider restart does.
func (e *testEnv) crash() {
	e.b.Close()
	e.start()
}

func (e *testEnv) request(name, uid string) proxy.Request {
	return proxy.Request{
		Name:      name,
		Mark:      proxy.Mark{UID: uid, InstallationID: testInstallation},
		Placement: proxy.Placement{Location: "lab", MachineType: "small", Image: "debian"},
		Proxy:     proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443}},
	}
}

// settle waits for background work on the instance, then boots it.
func (e *testEnv) settle(ctx context.Context, id string) error {
	_, name, err := parseID(id)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		pe := e.b.pendingFor(Target{Host: e.cfg.Hosts[0]}.endpoint() + "/" + name)
		if pe == nil {
			break
		}
		if pe.failure() != nil || time.Now().After(deadline) {
			return pe.failure()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	port := 3128
	e.host.mu.Lock()
	if d := e.host.domains[name]; d != nil {
		if m, err := parseMeta(d.meta[metadataURI]); err == nil && m.Port > 0 {
			port = int(m.Port)
		}
	}
	e.host.mu.Unlock()
	e.host.boot(name, port)
	return nil
}

func (e *testEnv) mustCreate(req proxy.Request) proxy.Instance {
	e.t.Helper()
	inst, err := e.d.Create(context.Background(), req)
	if err != nil {
		e.t.Fatalf("Create(%s): %v", req.Name, err)
	}
	return inst
}

func (e *testEnv) mustGet(ref proxy.Ref) proxy.Instance {
	e.t.Helper()
	inst, err := e.d.Get(context.Background(), ref)
	if err != nil {
		e.t.Fatalf("Get(%+v): %v", ref, err)
	}
	return inst
}

func ref(inst proxy.Instance) proxy.Ref {
	return proxy.Ref{ID: inst.ID, Name: inst.Name, Mark: inst.Mark, Placement: inst.Placement}
}
