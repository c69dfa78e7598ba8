package gcp_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
)

// echoedMetadata is a refusal as Compute Engine words it, quoting the
// metadata it refused: its items' values (cloud-init, the htpasswd, the
// TLS key) are in the message.
func echoedMetadata(field, value string) string {
	return fmt.Sprintf("Invalid value for field '%s': '{  \"item\": [{    \"key\": \"user-data\",    \"value\": %q  }]}'. Metadata has duplicate keys.", field, value)
}

// TestRefusalQuotingMetadataShowsNoSecret: an insert refused with a 400
// that quotes the instance's metadata, or an insert operation that fails
// quoting it, gives an error (a condition's message) without the
// secrets of the request, even where the value holds the quote and
// period that end it, still naming the field and GCP's reason; and no
// log line holds them either.
func TestRefusalQuotingMetadataShowsNoSecret(t *testing.T) {
	cases := map[string]struct {
		fail func(f *fixture, msg string)
		// afterSettle: the failure shows in Get once the operation ends.
		afterSettle bool
	}{
		"synchronous 400": {fail: func(f *fixture, msg string) {
			f.srv.FailNext("POST", "/instances", http.StatusBadRequest, "invalid", msg)
		}},
		"failed operation": {fail: func(f *fixture, msg string) {
			f.srv.FailNextOperation("instances", "insert", "INVALID_FIELD_VALUE", msg, http.StatusBadRequest)
		}, afterSettle: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			req, secrets := proxytest.WithSentinels(request("pt-echo", "0c8f6a1e-6666-4e2a-9c3f-00000000000a"))
			tc.fail(f, echoedMetadata("resource.metadata", req.CloudInit+"'. \n"+secrets["Proxy.Auth.Password"]))
			inst, err := f.driver.Create(context.Background(), req)
			if tc.afterSettle {
				if err != nil {
					t.Fatal(err)
				}
				f.srv.SettleAll()
				ref := proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: req.Placement, ID: inst.ID}
				_, err = observe(t, f.driver, &ref)
			}
			if err == nil {
				t.Fatal("the refused insert gave no error")
			}
			for label, s := range secrets {
				if s != "" && strings.Contains(err.Error(), s) {
					t.Errorf("the error holds %s: %v", label, err)
				}
			}
			if !strings.Contains(err.Error(), "resource.metadata") || !strings.Contains(err.Error(), "Metadata has duplicate keys.") {
				t.Errorf("the error does not name the refused field and GCP's reason: %v", err)
			}
			proxytest.CheckLogTiers(t, f.logs.String(), secrets, nil)
		})
	}
}
