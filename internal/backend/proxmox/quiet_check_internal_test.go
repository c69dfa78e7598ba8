package proxmox

import (
	"context"
	"encoding/pem"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
)

// TestTenantCheckDoesNotQuoteTheAPI: a tenant's "Proxmox" answers every
// field the health check reads with a sentinel (versions, kernel, the
// node a template is on, a node's state, a storage's content), in its
// headers, and in the message of an error. The health of a namespaced
// config (a guarded driver) holds none of it: versions as their numbers,
// states and contents not quoted; a platform config's driver shows them.
func TestTenantCheckDoesNotQuoteTheAPI(t *testing.T) {
	const sentinel = "SENTINEL-4b2e"
	for _, round := range []struct {
		name string
		// answers maps a path below /api2/json to the data it answers.
		answers map[string]string
	}{
		{"node state", map[string]string{
			"/version":           `{"version":"8.2.4-` + sentinel + `","release":"` + sentinel + `"}`,
			"/cluster/resources": `[{"type":"node","node":"pve1","status":"` + sentinel + `"},{"type":"qemu","vmid":9000,"node":"` + sentinel + `","template":1}]`,
		}},
		{"storage content", map[string]string{
			"/version":                         `{"version":"` + sentinel + `"}`,
			"/cluster/resources":               `[{"type":"node","node":"pve1","status":"online"},{"type":"qemu","vmid":9000,"node":"` + sentinel + `","template":1}]`,
			"/nodes/pve1/status":               `{"pveversion":"pve-manager/8.2.4/` + sentinel + `","current-kernel":{"release":"6.8.12-4-` + sentinel + `"}}`,
			"/nodes/pve1/storage/local/status": `{"active":1,"enabled":1,"content":"` + sentinel + `","avail":1073741824}`,
		}},
		{"error message", map[string]string{
			"/version":           `{"version":"8.2.4"}`,
			"/cluster/resources": `[{"type":"node","node":"pve1","status":"online"}]`,
		}},
	} {
		t.Run(round.name, func(t *testing.T) {
			srv := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("X-"+sentinel, sentinel)
				w.Header().Set("Content-Type", "application/json")
				if data, ok := round.answers[strings.TrimPrefix(r.URL.Path, "/api2/json")]; ok {
					_, _ = fmt.Fprintf(w, `{"data":%s}`, data)
					return
				}
				w.WriteHeader(http.StatusInternalServerError)
				_, _ = fmt.Fprintf(w, `{"data":null,"message":"%s fails","errors":{"node":"%s"}}`, sentinel, sentinel)
			}))
			defer srv.Close()
			ca := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw})
			driver := func(guard *netguard.Guard) *Driver {
				d, err := New(Options{
					Provider: "ProviderConfig team-a/pve",
					Config: Config{URL: srv.URL, Guard: guard, Nodes: []string{"pve1"}, ISOStorage: "local",
						Templates: map[string]int{"debian-12": 9000}},
					Credentials: func(context.Context) (Credentials, error) {
						return Credentials{Token: "root@pam!t=00000000-0000-0000-0000-000000000000", CA: ca}, nil
					},
				})
				if err != nil {
					t.Fatal(err)
				}
				return d
			}
			allowed := netguard.New(netguard.Options{Allowed: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")}})
			h := driver(allowed).Check(context.Background())
			got := fmt.Sprintf("%+v", h.Targets)
			t.Logf("tenant's API: %s", got)
			if h.Healthy() || strings.Contains(got, sentinel) {
				t.Errorf("the health of a tenant's API = %s; want unhealthy, quoting nothing it answered", got)
			}
			if v, ok := h.Targets[0].Details["pveVersion"]; ok && strings.Trim(v, "0123456789.") != "" {
				t.Errorf("pveVersion = %q; want only numbers", v)
			}
			if p := fmt.Sprintf("%+v", driver(nil).Check(context.Background()).Targets); !strings.Contains(p, sentinel) {
				t.Errorf("the health of a platform config's API = %s; want what it answered", p)
			}
		})
	}
}
