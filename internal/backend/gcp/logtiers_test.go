package gcp_test

import (
	"context"
	"encoding/json"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// TestLogTiers: a create, its Get once running and a List, logged at
// the highest verbosity with the driver's and the reconcile's logger (the
// client transport's lines are the reconcile's), authenticated with a real
// service-account key through the real auth libraries against the fake's
// token endpoint: every tier has its lines (V(1) the calls, V(2) the
// resolved create, the curated insert request, the addresses and the
// names listed, V(3) the wire), and neither the password, the cloud-init,
// the htpasswd, the key nor the access token is in any line.
func TestLogTiers(t *testing.T) {
	const caller = "provider@" + testProject + ".iam.gserviceaccount.com"
	srv := gcptest.New(t, testProject)
	srv.RequireAuth()
	key := srv.ServiceAccountKey(caller)
	u, _ := url.Parse(srv.URL)
	var logs testenv.Buffer
	log := funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 10})
	conn := &gcp.Connector{Endpoint: srv.URL, ClientOptions: func(ctx context.Context, c gcp.Credentials) ([]option.ClientOption, error) {
		return gcp.AuthClientOptions(ctx, c, &toFake{fake: u})
	}, Defaults: gcp.Options{Log: &log, Prober: &squid.Prober{Ask: srv.AskSquid, Wait: time.Minute, PositiveTTL: time.Nanosecond, NegativeTTL: time.Nanosecond}}}
	t.Cleanup(func() { _ = conn.Close() })
	ctx := logr.NewContext(context.Background(), log)
	d, err := conn.Driver(ctx, testProvider, testConfig(), gcp.Credentials{Key: key})
	if err != nil {
		t.Fatal(err)
	}

	req, secrets := proxytest.WithSentinels(request("pt-tiers", "0c8f6a1e-7777-4e2a-9c3f-00000000000a"))
	inst, err := d.Create(ctx, req)
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	srv.SettleAll()
	got, err := d.Get(ctx, refOf(inst, req))
	if err != nil || got.State != proxy.StateRunning {
		t.Fatalf("Get = %+v, %v; want Running", got, err)
	}
	if _, err := d.List(ctx, testInstallation); err != nil {
		t.Fatalf("List: %v", err)
	}

	var k struct {
		PrivateKey   string `json:"private_key"`
		PrivateKeyID string `json:"private_key_id"`
	}
	if err := json.Unmarshal(key, &k); err != nil {
		t.Fatal(err)
	}
	secrets["private_key_id"] = k.PrivateKeyID
	for i, line := range strings.Split(k.PrivateKey, "\n") {
		if len(line) > 40 {
			secrets["private_key line "+strconv.Itoa(i)] = line
		}
	}
	token := strings.TrimPrefix(srv.LastAuthorization(), "Bearer ")
	if token == "" {
		t.Fatal("the fake saw no access token: the calls were not authenticated")
	}
	secrets["access token"] = token
	proxytest.CheckLogTiers(t, logs.String(), secrets, map[int][]string{
		telemetry.VCalls:  {"gcp api call"},
		telemetry.VDetail: {"gcp create", "gcp insert request", "gcp addresses found", "gcp instances listed: names"},
		telemetry.VWire:   {"gcp wire request", "gcp wire response"},
	})
	for _, w := range []string{`"user-data"="`, `"machineType"="zones/` + testZone + `/machineTypes/`, `\"key\":\"user-data\",\"value\":\"[redacted]\"`} {
		if !strings.Contains(logs.String(), w) {
			t.Errorf("the log lacks %s", w)
		}
	}
	if t.Failed() {
		t.Logf("log:\n%s", logs.String())
	}
}
