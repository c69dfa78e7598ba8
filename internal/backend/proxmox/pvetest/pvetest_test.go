package pvetest

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestEmbeddedSchemaIsThePublishedOne: the schema the fake checks against
// is the published pve-apidoc.json, byte for byte (and, when the shared
// data folder is next to the repository, the same file as there).
func TestEmbeddedSchemaIsThePublishedOne(t *testing.T) {
	b, err := APIDoc()
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if got := hex.EncodeToString(sum[:]); got != APIDocSHA256 {
		t.Errorf("embedded schema SHA-256 %s; want %s", got, APIDocSHA256)
	}
	shared := filepath.Join("..", "..", "..", "..", "..", "shared", "data", "proxmox", "pve-apidoc.json")
	if orig, err := os.ReadFile(shared); err == nil {
		s := sha256.Sum256(orig)
		if hex.EncodeToString(s[:]) != APIDocSHA256 {
			t.Errorf("%s differs from the embedded copy: refresh pve-apidoc.json.gz and APIDocSHA256", shared)
		}
	}
	s, err := LoadSchema()
	if err != nil {
		t.Fatal(err)
	}
	if n := len(s.Methods()); n < 500 {
		t.Errorf("the schema has %d methods; want the whole API", n)
	}
}

// call sends a raw request to the fake with the right token.
func call(t *testing.T, s *Server, method, path string, form url.Values) (*http.Response, map[string]any) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(s.CAPEM())
	c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}}
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequest(method, s.URL+"/api2/json"+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	req.Header.Set("Authorization", "PVEAPIToken="+s.Token())
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var env map[string]any
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &env)
	return resp, env
}

// TestUnknownEndpointOrParameterIsAViolation: what the published schema
// does not have is refused the way the API server refuses it, and
// recorded, so that the test that sent it fails.
func TestUnknownEndpointOrParameterIsAViolation(t *testing.T) {
	cases := []struct {
		name, method, path string
		form               url.Values
		status             int
		violation          string
	}{
		{"unknown path", "GET", "/nodes/pve1/qemu/9000/nonsense", nil, 501, "no such path"},
		{"unknown method", "DELETE", "/cluster/resources", nil, 501, "has no DELETE"},
		{"unknown parameter", "PUT", "/nodes/pve1/qemu/9000/config", url.Values{"bogus": {"1"}}, 400, "parameter bogus"},
		{"unknown query parameter", "GET", "/cluster/resources?kind=vm", nil, 400, "parameter kind"},
		{"value outside the enum", "GET", "/cluster/resources?type=vms", nil, 400, "enumeration"},
		{"missing required parameter", "POST", "/nodes/pve1/qemu/9000/clone", url.Values{"name": {"x"}}, 400, "parameter newid"},
		{"integer out of range", "POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {"99"}}, 400, "minimum"},
		{"pattern", "PUT", "/nodes/pve1/qemu/9000/resize", url.Values{"disk": {"scsi0"}, "size": {"ten"}}, 400, "regex"},
		{"property string key", "PUT", "/nodes/pve1/qemu/9000/config", url.Values{"net0": {"virtio,bridge=vmbr0,speed=10"}}, 400, "speed"},
		{"format", "PUT", "/nodes/pve1/qemu/9000/config", url.Values{"tags": {"Not A Tag!"}}, 400, "pve-tag-list"},
		{"boolean", "POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {"100"}, "full": {"maybe"}}, 400, "boolean"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s, err := Start(Options{})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			resp, _ := call(t, s, c.method, c.path, c.form)
			if resp.StatusCode != c.status {
				t.Errorf("status %s; want %d", resp.Status, c.status)
			}
			v := s.Violations()
			if len(v) != 1 || !strings.Contains(v[0], c.violation) {
				t.Errorf("violations %q; want one about %q", v, c.violation)
			}
		})
	}
}

// TestAnswersAreCheckedAgainstTheSchema: the checker of the fake's own
// answers refuses what the schema's return shape does not allow.
func TestAnswersAreCheckedAgainstTheSchema(t *testing.T) {
	s, err := LoadSchema()
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := s.Lookup("GET", "/cluster/resources")
	if err != nil {
		t.Fatal(err)
	}
	good := []any{map[string]any{"id": "qemu/100", "type": "qemu", "vmid": float64(100), "template": float64(0)}}
	if v := m.ValidateReturn(good); len(v) != 0 {
		t.Errorf("a good answer: %v", v)
	}
	for name, bad := range map[string]any{
		"unknown property": []any{map[string]any{"id": "qemu/100", "type": "qemu", "shared": float64(1)}},
		"missing id":       []any{map[string]any{"type": "qemu"}},
		"wrong type":       []any{map[string]any{"id": "qemu/100", "type": "qemu", "vmid": "100"}},
		"outside enum":     []any{map[string]any{"id": "x", "type": "vm"}},
		"not an array":     map[string]any{},
	} {
		if v := m.ValidateReturn(bad); len(v) == 0 {
			t.Errorf("%s: accepted", name)
		}
	}
}

// TestErrorsCarryTheRealTexts: the reason phrase holds the API's text, and
// the body is {"data":null}, as pveproxy answers.
func TestErrorsCarryTheRealTexts(t *testing.T) {
	s := New(t, Options{})
	resp, env := call(t, s, "GET", "/nodes/pve1/qemu/12345/config", nil)
	if resp.Status != "500 Configuration file 'nodes/pve1/qemu-server/12345.conf' does not exist" {
		t.Errorf("status line %q", resp.Status)
	}
	if d, ok := env["data"]; !ok || d != nil {
		t.Errorf("body %v; want {\"data\":null}", env)
	}
	resp, _ = call(t, s, "GET", "/nodes/pve3/status", nil)
	if resp.StatusCode != 595 {
		t.Errorf("an offline node's endpoint: %s; want 595", resp.Status)
	}
	resp, env = call(t, s, "POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {"100200"}})
	upid, _ := env["data"].(string)
	if resp.StatusCode != 200 || !strings.HasPrefix(upid, "UPID:pve1:") || !strings.Contains(upid, ":qmclone:9000:egress@pve!provider:") {
		t.Errorf("clone: %s %q; want a UPID", resp.Status, upid)
	}
	// The clone reserved its VMID: a second one there is refused.
	resp, _ = call(t, s, "POST", "/nodes/pve1/qemu/9000/clone", url.Values{"newid": {"100200"}})
	if resp.Status != "500 unable to create VM 100200: config file already exists" {
		t.Errorf("second clone to the same VMID: %q", resp.Status)
	}
	_, env = call(t, s, "GET", "/cluster/resources?type=vm", nil)
	var entry map[string]any
	data, _ := env["data"].([]any)
	for _, e := range data {
		if m, _ := e.(map[string]any); m["vmid"] == float64(100200) {
			entry = m
		}
	}
	if entry == nil || entry["lock"] != "clone" || entry["name"] != nil {
		t.Errorf("the clone's entry %v; want nameless and locked", entry)
	}
	resp, _ = call(t, s, "PUT", "/nodes/pve1/qemu/100200/config", url.Values{"cores": {"2"}})
	if resp.Status != "500 VM is locked (clone)" {
		t.Errorf("config of a cloning VM: %q", resp.Status)
	}
}
