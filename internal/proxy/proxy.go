// Package proxy is the backend-neutral contract between the Crossplane
// controller layer and the backend drivers (kvm, proxmox, gcp, kubernetes).
//
// The controller layer knows Crossplane and nothing of any backend; a driver
// knows its backend and nothing of Crossplane. Data goes down as a Request and
// comes back as an Instance and a classified *Error.
package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"
)

// State is the lifecycle state of a backend instance, the same on every
// backend.
type State string

// The states a driver may report.
const (
	// StateProvisioning: the backend accepted the instance but it is not yet
	// serving (cloning, booting, pulling, no address yet). Never-started
	// instances are Provisioning, never Stopped.
	StateProvisioning State = "Provisioning"
	// StateRunning: the backend says running and an address is known.
	StateRunning State = "Running"
	// StateStopped: the instance exists but is not running (shut off,
	// paused, suspended, or a state the driver does not know).
	StateStopped State = "Stopped"
	// StateTerminated: the instance has ended and will not run again
	// without being recreated (a failed pod, a terminated VM).
	StateTerminated State = "Terminated"
)

// Mark is the ownership mark every instance carries: the managed resource's
// UID and the installation that created it. Create refuses to adopt an
// instance whose mark differs; List returns only instances carrying the
// installation's mark.
type Mark struct {
	// UID of the managed resource that owns the instance.
	UID string
	// InstallationID names the provider installation (one control plane).
	// Two installations sharing a backend never collect each other's
	// instances.
	InstallationID string
}

// Placement says where an instance runs and what it runs, as catalogue keys
// of the ProviderConfig. Empty fields mean the backend's default.
type Placement struct {
	// Location is the host (KVM), node (Proxmox) or zone (GCP).
	Location string
	// MachineType is a key of the config's machine-type catalogue.
	MachineType string
	// Image is a key of the config's image or template catalogue, or (KVM)
	// an http(s) URL.
	Image string
}

// Auth is basic authentication on the proxy. Password is resolved by the
// controller layer (from a Secret, or generated); drivers never generate
// credentials.
type Auth struct {
	Enabled  bool
	Username string
	Password string
}

// Settings is what the proxy itself enforces; it is the same on every
// backend and rendered into squid.conf by internal/squid.
type Settings struct {
	// Port the proxy listens on.
	Port int32
	// AllowedClientCIDRs may use the proxy; everyone else is denied.
	AllowedClientCIDRs []string
	// AllowedPorts are the CONNECT targets allowed (443 when empty).
	AllowedPorts []int32
	// AllowedDestinations, when non-empty, is a domain allow-list
	// (".example.com" matches subdomains).
	AllowedDestinations []string
	// AllowedDestinationCIDRs open private destination ranges (RFC 1918,
	// 100.64.0.0/10, fc00::/7 and the like), which the proxy denies
	// otherwise. Loopback, link-local, metadata and the cluster's own
	// networks are never opened. (omitempty: Hash, and so every existing
	// instance, stays the same while it is unused.)
	AllowedDestinationCIDRs []string `json:",omitempty"`
	// Auth is optional basic authentication.
	Auth Auth
	// EgressCheck, when set, is the provider's own credential for the
	// egress check, which the proxy accepts for its URL alone. (omitempty:
	// Hash, and so every existing instance, stays the same while no config
	// names a check.)
	EgressCheck *EgressCheck `json:",omitempty"`
	// TLS, when set, makes the proxy listen with TLS on Port instead of
	// plain HTTP. (omitempty: Hash stays the same while it is unused.)
	TLS *TLS `json:",omitempty"`
}

// ProxyCA is the CA of a proxy listening with TLS, "" without TLS: what
// a readiness probe verifies its certificate against (Ref.ProxyCA).
func (s Settings) ProxyCA() string {
	if s.TLS == nil {
		return ""
	}
	return s.TLS.CA
}

// TLS is the proxy's certificate, resolved and checked by the controller
// layer from the resource's TLS Secret. Key is secret: Hash leaves it out
// (it enters through SecretDigest), and String redacts it.
type TLS struct {
	// Cert is the PEM certificate chain, the proxy's certificate first.
	Cert string
	// Key is the PEM private key of the first certificate.
	Key string
	// CA is the PEM certificate clients verify the proxy's against (the
	// connection Secret's ca.crt).
	CA string
}

// String describes t without the key.
func (t TLS) String() string {
	return fmt.Sprintf("proxy.TLS{Cert: %d bytes, Key: redacted, CA: %d bytes}", len(t.Cert), len(t.CA))
}

// GoString is String, so that %#v redacts too.
func (t TLS) GoString() string { return t.String() }

// Format makes every verb print String.
func (t TLS) Format(s fmt.State, _ rune) { _, _ = s.Write([]byte(t.String())) }

// EgressCheck is the egress check as the proxy enforces it: one echo
// endpoint, and a credential the provider holds that Squid accepts for
// that endpoint and nothing else, from any address (the provider's own is
// usually not among the allowed clients). Password is generated by the
// controller layer and never the proxy user's; Hash leaves it out.
type EgressCheck struct {
	// URL of the echo endpoint (http or https).
	URL string
	// Username and Password of the check credential.
	Username string
	Password string
	// ProxyCA is Settings.TLS.CA when the proxy listens with TLS: the
	// check connects to it with TLS and verifies its certificate against
	// this.
	ProxyCA string
}

// Extension is a backend's own part of a Request: what only that backend
// reads (a GCP proxy's address and firewall, a PodProxy's Service). The
// kind's binding fills it and the backend's driver reads it; the controller
// layer passes it on without looking inside.
type Extension interface {
	// HashInput is what Hash digests of the extension, marshalled as JSON.
	HashInput() any
}

// Request is everything a driver needs to create or update one instance.
type Request struct {
	// Name is the deterministic, backend-safe instance name (the managed
	// resource's external name): lowercase letters, digits and dashes, at
	// most 63 characters, unique across namespaces.
	Name string
	// Mark is written onto the instance and checked before adoption.
	Mark Mark
	// Placement as catalogue keys.
	Placement Placement
	// Proxy is what Squid enforces.
	Proxy Settings
	// Extension is the backend's own part of the request; nil when the
	// backend has none.
	Extension Extension
	// CloudInit is optional user-data, merged with the generated Squid
	// setup. It is secret: never log it.
	CloudInit string
	// Labels are extra, non-secret labels for backends that support them.
	Labels map[string]string
	// SecretDigest is a keyed digest of the secret parts (password,
	// cloud-init) computed by the controller, so Hash changes when they do
	// without exposing them.
	SecretDigest string
	// TenantGuest says a tenant writes what the instance's guest runs (its
	// cloud-init, an image by URL, or the whole config) on a backend that
	// learns the instance's address from the guest: the guest can report
	// any address, so the driver dials what it reports through the tenant
	// guard and quotes nothing it answered, as for a namespaced config.
	// Decided by the controller layer; not hashed.
	TenantGuest bool
}

// Ref identifies an existing instance for Get and Delete.
type Ref struct {
	// ID is the backend ID a driver returned earlier; it may be empty when
	// the instance was never created by this managed resource (for example
	// an Observe-only import), in which case the driver resolves Name
	// within Placement.
	ID string
	// Name is the instance name (the managed resource's external name).
	Name string
	// Mark of the managed resource, so Update and Delete can refuse an
	// instance that is not its own.
	Mark Mark
	// Placement, as in the Request.
	Placement Placement
	// Operation is the asynchronous operation the last Create, Update or
	// Get reported (Instance.Operation), so its outcome is read and never
	// lost.
	Operation string
	// Deleting says the managed resource is being deleted. A Get of it
	// that finds no instance then looks for the pieces a Create cut short
	// may have left (a volume, a firewall rule, an address, a seed ISO),
	// by name and mark, and reports them as an instance (Stopped, Mark
	// the Ref's, Progress naming what remains), so that the
	// controller calls Delete, which removes them, until Get says
	// NotFound: a resource whose instance never appeared leaks nothing.
	Deleting bool
	// Live asks a driver that reads through a cache or a shared snapshot
	// to read the backend itself. It is set for an import (management
	// policies without Create: the instance was made by someone else and
	// is not in a cache of the driver's own instances) and for a resource
	// being deleted (a miss then ends the resource, so it must not come
	// from a cache that has not yet seen an instance created a moment
	// ago).
	Live bool
	// ProxyCA, when set, says the proxy listens with TLS (Settings.TLS):
	// the readiness probe speaks TLS and verifies the proxy's certificate
	// against this PEM certificate (Settings.TLS.CA).
	ProxyCA string
	// TenantGuest is Request.TenantGuest: the probe of the address the
	// guest reports goes through the tenant guard.
	TenantGuest bool
}

// Instance is what a driver reports about one backend instance.
type Instance struct {
	// ID is the backend's identifier, stable for the instance's life, for
	// example hosts/<host>/domains/<name> or vms/<vmid>/<name>.
	ID string
	// Name is the instance name.
	Name string
	// Mark read back from the instance; empty when the instance is unmarked.
	Mark Mark
	// State is the lifecycle state.
	State State
	// IP is the address clients connect to. Running requires it.
	IP string
	// Host, when set, is the name clients reach the proxy by instead of IP
	// (a PodProxy's ClusterIP Service's DNS name). It goes into the
	// connection Secret; IP stays the address in status.
	Host string
	// EgressIP is the address the proxy's traffic leaves from, when the
	// backend knows it: its own figure only where that is the egress
	// address (EgressSource Backend), or the egress check's answer from
	// inside the instance (EgressSource Reported, EgressCheckedAt).
	EgressIP string
	// EgressSource says where EgressIP comes from: EgressBackend or
	// EgressReported; empty when EgressIP is.
	EgressSource string
	// EgressCheckedAt is when a Reported EgressIP was seen, or when the
	// check of EgressFailure was made.
	EgressCheckedAt time.Time
	// BackendEgressIP is the backend's own figure of the egress address
	// (the EgressIP of EgressSource Backend), set wherever the backend
	// has one, also when a report from inside the instance replaces
	// EgressIP: the instance's word is compared with it, never taken
	// over it.
	BackendEgressIP string
	// EgressFailure says why the egress check from inside the instance
	// failed, in the provider's words (never the instance's), when its
	// latest report is of a check that failed; EgressIP is then left as
	// the backend has it.
	EgressFailure string
	// ProxyAddress is host:port where the provider itself reached the
	// proxy for its readiness probe; empty when it cannot reach it (a
	// remote cluster's pod, a firewall admitting only the clients). The
	// controller layer sends the egress check there.
	ProxyAddress string
	// Replicas are the serving replicas of an instance that has several
	// (a PodProxy's pods) and that the provider reaches each of: the
	// controller layer sends the egress check through every one. Empty
	// otherwise.
	Replicas []Replica
	// ServingReplicas is how many replicas serve when there are several
	// but the egress check sees one at a time (behind a load balancer, or
	// one pod's report): the addresses it finds may not be all of them.
	// Zero otherwise.
	ServingReplicas int
	// EgressIPs are every egress address when the replicas leave from
	// several, sorted, EgressIP the first; set by the controller layer's
	// egress check.
	EgressIPs []string
	// Placement actually used.
	Placement Placement
	// CreatedAt is read back from the backend (zero when unknown).
	CreatedAt time.Time
	// ProxyReachable is true once the proxy answered on its port.
	ProxyReachable bool
	// ReachableOnReport says ProxyReachable rests on the instance's report
	// of its egress check (its own Squid answered it), not on the
	// provider's probe: it stands only while the report does.
	ReachableOnReport bool
	// StartedAt is when the instance last started, zero when the backend
	// does not say. An update that changes a VM's settings restarts it, so
	// a report from inside older than this was made with the settings
	// before and is not read (ReportPredatesStart).
	StartedAt time.Time
	// Progress describes long-running work (an image download, a clone,
	// an operation), for the Ready condition's message.
	Progress string
	// SpecHash is the Hash of the Request the instance was last created or
	// updated from, as written on the instance; empty when the backend
	// cannot store it.
	SpecHash string
	// Operation names an asynchronous backend operation still in flight
	// (for example a Compute Engine operation) that Get should read next.
	Operation string
	// Details are extra, non-secret facts for status (backend specific).
	Details map[string]string
	// Leftovers, set by List only, says the entry is no instance but the
	// pieces of one that stand without it (what a Create cut short left,
	// or what a deletion that was bypassed left: a volume, a seed, a
	// firewall rule, an address, a Secret), and names them. Mark is
	// theirs; a Delete by the entry's ID, Name and Mark removes them. A
	// backend that can mark such pieces only in part (a name and a UID
	// prefix) lists them with an empty Mark and the prefix in
	// Details[DetailUIDPrefix]: they are reported, never deleted.
	Leftovers []string
}

// ReportStartSlack is how much earlier than the instance's last start
// (StartedAt) a report from inside may say it was made and still be of
// this start: its whole seconds and the guest's clock. A report of the
// settings before predates the stop too, which takes longer.
const ReportStartSlack = 5 * time.Second

// ReportPredatesStart reports whether a report from inside made at was
// made before the instance's last start.
func (i Instance) ReportPredatesStart(at time.Time) bool {
	return !i.StartedAt.IsZero() && at.Before(i.StartedAt.Add(-ReportStartSlack))
}

// Replica is one serving replica of an instance.
type Replica struct {
	// Name of the replica (a pod's).
	Name string
	// Node it runs on.
	Node string
	// ProxyAddress is host:port where the provider reaches it.
	ProxyAddress string
}

// DetailUIDPrefix is the Details key of a Leftovers entry with an empty
// Mark: the prefix of the UID its pieces were made for, as far as their
// names tell it (without dashes).
const DetailUIDPrefix = "uidPrefix"

// The values of Instance.EgressSource.
const (
	// EgressBackend: the backend's own figure (an instance's external
	// NAT address, a routed guest's own address).
	EgressBackend = "Backend"
	// EgressReported: the egress check run inside the instance, through
	// its own Squid, and reported back through the backend.
	EgressReported = "Reported"
)

// Driver is one backend. Every method is idempotent, takes ctx first,
// returns promptly when ctx is cancelled, and returns errors classified as
// *Error.
type Driver interface {
	// Create starts bringing up the instance and returns without waiting for
	// boots, downloads, clones or operations. Calling it again for the same
	// Request creates nothing new. An existing instance with the same name
	// and a different Mark is a Permanent error: it is never adopted.
	Create(ctx context.Context, req Request) (Instance, error)
	// Get reads one instance. A missing instance is NotFound; an instance
	// being deleted or a busy backend is never NotFound. The Mark reported
	// is the instance's own, whoever it belongs to: the controller refuses
	// to import another resource's instance by it.
	Get(ctx context.Context, ref Ref) (Instance, error)
	// Update changes in place what the backend can change, so that the
	// instance matches req. An instance that does not carry req.Mark is
	// Permanent and left as it is.
	Update(ctx context.Context, ref Ref, req Request) (Instance, error)
	// Delete removes the instance and everything created for it. Deleting
	// a missing instance succeeds. An instance (or any object of it) that
	// does not carry ref.Mark is never changed or removed: Delete refuses
	// it (Permanent), or succeeds leaving it alone when nothing of ref's
	// resource is there.
	Delete(ctx context.Context, ref Ref) error
	// List returns the instances carrying installationID's mark (ID, Name,
	// Mark and CreatedAt at least), and, as entries with Leftovers, the
	// pieces carrying that mark that stand without their instance (what
	// Get of a resource being deleted would report). Unmarked instances
	// are never listed.
	List(ctx context.Context, installationID string) ([]Instance, error)
	// Check probes every target of the backend (hosts, nodes, a project, an
	// API server) and reports their health.
	Check(ctx context.Context) Health
}

// Tidier is a driver with shared pieces of its own besides instances
// (KVM's base images), which the orphan sweep tidies after each List.
type Tidier interface {
	// Tidy removes the shared pieces no instance has used for as long as
	// the driver's configuration allows, and names what it removed. What
	// an instance, or a Create in flight, uses is never removed.
	Tidy(ctx context.Context) ([]string, error)
}

// Health is the result of Driver.Check.
type Health struct {
	Targets []TargetHealth
}

// Healthy is true when every target is healthy and there is at least one.
func (h Health) Healthy() bool {
	if len(h.Targets) == 0 {
		return false
	}
	for _, t := range h.Targets {
		if !t.Healthy {
			return false
		}
	}
	return true
}

// TargetHealth is the health of one backend target.
type TargetHealth struct {
	// Target names what was checked (a host, a node, a project).
	Target string
	// Address is where it was reached.
	Address string
	// Healthy is true when every check passed.
	Healthy bool
	// Reason is a CamelCase reason from the Reason* constants or a
	// backend-specific one; empty when healthy.
	Reason string
	// Message is a human-readable explanation without secrets.
	Message string
	// Details are facts found on the way (versions, free space).
	Details map[string]string
}

// Health reasons shared by every backend; drivers add their own.
const (
	ReasonTimeout                = "Timeout"
	ReasonUnreachable            = "Unreachable"
	ReasonUnauthorized           = "Unauthorized"
	ReasonForbidden              = "Forbidden"
	ReasonCredentialsUnavailable = "CredentialsUnavailable"
	ReasonAPIError               = "APIError"
	ReasonNotAvailable           = "BackendNotAvailable"
)

// RenderVersion is the version of what is rendered from a Request (Squid's
// configuration, cloud-init). It is part of Hash, so raising it makes every
// instance's stored hash differ and each is updated, once, by the provider
// version that raised it: running proxies pick up a rendering change
// without their resources being touched. Raise it when instances must.
//
//	2  Squid names itself after the resource (visible_hostname
//	   egress-proxy-<uid>), which the readiness probe reads
//	3  KVM and Proxmox guests deny their hypervisor's addresses; a VM
//	   guest's own addresses are a squid.conf include, refreshed before
//	   every Squid start (a systemd drop-in, GCP's startup script);
//	   private ranges are denied less what allowedDestinationCIDRs
//	   opens, so a name resolving to an opened and an unopened address
//	   is refused; local-use NAT64 (64:ff9b:1::/48) is never opened;
//	   list ACLs split to lines a Squid built on musl reads whole; a
//	   PodProxy denies its cluster's nodes
//
// The tests named TestRenderingIsPinned pin what each backend renders
// together with this version, and fail when the rendering changes.
const RenderVersion = 3

// Hash is the stable digest of the parts of a Request that an instance is
// built from, and of RenderVersion. Drivers store it on the instance (SpecHash) so the controller
// can tell whether an Update is needed without re-reading every setting.
// It is written where backend readers can see it, so secrets enter it only
// through SecretDigest (keyed by the controller), never in the clear.
func Hash(req Request) string { return HashAt(req, RenderVersion) }

// RenderedEarlier reports whether specHash, as stored on an instance, is
// the Hash of req at an earlier RenderVersion: the instance was made from
// the same request, and only the provider's rendering has changed since.
// A driver whose update costs more than rewriting files (a restart that
// gives up an address) may then apply it more gently.
func RenderedEarlier(specHash string, req Request) bool {
	for v := 1; v < RenderVersion; v++ {
		if specHash == HashAt(req, v) {
			return true
		}
	}
	return false
}

// HashAt is Hash as a provider that rendered at version gave it: what an
// instance that provider made stores.
func HashAt(req Request, version int) string {
	h := sha256.New()
	// nil and empty mean the same and must hash the same.
	for _, l := range []*[]string{&req.Proxy.AllowedClientCIDRs, &req.Proxy.AllowedDestinations, &req.Proxy.AllowedDestinationCIDRs} {
		if len(*l) == 0 {
			*l = nil
		}
	}
	if len(req.Proxy.AllowedPorts) == 0 {
		req.Proxy.AllowedPorts = nil
	}
	if len(req.Labels) == 0 {
		req.Labels = nil
	}
	req.Proxy.Auth.Password = ""
	if t := req.Proxy.TLS; t != nil {
		// The key enters through SecretDigest.
		req.Proxy.TLS = &TLS{Cert: t.Cert, CA: t.CA}
	}
	if c := req.Proxy.EgressCheck; c != nil {
		// The check's password enters through SecretDigest.
		req.Proxy.EgressCheck = &EgressCheck{URL: c.URL, Username: c.Username}
	}
	var ext any = noExtension
	if req.Extension != nil {
		ext = req.Extension.HashInput()
	}
	// Mark and Name are identity, not configuration; CloudInit is secret.
	b, _ := json.Marshal(hashInput{ //nolint:errchkjson // plain structs always marshal.
		Placement: req.Placement, Proxy: req.Proxy, Extension: ext, Labels: req.Labels, SecretDigest: req.SecretDigest,
	})
	if version > 1 {
		// Version 1 hashed the request alone; its hashes stay as they were
		// so that only a change of rendering updates instances.
		_, _ = fmt.Fprintf(h, "render %d\n", version)
	}
	_, _ = h.Write(b)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// hashInput is what Hash marshals: the fields of a Request in the order and
// under the names they had when Hash marshalled the Request itself (the
// extension then was a block named Exposure), so that moving the per-kind
// block out of the contract changed no digest: only RenderVersion does.
// TestHashIsStable pins it.
type hashInput struct {
	Name         string
	Mark         Mark
	Placement    Placement
	Proxy        Settings
	Extension    any `json:"Exposure"`
	CloudInit    string
	Labels       map[string]string
	SecretDigest string
}

// noExtension is what Hash digests for a Request without an Extension: the
// empty block of per-kind networking choices the contract once carried
// (see hashInput).
var noExtension = json.RawMessage(`{"AddressType":"","RetainAddress":false,"ManageFirewall":false,"ServiceType":""}`)
