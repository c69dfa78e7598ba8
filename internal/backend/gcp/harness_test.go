package gcp_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"google.golang.org/api/option"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const (
	testProject      = "egressproxy-test"
	testProvider     = "ClusterProviderConfig gcp-test"
	testInstallation = "proxytest-installation"
	testZone         = "europe-west1-b"
	testRegion       = "europe-west1"
)

// testConfig is the gcp block every test uses.
func testConfig() gcp.Config {
	return gcp.Config{
		Project:      testProject,
		Network:      "default",
		NetworkTags:  []string{"egress-proxy"},
		Images:       map[string]string{"ubuntu-2404": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2404-lts-amd64"},
		MachineTypes: map[string]string{"small": "e2-small"},
		Zones:        []string{testZone},
	}
}

// fixture is the real driver on its real client, pointed at the fake.
type fixture struct {
	srv    *gcptest.Server
	driver *gcp.Driver
	logs   *testenv.Buffer
	// opts built driver; newDriver builds another (a restarted provider).
	opts gcp.Options
}

// newDriver is a new driver on the same fake and options, with no memory
// of the last one's: a provider restarted.
func (f *fixture) newDriver() *gcp.Driver { return gcp.New(f.opts) }

// testLogger logs everything up to V(5), the client transport's request
// lines included, into logs.
func testLogger(logs *testenv.Buffer) logr.Logger {
	return funcr.New(func(prefix, args string) { logs.Line(prefix + " " + args) }, funcr.Options{Verbosity: 5})
}

func newSDK(t *testing.T, srv *gcptest.Server) gcp.API {
	t.Helper()
	api, err := gcp.NewSDK(context.Background(), srv.Project, option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Close() })
	return api
}

func newFixture(t *testing.T, mutate ...func(*gcp.Options)) *fixture {
	t.Helper()
	f := &fixture{srv: gcptest.New(t, testProject), logs: &testenv.Buffer{}}
	log := testLogger(f.logs)
	o := gcp.Options{
		Provider: testProvider,
		Config:   testConfig(),
		API:      newSDK(t, f.srv),
		// The fake's Squid answers as the squid.conf in the instance's
		// metadata; results are kept for no time, so every Get sees it as
		// it is.
		Prober: &squid.Prober{Ask: f.srv.AskSquid, Wait: time.Minute, PositiveTTL: time.Nanosecond, NegativeTTL: time.Nanosecond},
		Log:    &log,
	}
	for _, m := range mutate {
		m(&o)
	}
	f.opts = o
	f.driver = gcp.New(o)
	return f
}

// request is a valid request: an ephemeral address and no firewall rule
// unless a test asks.
func request(name, uid string) proxy.Request {
	return proxy.Request{
		Name:      name,
		Mark:      proxy.Mark{UID: uid, InstallationID: testInstallation},
		Placement: proxy.Placement{Location: testZone, MachineType: "small", Image: "ubuntu-2404"},
		Proxy: proxy.Settings{
			Port:               3128,
			AllowedClientCIDRs: []string{"10.0.0.0/8"},
			AllowedPorts:       []int32{443},
		},
		Extension: gcp.Exposure{AddressType: gcp.AddressEphemeral},
	}
}

// noAuth is the test ClientOptions: the key is accepted unread and the
// clients go to the fake without authentication.
func noAuth(context.Context, gcp.Credentials) ([]option.ClientOption, error) {
	return []option.ClientOption{option.WithoutAuthentication()}, nil
}
