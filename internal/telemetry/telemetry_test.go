package telemetry

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// OpenTelemetry's Go modules are released together; mixed versions are
// how a module ends up with an API its SDK does not implement.
func TestOpenTelemetryModulesOnOneVersion(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	// The stable line: go.opentelemetry.io/otel and its sub-modules
	// (contrib, proto and auto have versions of their own).
	re := regexp.MustCompile(`(?m)^\s*(go\.opentelemetry\.io/otel(?:/[^\s]+)?) (v[^\s]+)`)
	versions := map[string][]string{}
	for _, m := range re.FindAllStringSubmatch(string(b), -1) {
		if strings.HasPrefix(m[1], "go.opentelemetry.io/otel/schema") {
			continue // a v0 module
		}
		versions[m[2]] = append(versions[m[2]], m[1])
	}
	if len(versions) != 1 {
		t.Errorf("go.opentelemetry.io/otel modules are at %d versions: %v", len(versions), versions)
	}
}

func TestErrorClass(t *testing.T) {
	for err, want := range map[error]string{
		nil:                                   "none",
		proxy.NotFoundf("gone"):               "not_found",
		proxy.Transientf("busy"):              "transient",
		proxy.Permanentf("denied"):            "permanent",
		proxy.Quotaf("full"):                  "quota",
		errors.New("unclassified"):            "transient",
		fmt.Errorf("w: %w", proxy.Quotaf("")): "quota",
	} {
		if got := ErrorClass(err); got != want {
			t.Errorf("ErrorClass(%v) = %q; want %q", err, got, want)
		}
	}
}

func TestServerAttributes(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.5:22":            "[server.address=10.0.0.5 server.port=22]",
		"[2001:db8::1]:8006":     "[server.address=2001:db8::1 server.port=8006]",
		"compute.googleapis.com": "[server.address=compute.googleapis.com]",
	} {
		var got []string
		for _, a := range ServerAttributes(in) {
			got = append(got, string(a.Key)+"="+a.Value.String())
		}
		if fmt.Sprint(got) != want {
			t.Errorf("ServerAttributes(%q) = %v; want %s", in, got, want)
		}
	}
}

func TestForgetConfig(t *testing.T) {
	ConfigTargetHealthy.Reset()
	ConfigTargetHealthy.WithLabelValues("ClusterProviderConfig", "", "home", "kvm", "beelink").Set(1)
	ConfigTargetHealthy.WithLabelValues("ClusterProviderConfig", "", "home", "kvm", "nuc").Set(0)
	ConfigTargetHealthy.WithLabelValues("ProviderConfig", "team-a", "home", "kvm", "beelink").Set(1)
	ForgetConfig("ClusterProviderConfig", "", "home", []string{"nuc"})
	if n := testutil.CollectAndCount(ConfigTargetHealthy); n != 2 {
		t.Errorf("%d series after forgetting one target; want 2", n)
	}
	ForgetConfig("ClusterProviderConfig", "", "home", nil)
	if n := testutil.CollectAndCount(ConfigTargetHealthy); n != 1 {
		t.Errorf("%d series after forgetting the config; want 1 (the namespaced config of the same name)", n)
	}
}
