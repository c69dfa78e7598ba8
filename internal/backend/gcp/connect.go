package gcp

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/auth"
	"cloud.google.com/go/auth/credentials"
	"cloud.google.com/go/auth/credentials/impersonate"
	"cloud.google.com/go/auth/httptransport"
	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Credentials say how to authenticate to Compute Engine.
type Credentials struct {
	// Key is a service-account key (JSON), read from the config's Secret
	// on every Connect. Secret: never logged, never in an error.
	Key []byte
	// Injected uses Application Default Credentials (workload identity,
	// a metadata server, GOOGLE_APPLICATION_CREDENTIALS) instead of Key.
	Injected bool
	// Impersonate, when set, is the email of the service account the
	// provider acts as: the key's (or the injected identity's) account
	// trades its token for one of this account's through the IAM Service
	// Account Credentials API (generateAccessToken), so it needs only
	// roles/iam.serviceAccountTokenCreator on it and no Compute role.
	Impersonate string
	// Delegates are the service accounts of a delegation chain from the
	// caller to Impersonate, in order; each must hold the token creator role
	// on the next.
	Delegates []string
	// Guard dials every request made with the key (its token_uri, the
	// impersonation and Compute Engine calls) when it is a tenant's (a
	// namespaced config's); the answers of the token endpoints are then not
	// quoted in errors. Nil for the platform's configs.
	Guard *netguard.Guard
}

// scope is the OAuth scope of every token the provider asks for.
const scope = "https://www.googleapis.com/auth/cloud-platform"

// ClientOptions turns credentials into client options. The default,
// ProductionClientOptions, authenticates; tests point the client at a
// fake with option.WithEndpoint and option.WithoutAuthentication.
type ClientOptions func(ctx context.Context, c Credentials) ([]option.ClientOption, error)

// ProductionClientOptions authenticates with the service-account key, or
// with Application Default Credentials, as itself or as the account it
// impersonates.
func ProductionClientOptions(ctx context.Context, c Credentials) ([]option.ClientOption, error) {
	if c.Guard != nil {
		return GuardedClientOptions(c, nil)
	}
	return AuthClientOptions(ctx, c, nil)
}

// GuardedClientOptions are a tenant's key's options: every request, to
// the key's token_uri (which Google's library uses as written), to the
// IAM Credentials API and to Compute Engine, dials through c.Guard from
// base (cloned; nil: http.DefaultTransport), so a key cannot aim the
// provider at its own network. Tests give base a fake's trust.
func GuardedClientOptions(c Credentials, base *http.Transport) ([]option.ClientOption, error) {
	if c.Injected || c.Guard == nil {
		return nil, proxy.Permanentf("a guarded client needs a service-account key and a guard")
	}
	if err := checkKey(c.Key); err != nil {
		return nil, err
	}
	tr := c.Guard.Transport(base)
	// Google's endpoints do not redirect: a key's token_uri that does is
	// not followed.
	hc := &http.Client{Transport: tr, CheckRedirect: c.Guard.NoRedirects}
	creds, err := credentials.NewCredentialsFromJSON(credentials.ServiceAccount, c.Key, &credentials.DetectOptions{Scopes: []string{scope}, Client: hc})
	if err != nil {
		return nil, proxy.Permanentf("the service-account key cannot be used")
	}
	if c.Impersonate != "" {
		ic, err := httptransport.NewClient(&httptransport.Options{Credentials: creds, BaseRoundTripper: tr})
		if err != nil {
			return nil, proxy.Permanentf("cannot build the impersonation client: %s", truncate(err.Error(), 200))
		}
		ic.CheckRedirect = c.Guard.NoRedirects
		if creds, err = impersonate.NewCredentials(&impersonate.CredentialsOptions{TargetPrincipal: c.Impersonate, Scopes: []string{scope}, Delegates: c.Delegates, Credentials: creds, Client: ic}); err != nil {
			return nil, proxy.Permanentf("cannot impersonate %s: %s", c.Impersonate, truncate(err.Error(), 200))
		}
	}
	client, err := httptransport.NewClient(&httptransport.Options{Credentials: creds, BaseRoundTripper: tr})
	if err != nil {
		return nil, proxy.Permanentf("cannot build the client: %s", truncate(err.Error(), 200))
	}
	client.CheckRedirect = c.Guard.NoRedirects
	return []option.ClientOption{option.WithHTTPClient(client)}, nil
}

// AuthClientOptions is ProductionClientOptions with the token requests
// (to the key's token_uri and to the IAM Service Account Credentials API)
// sent through transport; nil is http.DefaultTransport. Tests point it at
// gcptest's token endpoints.
func AuthClientOptions(_ context.Context, c Credentials, transport http.RoundTripper) ([]option.ClientOption, error) {
	if !c.Injected {
		if err := checkKey(c.Key); err != nil {
			return nil, err
		}
	}
	if c.Impersonate == "" {
		if c.Injected {
			return nil, nil
		}
		if transport != nil {
			base, err := credentials.NewCredentialsFromJSON(credentials.ServiceAccount, c.Key, &credentials.DetectOptions{Scopes: []string{scope}, Client: &http.Client{Transport: transport}})
			if err != nil {
				return nil, proxy.Permanentf("the service-account key cannot be used: %s", truncate(err.Error(), 200))
			}
			return []option.ClientOption{option.WithAuthCredentials(base)}, nil
		}
		return []option.ClientOption{option.WithAuthCredentialsJSON(option.ServiceAccount, c.Key)}, nil
	}
	do := &credentials.DetectOptions{Scopes: []string{scope}}
	if transport != nil {
		do.Client = &http.Client{Transport: transport}
	}
	// A key is read only as a service-account key (checkKey made sure it
	// is one): never as another credential type, which could name a
	// command or a URL to fetch a token from.
	var base *auth.Credentials
	var err error
	if c.Injected {
		base, err = credentials.DetectDefault(do)
	} else {
		base, err = credentials.NewCredentialsFromJSON(credentials.ServiceAccount, c.Key, do)
	}
	if err != nil {
		// Checked above, so this is about the environment (no ADC), not
		// the key's content.
		return nil, proxy.Transientf("cannot find the credentials to impersonate %s with: %s", c.Impersonate, truncate(err.Error(), 200))
	}
	io := &impersonate.CredentialsOptions{TargetPrincipal: c.Impersonate, Scopes: []string{scope}, Delegates: c.Delegates, Credentials: base}
	if transport != nil {
		// A client of its own must bring the base credentials itself.
		client, err := httptransport.NewClient(&httptransport.Options{Credentials: base, BaseRoundTripper: transport})
		if err != nil {
			return nil, proxy.Permanentf("cannot build the impersonation client: %s", truncate(err.Error(), 200))
		}
		io.Client = client
	}
	creds, err := impersonate.NewCredentials(io)
	if err != nil {
		return nil, proxy.Permanentf("cannot impersonate %s: %s", c.Impersonate, truncate(err.Error(), 200))
	}
	return []option.ClientOption{option.WithAuthCredentials(creds)}, nil
}

// checkKey validates a service-account key before the auth library sees
// it, with messages of its own: a parser's error could quote the key.
func checkKey(key []byte) error {
	var k struct {
		Type        string `json:"type"`
		ClientEmail string `json:"client_email"`
		PrivateKey  string `json:"private_key"`
	}
	if err := json.Unmarshal(key, &k); err != nil {
		return proxy.Permanentf("the service-account key is not JSON")
	}
	switch {
	case k.Type != "service_account":
		return proxy.Permanentf("the key is not a service-account key (its type is %q)", truncate(k.Type, 32))
	case k.ClientEmail == "" || k.PrivateKey == "":
		return proxy.Permanentf("the service-account key has no client_email or private_key")
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Connector builds drivers, pooling one client per project and credentials:
// the key is read on every Connect and pooled by its digest,
// so a rotated Secret takes effect at once. Clients no one uses any more
// (superseded by rotated credentials, or idle) are closed. The zero value
// is ready for production.
type Connector struct {
	// ClientOptions default to ProductionClientOptions.
	ClientOptions ClientOptions
	// Endpoint, when set, is passed to the client (option.WithEndpoint)
	// and reported by Check; a Config's own Endpoint overrides it.
	Endpoint string
	// Defaults are the driver options applied to every driver built (Probe, UserData,
	// FailedOperationHold, Log, Now); Provider, Config and API are set by
	// Driver.
	Defaults Options
	// IdleTimeout closes clients not used for this long; default 10
	// minutes.
	IdleTimeout time.Duration
	// ObserveMaxAge bounds the age of the shared listing steady instances
	// are observed from (batch.go); zero means batch.DefaultMaxAge.
	ObserveMaxAge time.Duration

	// prober is the readiness check of the drivers built, unless Defaults
	// has one: results are kept across Connects.
	prober squid.Prober

	mu    sync.Mutex
	conns map[string]*conn
}

// conn is one pooled client.
type conn struct {
	api      API
	pending  *pendingOps
	batch    *observeBatch
	provider string
	lastUsed time.Time
	// superseded: the provider's credentials changed; close once idle.
	superseded bool
}

// Driver returns a driver for the config named provider, on pooled
// clients.
func (c *Connector) Driver(ctx context.Context, provider string, cfg Config, creds Credentials) (*Driver, error) {
	opts := c.ClientOptions
	if opts == nil {
		opts = ProductionClientOptions
	}
	endpoint := c.Endpoint
	if cfg.Endpoint != "" {
		endpoint = cfg.Endpoint
	}
	// The endpoint is part of the key: clients built for one endpoint
	// never serve a config that names another.
	key := poolKey(cfg.Project, endpoint, creds)
	now := time.Now()

	c.mu.Lock()
	defer c.mu.Unlock()
	if c.conns == nil {
		c.conns = map[string]*conn{}
	}
	cn, ok := c.conns[key]
	if !ok {
		co, err := opts(ctx, creds)
		if err != nil {
			return nil, proxy.WithContext(err, provider, "connect")
		}
		if endpoint != "" {
			co = append(co, option.WithEndpoint(endpoint))
		}
		api, err := NewSDK(ctx, cfg.Project, co...)
		if err != nil {
			// The auth library's message on a bad key names the problem,
			// not the key.
			return nil, proxy.WithContext(proxy.Classify(proxy.ClassPermanent, err), provider, "connect")
		}
		cn = &conn{api: api, pending: &pendingOps{}, batch: newObserveBatch(c.ObserveMaxAge), provider: provider}
		c.conns[key] = cn
		for k, other := range c.conns {
			if k != key && other.provider == provider {
				other.superseded = true
			}
		}
	}
	cn.lastUsed = now
	c.sweep(now)

	o := c.Defaults
	o.Provider, o.Config, o.API, o.pending, o.batch = provider, cfg, cn.api, cn.pending, cn.batch
	o.quiet, o.guard = creds.Guard != nil, creds.Guard
	if o.Prober == nil {
		o.Prober = &c.prober
	}
	if endpoint != "" && o.Endpoint == "" {
		o.Endpoint = endpoint
	}
	return New(o), nil
}

// sweep closes clients that are superseded and past one call budget (no
// call can still be running on them), or idle. Called with mu held.
func (c *Connector) sweep(now time.Time) {
	idle := c.IdleTimeout
	if idle <= 0 {
		idle = 10 * time.Minute
	}
	for k, cn := range c.conns {
		quiet := now.Sub(cn.lastUsed)
		if (cn.superseded && quiet > 2*DefaultCallTimeout) || quiet > idle {
			_ = cn.api.Close()
			delete(c.conns, k)
		}
	}
}

// Open returns how many client sets are pooled (for tests and metrics).
func (c *Connector) Open() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.conns)
}

// Close closes every pooled client.
func (c *Connector) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, cn := range c.conns {
		_ = cn.api.Close()
		delete(c.conns, k)
	}
	return nil
}

// poolKey is a digest of what the clients are built from; the key itself
// only enters through the hash.
func poolKey(project, endpoint string, c Credentials) string {
	h := sha256.New()
	for _, p := range [][]byte{[]byte(project), []byte(endpoint), {boolByte(c.Injected)}, c.Key, []byte(c.Impersonate), []byte(strings.Join(c.Delegates, ",")), fmt.Appendf(nil, "%p", c.Guard)} {
		_, _ = h.Write(p)
		_, _ = h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))
}

func boolByte(b bool) byte {
	if b {
		return 1
	}
	return 0
}
