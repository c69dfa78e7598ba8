// Package provider is provider-egressproxy's program: the Crossplane
// controllers of every proxy kind in both scopes, the ProviderConfig usage
// and health controllers, a Prometheus endpoint and, when OTEL_ environment
// variables ask for it, OpenTelemetry tracing. cmd/provider runs it as
// shipped; the benchmark program under hack/ runs it with Hooks.
package provider

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"time"

	changelogsv1alpha1 "github.com/crossplane/crossplane-runtime/v2/apis/changelogs/proto/v1alpha1"
	"github.com/crossplane/crossplane-runtime/v2/pkg/controller"
	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/feature"
	"github.com/crossplane/crossplane-runtime/v2/pkg/gate"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	"github.com/crossplane/crossplane-runtime/v2/pkg/ratelimiter"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/customresourcesgate"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/statemetrics"
	"github.com/go-logr/logr"
	uberzap "go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	kvmbackend "github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	pcontroller "github.com/egressproxy/provider-egressproxy/internal/controller"
	"github.com/egressproxy/provider-egressproxy/internal/controller/external"
	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
	"github.com/egressproxy/provider-egressproxy/internal/version"
)

// Hooks change what Main runs, for a program that is not the shipped one
// (hack/benchprovider). The zero value is the provider as shipped.
type Hooks struct {
	// Bindings are the kinds the provider runs; nil is the production
	// ones (controller.Bindings).
	Bindings func(ctrl.Manager, external.Options) []external.Binding
	// Configure adjusts the API server client's configuration before any
	// client is built; nil leaves it as it is.
	Configure func(*rest.Config)
}

// Main parses the flags (and their environment variables), runs the
// provider until SIGTERM or SIGINT, and exits: status 2 for a bad flag, 1
// when the provider stopped with an error.
func Main(h Hooks) {
	start := time.Now()
	var (
		debug              = flag.Bool("debug", false, "Log at debug level: every reconcile, and the backends' V(1) lines (one per backend request); --verbosity 1.")
		verbosity          = flag.Int("verbosity", 0, "Log verbosity: 0 info, 1 as --debug, 2 adds what the backends were asked and answered, curated (a create's resolved parameters, KVM's domain XML, addresses found, names listed), 3 adds the Proxmox and Compute Engine requests and answers, secrets redacted.")
		logFormat          = flag.String("log-format", "json", "Log format: json or console.")
		syncInterval       = flag.Duration("sync", time.Hour, "How often the manager's caches resync every object (a full resync; the proxy controllers act on changes and polls, not on resyncs).")
		pollInterval       = flag.Duration("poll", 5*time.Minute, "How often a Ready proxy is checked on its backend (one API call per proxy on GCP: see docs/operations.md for the quota arithmetic).")
		notReadyPoll       = flag.Duration("poll-not-ready", 10*time.Second, "How often a proxy that is not Ready yet is checked.")
		quotaRetry         = flag.Duration("quota-retry-interval", external.DefaultQuotaRetryInterval, "How long a proxy whose backend answered out of quota or capacity waits before the next attempt (instead of the error backoff, which retries every minute at most); a longer Retry-After of the backend is waited instead.")
		pollJitter         = flag.Duration("poll-jitter", 10*time.Second, "Maximum jitter added to or taken from each poll (at most a quarter of the interval).")
		maxReconcileRate   = flag.Int("max-reconcile-rate", 100, "Reconciles per second across all controllers.")
		maxConcurrent      = flag.Int("max-concurrent-reconciles", 10, "Concurrent reconciles per controller.")
		leaderElection     = flag.Bool("leader-election", false, "Use leader election (run more than one replica).")
		enableChangeLogs   = flag.Bool("enable-changelogs", false, "Send a change log entry for every create, update and delete of a proxy to the change log sidecar (crossplane-runtime's change logs).")
		changeLogsSocket   = flag.String("changelogs-socket-path", "/var/run/changelogs/changelogs.sock", "Unix socket of the change log sidecar, for --enable-changelogs.")
		namespace          = flag.String("namespace", "crossplane-system", "The provider's namespace (for its password key and leader election); Crossplane sets POD_NAMESPACE.")
		installationID     = flag.String("installation-id", "", "Installation part of the ownership mark on every instance; default: the one kept in ConfigMap provider-egressproxy-installation of --namespace (made once, from the kube-system namespace's UID when readable).")
		metricsAddr        = flag.String("metrics-bind-address", ":8080", "Address of the Prometheus endpoint; 0 turns it off.")
		probeAddr          = flag.String("health-probe-bind-address", ":8081", "Address of the /healthz and /readyz endpoints; 0 turns it off.")
		pprofAddr          = flag.String("pprof-bind-address", "0", "Address of Go's /debug/pprof profiles (for example 127.0.0.1:6060); 0, the default, turns it off.")
		healthInterval     = flag.Duration("config-check-interval", time.Minute, "How often each ProviderConfig's backend is checked.")
		healthTimeout      = flag.Duration("config-check-timeout", 30*time.Second, "Timeout of one ProviderConfig check.")
		orphanInterval     = flag.Duration("orphan-sweep-interval", 10*time.Minute, "How often each ProviderConfig's backend is listed for instances with this installation's mark whose managed resource is gone (reported, deleted only where the config's spec.orphans.policy says Delete); 0 turns the sweep off.")
		enableMgmtPolicies = flag.Bool("enable-management-policies", true, "Honour spec.managementPolicies (Observe-only imports and the like).")
		tenantAllowed      = flag.String("tenant-endpoint-allowed-cidrs", "", "Comma-separated CIDRs (or addresses) a namespaced ProviderConfig's endpoints may be in although the provider refuses them to tenants by default (loopback, link-local, the cluster's own networks): its API URL, kubeconfig server, KVM hosts, key file URLs, image URLs. A cloud metadata address opens only when named exactly; a discovered cluster network only by a range inside it. Only the platform team, which sets the provider's flags, can set it (docs/security.md).")
		tenantDenied       = flag.String("tenant-endpoint-denied-cidrs", "", "Comma-separated CIDRs a namespaced ProviderConfig's endpoints may never be in, besides the defaults and the discovered cluster networks: a node network discovery cannot read, or any range of the platform's. It stands in for no cluster network discovery cannot read: name those with --tenant-endpoint-service-cidrs and --tenant-endpoint-pod-cidrs.")
		tenantContent      = flag.String("tenant-content-allowed-cidrs", "", "Comma-separated CIDRs (or addresses) tenants' downloads may read from although they are not public: an image a namespaced ProviderConfig or a proxy names by URL, whose bytes land where the tenant reads them, is fetched only from public addresses otherwise (a private mirror's range goes here). A discovered cluster network opens only by a range inside it; --tenant-endpoint-allowed-cidrs opens no download (docs/security.md).")
		tenantServiceCIDRs = flag.String("tenant-endpoint-service-cidrs", "", "Comma-separated CIDRs of the cluster's Service network, refused for tenants' endpoints. Set, it stands in for the kubernetes Service and the ServiceCIDRs where discovery cannot read them (a cluster before Kubernetes 1.33 serves no ServiceCIDRs): while one is unread and this is not set, every private range is refused for tenants.")
		tenantPodCIDRs     = flag.String("tenant-endpoint-pod-cidrs", "", "Comma-separated CIDRs of the cluster's pod network, refused for tenants' endpoints. Set, it stands in for the pod network where no node states it (spec.podCIDRs: Calico's IPAM, Cilium's cluster pool, a cloud's VPC addresses): while it is unknown and this is not set, every private range is refused for tenants.")
		safeStart          = flag.Bool("safe-start", true, "Start each kind's controller only once its CRD is established (Crossplane v2 safe start: kinds can be activated later).")
		kvmImageSpool      = flag.Int64("kvm-image-spool-mib", kvmbackend.DefaultMaxSpoolBytes>>20, "MiB that KVM images served without a Content-Length may hold at once in the provider's temporary directory, across every ProviderConfig and host; a download that would go past it fails with a Quota error and is retried. Only the platform's catalogue images are spooled: a tenant's image needs a Content-Length. 0 spools nothing.")
		allWrites          = flag.Bool("all-writes", false, "Send every write crossplane-runtime makes, and read connection Secrets from the API server: turns off the client that leaves out writes the API server already holds (a way to rule it out when debugging).")
	)
	parseFlags()
	if *kvmImageSpool <= 0 {
		kvmbackend.SetMaxSpoolBytes(-1)
	} else {
		kvmbackend.SetMaxSpoolBytes(*kvmImageSpool << 20)
	}

	zl := NewLogger(*verbosity, *debug, *logFormat, os.Stderr)
	ctrl.SetLogger(zl)
	log := logging.NewLogrLogger(zl.WithName("provider-egressproxy"))

	if err := run(start, log, runOptions{
		sync: *syncInterval, poll: *pollInterval, notReadyPoll: *notReadyPoll, quotaRetry: *quotaRetry, jitter: *pollJitter, rate: *maxReconcileRate, concurrent: *maxConcurrent,
		leaderElection: *leaderElection, changeLogs: *enableChangeLogs, changeLogsSocket: *changeLogsSocket, namespace: *namespace, installationID: *installationID,
		metricsAddr: *metricsAddr, probeAddr: *probeAddr, pprofAddr: *pprofAddr, healthInterval: *healthInterval, healthTimeout: *healthTimeout, orphanInterval: *orphanInterval,
		managementPolicies: *enableMgmtPolicies, safeStart: *safeStart, allWrites: *allWrites,
		tenantAllowed: *tenantAllowed, tenantDenied: *tenantDenied, tenantServiceCIDRs: *tenantServiceCIDRs, tenantPodCIDRs: *tenantPodCIDRs, tenantContent: *tenantContent,
	}, h); err != nil {
		log.Info("provider stopped with an error", "error", err.Error())
		os.Exit(1)
	}
}

// checkOptions refuses what the provider cannot do as asked.
func checkOptions(o runOptions) error {
	if !o.managementPolicies {
		// With them off, crossplane-runtime refuses every resource whose
		// policies are not the default, its deletion included, so a
		// namespace holding one could never be deleted; and the provider's
		// own steps (imports, releasing an instance) read them regardless.
		return errors.New("--enable-management-policies=false is not supported: the provider always honours spec.managementPolicies; remove the flag (or ENABLE_MANAGEMENT_POLICIES), or set it to true")
	}
	return nil
}

type runOptions struct {
	sync, poll, notReadyPoll      time.Duration
	quotaRetry                    time.Duration
	jitter                        time.Duration
	changeLogs                    bool
	changeLogsSocket              string
	rate, concurrent              int
	leaderElection                bool
	namespace, installationID     string
	metricsAddr, probeAddr        string
	pprofAddr                     string
	healthInterval, healthTimeout time.Duration
	orphanInterval                time.Duration
	managementPolicies, safeStart bool
	allWrites                     bool
	tenantAllowed, tenantDenied   string
	tenantServiceCIDRs            string
	tenantPodCIDRs                string
	tenantContent                 string
}

func run(start time.Time, log logging.Logger, o runOptions, h Hooks) error {
	if err := checkOptions(o); err != nil {
		return err
	}
	ctx := ctrl.SetupSignalHandler()

	tracing, shutdown, err := telemetry.SetupTracing(ctx, version.Version)
	if err != nil {
		return errors.Wrap(err, "cannot set up tracing")
	}
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = shutdown(sctx)
	}()

	allowed, err := netguard.ParseCIDRs("--tenant-endpoint-allowed-cidrs", strings.Split(o.tenantAllowed, ","))
	if err != nil {
		return err
	}
	denied, err := netguard.ParseCIDRs("--tenant-endpoint-denied-cidrs", strings.Split(o.tenantDenied, ","))
	if err != nil {
		return err
	}
	serviceCIDRs, err := netguard.ParseCIDRs("--tenant-endpoint-service-cidrs", strings.Split(o.tenantServiceCIDRs, ","))
	if err != nil {
		return err
	}
	podCIDRs, err := netguard.ParseCIDRs("--tenant-endpoint-pod-cidrs", strings.Split(o.tenantPodCIDRs, ","))
	if err != nil {
		return err
	}
	content, err := netguard.ParseCIDRs("--tenant-content-allowed-cidrs", strings.Split(o.tenantContent, ","))
	if err != nil {
		return err
	}

	cfg, err := ctrl.GetConfig()
	if err != nil {
		return errors.Wrap(err, "cannot get a kubeconfig (set KUBECONFIG or run in a cluster)")
	}
	cfg.QPS, cfg.Burst = float32(o.rate)*2, o.rate*4
	if h.Configure != nil {
		h.Configure(cfg)
	}

	s, err := pcontroller.Scheme()
	if err != nil {
		return err
	}
	mo := pcontroller.ManagerOptions(s, o.sync)
	mo.LeaderElection = o.leaderElection
	mo.LeaderElectionID = "provider-egressproxy.egressproxy.io"
	mo.LeaderElectionNamespace = o.namespace
	mo.LeaderElectionResourceLock = "leases"
	// The timings of provider-kubernetes and provider-helm: longer than
	// controller-runtime's 15 s lease and 10 s renewal, which a busy
	// provider (hundreds of reconciles per second) has been seen to miss,
	// losing leadership and restarting.
	mo.LeaseDuration, mo.RenewDeadline, mo.RetryPeriod = ptr.To(60*time.Second), ptr.To(50*time.Second), ptr.To(2*time.Second)
	// A replica that stops (SIGTERM: a rollout, a drain) gives the lease
	// up, so that its successor serves at once instead of after the
	// LeaseDuration; the process exits as soon as the manager has stopped,
	// so nothing runs unelected. A killed one still holds it until then.
	mo.LeaderElectionReleaseOnCancel = true
	mo.Metrics = metricsserver.Options{BindAddress: o.metricsAddr}
	mo.HealthProbeBindAddress = o.probeAddr
	mo.PprofBindAddress = o.pprofAddr
	mgr, err := ctrl.NewManager(cfg, mo)
	if err != nil {
		return errors.Wrap(err, "cannot create the manager")
	}
	if err := pcontroller.AddEventBroadcaster(mgr, mo); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("caches", cachesSynced(mgr.GetCache())); err != nil {
		return err
	}

	id := o.installationID
	if id == "" {
		// The manager's client is not started yet: read directly.
		c, err := client.New(cfg, client.Options{Scheme: s})
		if err != nil {
			return err
		}
		if id, err = waitInstallationID(ctx, log, c, o.namespace); err != nil {
			return err
		}
		if err != nil {
			return err
		}
	}

	mm := managed.NewMRMetricRecorder()
	sm := statemetrics.NewMRStateMetrics()
	metrics.Registry.MustRegister(mm, sm)

	features := &feature.Flags{}
	if o.managementPolicies {
		features.Enable(feature.EnableBetaManagementPolicies)
	}
	co := controller.Options{
		Logger:                  log,
		GlobalRateLimiter:       ratelimiter.NewGlobal(o.rate),
		PollInterval:            o.poll,
		MaxConcurrentReconciles: o.concurrent,
		Features:                features,
		MetricOptions: &controller.MetricOptions{
			PollStateMetricInterval: 10 * time.Second,
			MRMetrics:               mm,
			MRStateMetrics:          sm,
		},
	}
	if o.changeLogs {
		// The sidecar listens on a socket shared through an emptyDir; the
		// connection is made lazily, so a sidecar that starts later is fine.
		conn, err := grpc.NewClient("unix://"+o.changeLogsSocket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return errors.Wrapf(err, "cannot set up the change log client for --changelogs-socket-path %s", o.changeLogsSocket)
		}
		defer func() { _ = conn.Close() }()
		features.Enable(feature.EnableAlphaChangeLogs)
		// The change logger snapshots the whole proxy: its cloud-init is
		// redacted first.
		co.ChangeLogOptions = &controller.ChangeLogOptions{ChangeLogger: withoutSecrets(managed.NewGRPCChangeLogger(
			changelogsv1alpha1.NewChangeLogServiceClient(conn), managed.WithProviderVersion("provider-egressproxy:"+version.Version)))}
	}
	if o.safeStart {
		co.Gate = new(gate.Gate[schema.GroupVersionKind])
		if err := customresourcesgate.Setup(mgr, co); err != nil {
			return errors.Wrap(err, "cannot set up the safe-start gate")
		}
	}
	// The cluster's networks are read from the API server (nodes,
	// ServiceCIDRs, the kubernetes Service and its endpoints), as far as
	// the provider's RBAC lets it.
	discovery := netguard.NewDiscovery(mgr.GetAPIReader(), cfg.Host)
	eo := external.Options{
		Options:              co,
		InstallationID:       id,
		Namespace:            o.namespace,
		NotReadyPollInterval: o.notReadyPoll,
		QuotaRetryInterval:   o.quotaRetry,
		Events:               pcontroller.EventBroadcaster(mo),
		PollJitter:           o.jitter,
		AllWrites:            o.allWrites,
		// Every endpoint a namespaced ProviderConfig names is dialled
		// through this guard, which refuses the cluster's networks.
		TenantGuard: netguard.New(netguard.Options{Allowed: allowed, Denied: denied, ServiceCIDRs: serviceCIDRs, PodCIDRs: podCIDRs, ContentAllowed: content,
			Cluster: discovery, Log: ctrl.Log.WithName("provider-egressproxy").WithName("netguard")}),
		// The PodProxies in this cluster deny what the cluster says of
		// its networks from the same reads.
		ClusterNetworks: discovery.Cluster(),
	}
	bindings := pcontroller.Bindings
	if h.Bindings != nil {
		bindings = h.Bindings
	}
	if err := pcontroller.SetupBindings(mgr, eo, pcontroller.HealthOptions{Interval: o.healthInterval, Timeout: o.healthTimeout, OrphanInterval: o.orphanInterval},
		bindings(mgr, eo)...); err != nil {
		return errors.Wrap(err, "cannot set up controllers")
	}

	// Runnables start once the caches are synced (and, with leader
	// election, once elected): the controllers start with this one.
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		log.Info("provider started", "version", version.Version, "startupSeconds", fmt.Sprintf("%.3f", time.Since(start).Seconds()),
			"installationID", id, "tracing", tracing, "safeStart", o.safeStart,
			// What a PodProxy config that names no image runs.
			"podProxyImage", kubernetes.DefaultImage)
		<-ctx.Done()
		return nil
	})); err != nil {
		return err
	}
	return mgr.Start(ctx)
}

// lazyFields is a zap core whose With encodes its fields only once a line
// is written with them. crossplane-runtime's and controller-runtime's
// reconcilers add their fields (the request, the reconcile ID) to a new
// logger on every reconcile, and zap's JSON encoder encodes them at once,
// by reflection: a noticeable share of a steady reconcile's CPU, for
// lines that are not written unless something goes wrong or --debug is
// on. What is written is the same.
type lazyFields struct{ zapcore.Core }

func (c lazyFields) With(fields []zapcore.Field) zapcore.Core {
	return lazyFields{zapcore.NewLazyWith(c.Core, fields)}
}

// NewLogger is the provider's logger: JSON, or console for humans, on
// w, at verbosity v, --debug meaning at least 1 (logr's V(n) is zap's
// level -n). The verbosity never changes the format. Main puts it in
// every reconcile's context (through controller-runtime); tests that
// check what an operator reads build it here.
func NewLogger(v int, debug bool, format string, w io.Writer) logr.Logger {
	if debug && v < 1 {
		v = 1
	}
	// Nanosecond timestamps: seconds cannot order what happens within one
	// (a start, a burst of reconciles).
	zo := zap.Options{Development: format == "console", DestWriter: w, TimeEncoder: zapcore.RFC3339NanoTimeEncoder,
		ZapOpts: []uberzap.Option{uberzap.WrapCore(func(c zapcore.Core) zapcore.Core { return lazyFields{c} })}}
	if v > 0 {
		zo.Level = zapcore.Level(-v)
	}
	return zap.New(zap.UseFlagOptions(&zo))
}

// syncer is the part of the manager's cache that says whether its
// informers have synced.
type syncer interface {
	WaitForCacheSync(ctx context.Context) bool
}

// cachesSynced is the /readyz check: ready once the informers started so
// far have synced, so that a replica answering ready reconciles from a
// full view (a ping answered before the first list had arrived). Once
// ready it stays ready: an informer started later for a kind first read
// then, or a probe slow on a busy machine, must not take a working
// replica out. It waits less than a probe's default timeout, so a probe
// gets an answer rather than its own deadline.
func cachesSynced(c syncer) healthz.Checker {
	var synced atomic.Bool
	return func(req *http.Request) error {
		if synced.Load() {
			return nil
		}
		ctx, cancel := context.WithTimeout(req.Context(), 500*time.Millisecond)
		defer cancel()
		if !c.WaitForCacheSync(ctx) {
			return errors.New("the informer caches have not synced yet")
		}
		synced.Store(true)
		return nil
	}
}
