package gcp_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"cloud.google.com/go/compute/apiv1/computepb"
	"google.golang.org/api/googleapi"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/gcptest"
)

// recorded holds the bodies of the real exchanges in testdata/recorded,
// by kind (compute#instance, compute#operation, ...; "error" for error
// bodies).
type recorded map[string][]map[string]any

func loadRecorded(t *testing.T) recorded {
	t.Helper()
	r := recorded{}
	add := func(body string) {
		if body == "" || !strings.HasPrefix(body, "{") {
			return
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("recorded body does not parse: %v", err)
		}
		kind, _ := m["kind"].(string)
		if _, ok := m["error"].(map[string]any); ok && kind == "" {
			kind = "error"
		}
		r[kind] = append(r[kind], m)
	}
	logs, _ := filepath.Glob(filepath.Join("testdata", "recorded", "*.http.log"))
	if len(logs) != 3 {
		t.Fatalf("want the 3 recorded .http.log files in testdata/recorded, found %v", logs)
	}
	for _, f := range logs {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		ex := gcptest.ParseHTTPLog(string(b))
		if len(ex) == 0 {
			t.Fatalf("%s: no exchanges parsed", f)
		}
		for _, e := range ex {
			add(e.ResponseBody)
		}
	}
	for _, f := range []string{"operation-error-global-400.json", "operation-error-zone-409.json"} {
		b, err := os.ReadFile(filepath.Join("testdata", "recorded", f))
		if err != nil {
			t.Fatal(err)
		}
		add(string(b))
	}
	b, err := os.ReadFile(filepath.Join("testdata", "recorded", "compute-instances-aggregatedlist.c7n-flight.json"))
	if err != nil {
		t.Fatal(err)
	}
	var flight struct {
		Body json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(b, &flight); err != nil {
		t.Fatal(err)
	}
	add(string(flight.Body))
	return r
}

// TestRecordedExchangesDecodeWithTheSDK decodes the real bodies with the
// SDK's types, as its REST clients do, and checks the fields the driver
// reads come through.
func TestRecordedExchangesDecodeWithTheSDK(t *testing.T) {
	r := loadRecorded(t)
	lenient := protojson.UnmarshalOptions{DiscardUnknown: true}
	decode := func(m map[string]any, into proto.Message) {
		t.Helper()
		b, _ := json.Marshal(denormalize(m))
		if err := lenient.Unmarshal(b, into); err != nil {
			t.Fatalf("%T: %v", into, err)
		}
	}
	var running *computepb.Instance
	for _, m := range r["compute#instance"] {
		inst := &computepb.Instance{}
		decode(m, inst)
		if inst.GetStatus() == "RUNNING" {
			running = inst
		}
	}
	if running == nil || running.GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP() != "34.169.196.191" ||
		running.GetLabels()["label-one"] == "" || running.GetCreationTimestamp() == "" {
		t.Errorf("recorded RUNNING instance: natIP, labels or creationTimestamp lost: %v", running)
	}
	var failed []*computepb.Operation
	for _, m := range r["compute#operation"] {
		op := &computepb.Operation{}
		decode(m, op)
		if op.GetError() != nil {
			failed = append(failed, op)
		}
	}
	if len(failed) != 2 || failed[0].GetError().GetErrors()[0].GetCode() != "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" ||
		failed[0].GetHttpErrorStatusCode() != 400 || failed[1].GetHttpErrorStatusCode() != 409 || failed[1].GetStatus() != computepb.Operation_DONE {
		t.Errorf("recorded failed operations: %v", failed)
	}
	for _, m := range r["compute#address"] {
		a := &computepb.Address{}
		decode(m, a)
		if a.GetAddress() != "8.8.8.8" || (a.GetStatus() != "RESERVED" && a.GetStatus() != "IN_USE") {
			t.Errorf("recorded address: %v", a)
		}
	}
	agg := &computepb.InstanceAggregatedList{}
	decode(r["compute#instanceAggregatedList"][0], agg)
	if w := agg.GetItems()["zones/us-central1-b"].GetWarning(); w.GetCode() != "NO_RESULTS_ON_PAGE" {
		t.Errorf("recorded aggregated list: warning %v", w)
	}
	// Error bodies are read by googleapi, as the SDK's REST clients do.
	for _, m := range r["error"] {
		b, _ := json.Marshal(m)
		e := m["error"].(map[string]any)                                                                                       //nolint:forcetypeassert // An error body.
		err := googleapi.CheckResponseWithBody(&http.Response{StatusCode: int(e["code"].(float64)), Header: http.Header{}}, b) //nolint:forcetypeassert // A number.
		var ge *googleapi.Error
		want := e["errors"].([]any)[0].(map[string]any)["reason"] //nolint:forcetypeassert // The recorded shape.
		if !errorsAs(err, &ge) || len(ge.Errors) == 0 || ge.Errors[0].Reason != want {
			t.Errorf("recorded error body: %v; want reason %v", err, want)
		}
	}
}

// denormalize undoes the recorder's normalization where it broke the
// wire format: IDs (uint64 as strings) were replaced by
// "000000000000000000000" or "${...}" placeholders.
func denormalize(m map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		switch x := v.(type) {
		case map[string]any:
			v = denormalize(x)
		case []any:
			l := make([]any, len(x))
			for i, e := range x {
				if em, ok := e.(map[string]any); ok {
					e = denormalize(em)
				}
				l[i] = e
			}
			v = l
		case string:
			if (k == "id" || k == "targetId" || strings.HasSuffix(k, "Id")) && (strings.HasPrefix(x, "${") || strings.Trim(x, "0") == "") {
				v = "0"
			}
		}
		out[k] = v
	}
	return out
}

func errorsAs(err error, ge **googleapi.Error) bool {
	e, ok := err.(*googleapi.Error) //nolint:errorlint // CheckResponse returns it unwrapped.
	*ge = e
	return ok
}

// TestFakeAnswersInTheRecordedShapes drives the fake with the driver (on
// the real SDK clients), then reads its answers raw and compares them with
// the real ones: every field a real answer of the kind has is there with
// the same JSON type, and every answer decodes strictly (no unknown
// field) into the SDK's type, which is the v1 discovery document's schema.
func TestFakeAnswersInTheRecordedShapes(t *testing.T) {
	r := loadRecorded(t)
	f := newFixture(t)
	ctx := context.Background()

	// A static address, a rule and an instance, all settled; then an
	// insert that fails on its operation.
	req := request("pt-wire", "0c8f6a1e-0000-4e2a-9c3f-00000000000a")
	req.Extension = proxyExposure(gcp.AddressStatic, true)
	first, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	inst, err := f.driver.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()
	f.srv.FailNextOperation("instances", "insert", "ZONE_RESOURCE_POOL_EXHAUSTED", "The zone does not have enough resources available to fulfill the request.", 503)
	bad, err := f.driver.Create(ctx, request("pt-stockout", "0c8f6a1e-0000-4e2a-9c3f-00000000000b"))
	if err != nil {
		t.Fatal(err)
	}
	f.srv.SettleAll()

	raw := func(path string) (int, map[string]any, []byte) {
		t.Helper()
		resp, err := http.Get(f.srv.URL + "/compute/v1/projects/" + testProject + "/" + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s: %v: %s", path, err, b)
		}
		return resp.StatusCode, m, b
	}
	strict := func(what string, b []byte, into proto.Message) {
		t.Helper()
		if err := protojson.Unmarshal(b, into); err != nil {
			t.Errorf("the fake's %s does not decode strictly into %T: %v", what, into, err)
		}
	}
	ops := append(strings.Fields(first.Operation), strings.Fields(inst.Operation)...)
	ops = append(ops, strings.Fields(bad.Operation)...)
	if len(ops) < 4 {
		t.Fatalf("want operations for the address, rule, instance and the failed insert; got %v", ops)
	}
	var failedOp map[string]any
	for _, o := range ops {
		_, m, b := raw(o)
		strict("operation "+o, b, &computepb.Operation{})
		sameShape(t, "operation", r["compute#operation"], m, nil)
		if m["error"] != nil {
			failedOp = m
		}
	}
	if failedOp == nil {
		t.Fatal("the failed insert's operation has no error")
	}
	// The failed operation's shape is that of the recorded failures.
	var recordedFailed []map[string]any
	for _, m := range r["compute#operation"] {
		if m["error"] != nil {
			recordedFailed = append(recordedFailed, m)
		}
	}
	sameShape(t, "failed operation", recordedFailed, failedOp, []string{"error", "httpErrorStatusCode", "httpErrorMessage", "endTime", "status", "progress"})

	_, m, b := raw("zones/" + testZone + "/instances/pt-wire")
	strict("instance", b, &computepb.Instance{})
	// The v1 aggregated list's instance is the real v1 shape (the KCC
	// recordings are beta bodies with /v1/ links).
	var v1Instance map[string]any
	for _, sl := range r["compute#instanceAggregatedList"][0]["items"].(map[string]any) { //nolint:forcetypeassert // The recording's shape.
		if l, ok := sl.(map[string]any)["instances"].([]any); ok {
			v1Instance = l[0].(map[string]any) //nolint:forcetypeassert // The recording's shape.
		}
	}
	sameShape(t, "instance", []map[string]any{v1Instance}, m, slices.Sorted(maps.Keys(v1Instance)))
	sameShape(t, "instance (KCC)", r["compute#instance"], m, nil)

	_, m, b = raw("regions/" + testRegion + "/addresses/pt-wire")
	strict("address", b, &computepb.Address{})
	sameShape(t, "address", r["compute#address"], m, []string{"address", "addressType", "creationTimestamp", "id", "kind", "labelFingerprint", "name", "networkTier", "region", "selfLink", "status"})

	_, m, b = raw("global/firewalls/pt-wire")
	strict("firewall", b, &computepb.Firewall{})
	sameShape(t, "firewall", r["compute#firewall"], m, []string{"allowed", "creationTimestamp", "description", "direction", "disabled", "id", "kind", "logConfig", "name", "network", "priority", "selfLink", "sourceRanges"})

	_, m, b = raw("aggregated/instances?maxResults=1")
	strict("aggregated list", b, &computepb.InstanceAggregatedList{})
	sameShape(t, "aggregated list", r["compute#instanceAggregatedList"], m, []string{"id", "items", "kind", "selfLink"})

	status, m, b := raw("zones/" + testZone + "/instances/pt-never")
	if status != 404 {
		t.Errorf("missing instance: status %d", status)
	}
	sameShape(t, "404 error", r["error"], m, []string{"error"})
	if err := googleapi.CheckResponseWithBody(&http.Response{StatusCode: status, Header: http.Header{}}, b); !strings.Contains(fmt.Sprint(err), "notFound") {
		t.Errorf("the fake's 404 does not read as notFound: %v", err)
	}
}

func proxyExposure(addressType string, firewall bool) gcp.Exposure {
	return gcp.Exposure{AddressType: addressType, ManageFirewall: firewall}
}

// sameShape checks got against the recorded bodies of its kind: each key
// in required is in got; each key of got that a recorded body has holds
// the same JSON type there (objects compared recursively, arrays by their
// first element); and got has no key that no recorded body has, unless
// it is in the v1 schema (the strict decode checks that).
func sameShape(t *testing.T, what string, rec []map[string]any, got map[string]any, required []string) {
	t.Helper()
	if len(rec) == 0 {
		t.Fatalf("no recorded %s to compare with", what)
	}
	for _, k := range required {
		if _, ok := got[k]; !ok {
			t.Errorf("%s: the fake's answer lacks %q, which the real one has", what, k)
		}
	}
	for k, v := range got {
		for _, r := range rec {
			if rv, ok := r[k]; ok {
				compareJSON(t, what+"."+k, rv, v)
				break
			}
		}
	}
}

func compareJSON(t *testing.T, path string, want, got any) {
	t.Helper()
	if jsonType(want) != jsonType(got) {
		t.Errorf("%s: the fake answers a %s, the real API a %s (%v)", path, jsonType(got), jsonType(want), want)
		return
	}
	switch w := want.(type) {
	case map[string]any:
		g := got.(map[string]any) //nolint:forcetypeassert // Same JSON type.
		for k, gv := range g {
			if wv, ok := w[k]; ok {
				compareJSON(t, path+"."+k, wv, gv)
			}
		}
	case []any:
		g := got.([]any) //nolint:forcetypeassert // Same JSON type.
		if len(w) > 0 && len(g) > 0 && !slices.ContainsFunc(w, func(x any) bool { _, ok := x.(string); return ok }) {
			compareJSON(t, path+"[0]", w[0], g[0])
		}
	}
}

func jsonType(v any) string {
	switch v.(type) {
	case map[string]any:
		return "object"
	case []any:
		return "array"
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}
