package gcptest

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"
)

func TestDiscoveryCatchesWhatTheAPIDoesNotHave(t *testing.T) {
	d, err := LoadDiscovery()
	if err != nil {
		t.Fatal(err)
	}
	inst := func(extra map[string]any) map[string]any {
		b := map[string]any{"name": "p", "machineType": "zones/z/machineTypes/e2-small", "labels": map[string]any{"egressproxy-uid": "u"}}
		for k, v := range extra {
			b[k] = v
		}
		return b
	}
	cases := map[string]struct {
		method, path string
		query        url.Values
		body         map[string]any
		want         string // "" for no violation
	}{
		"AGoodInsert":           {"POST", "projects/p/zones/z/instances", url.Values{"requestId": {"r"}, "$alt": {"json;enum-encoding=int"}}, inst(nil), ""},
		"AGoodGet":              {"GET", "projects/p/zones/z/instances/i", nil, nil, ""},
		"AGoodLabelFilter":      {"GET", "projects/p/aggregated/instances", url.Values{"filter": {"labels.a=b"}, "returnPartialSuccess": {"true"}}, nil, ""},
		"NoSuchPath":            {"GET", "projects/p/zones/z/proxies/i", nil, nil, "no such method"},
		"NoSuchVerb":            {"PATCH", "projects/p/zones/z/instances/i", nil, nil, "no such method"},
		"UnknownQueryParameter": {"GET", "projects/p/zones/z/instances/i", url.Values{"verbose": {"1"}}, nil, "query parameter verbose does not exist"},
		"BooleanQueryNotBool":   {"GET", "projects/p/aggregated/instances", url.Values{"returnPartialSuccess": {"yes"}}, nil, "is not a boolean"},
		"UnknownBodyField":      {"POST", "projects/p/zones/z/instances", nil, inst(map[string]any{"squid": true}), "field squid does not exist"},
		"NestedUnknownField":    {"POST", "projects/p/zones/z/instances", nil, inst(map[string]any{"scheduling": map[string]any{"preemptable": true}}), "scheduling: field preemptable does not exist"},
		"WrongType":             {"POST", "projects/p/zones/z/instances", nil, inst(map[string]any{"canIpForward": "yes"}), "want a boolean"},
		"Int64AsNumber":         {"POST", "projects/p/zones/z/instances", nil, inst(map[string]any{"id": float64(7)}), "want a string"},
		"BadEnum":               {"POST", "projects/p/regions/r/addresses", nil, map[string]any{"name": "a", "addressType": "PUBLIC"}, `"PUBLIC" is not one of`},
		"MissingBody":           {"POST", "projects/p/zones/z/instances", nil, nil, "needs a Instance body"},
		"BodyWhereNone":         {"DELETE", "projects/p/zones/z/instances/i", nil, map[string]any{"force": true}, "takes no body"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, v := d.CheckRequest(tc.method, tc.path, tc.query, tc.body)
			got := strings.Join(v, "; ")
			if tc.want == "" && got != "" {
				t.Errorf("violations %q, want none", got)
			}
			if tc.want != "" && !strings.Contains(got, tc.want) {
				t.Errorf("violations %q, want one containing %q", got, tc.want)
			}
		})
	}

	m, _ := d.CheckRequest("GET", "projects/p/zones/z/instances/i", nil, nil)
	if v := d.CheckResponse(m, map[string]any{"name": "i", "status": "RUNNING", "mood": "happy"}); len(v) != 1 || !strings.Contains(v[0], "field mood does not exist") {
		t.Errorf("an answer with a field the API does not have: violations %q, want one naming mood", v)
	}
	if v := d.CheckResponse(m, map[string]any{"name": "i", "status": "EXPLODED"}); len(v) != 1 {
		t.Errorf("an answer with a status outside the enum: violations %q, want one", v)
	}
}

// The fake checks what it is sent: a request the API would not accept is
// a violation a test using the fake fails on.
func TestFakeRecordsViolations(t *testing.T) {
	var c cleanups // not t: the violation is expected
	defer c.run()
	s := New(&c, "p")
	resp, err := http.Post(s.URL+"/compute/v1/projects/p/zones/z/instances", "application/json", bytes.NewBufferString(`{"name":"p","squid":true}`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if v := s.Violations(); len(v) == 0 || !strings.Contains(strings.Join(v, "; "), "field squid does not exist") {
		t.Errorf("violations %q, want the unknown field squid", v)
	}
}

// cleanups stands in for a testing.T that only runs cleanups.
type cleanups []func()

func (c *cleanups) Cleanup(f func()) { *c = append(*c, f) }

func (c *cleanups) run() {
	for i := len(*c) - 1; i >= 0; i-- {
		(*c)[i]()
	}
}

// The fake answers as Google's APIs do: JSON indented unless the request
// says prettyPrint=false, the same value either way.
func TestFakeIndentsUnlessAskedNotTo(t *testing.T) {
	s := New(t, "p")
	get := func(query string) (string, any) {
		resp, err := http.Get(s.URL + "/compute/v1/projects/p/zones/z/instances/none" + query)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatalf("%s: %v", b, err)
		}
		return string(b), v
	}
	pretty, pv := get("")
	compact, cv := get("?prettyPrint=false")
	if !strings.Contains(pretty, "\n  ") {
		t.Errorf("answer without prettyPrint=false is not indented: %s", pretty)
	}
	if strings.Contains(strings.TrimSpace(compact), "\n") {
		t.Errorf("answer with prettyPrint=false is indented: %s", compact)
	}
	if !reflect.DeepEqual(pv, cv) {
		t.Errorf("the two answers differ: %v and %v", pv, cv)
	}
}
