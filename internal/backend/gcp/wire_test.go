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
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/api/googleapi"

	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp"
	"github.com/egressproxy/provider-egressproxy/internal/backend/gcp/computeapi"
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

// TestRecordedExchangesDecode decodes the real bodies into computeapi's
// types, as the client does, and checks the fields the driver reads come
// through.
func TestRecordedExchangesDecode(t *testing.T) {
	r := loadRecorded(t)
	var running *computeapi.Instance
	for _, m := range r["compute#instance"] {
		inst := decodeAs[computeapi.Instance](t, m)
		if inst.GetStatus() == "RUNNING" {
			running = inst
		}
	}
	if running == nil || running.GetNetworkInterfaces()[0].GetAccessConfigs()[0].GetNatIP() != "34.169.196.191" ||
		running.GetLabels()["label-one"] == "" || running.GetCreationTimestamp() == "" {
		t.Errorf("recorded RUNNING instance: natIP, labels or creationTimestamp lost: %+v", running)
	}
	var failed []*computeapi.Operation
	for _, m := range r["compute#operation"] {
		op := decodeAs[computeapi.Operation](t, m)
		if op.GetError() != nil {
			failed = append(failed, op)
		}
	}
	if len(failed) != 2 || failed[0].GetError().GetErrors()[0].GetCode() != "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE" ||
		failed[0].GetHttpErrorStatusCode() != 400 || failed[1].GetHttpErrorStatusCode() != 409 || failed[1].GetStatus() != computeapi.OperationDone {
		t.Errorf("recorded failed operations: %+v", failed)
	}
	for _, m := range r["compute#address"] {
		a := decodeAs[computeapi.Address](t, m)
		if a.GetAddress() != "8.8.8.8" || (a.GetStatus() != "RESERVED" && a.GetStatus() != "IN_USE") {
			t.Errorf("recorded address: %+v", a)
		}
	}
	agg := decodeAs[computeapi.InstanceAggregatedList](t, r["compute#instanceAggregatedList"][0])
	if w := agg.GetItems()["zones/us-central1-b"].GetWarning(); w.GetCode() != "NO_RESULTS_ON_PAGE" {
		t.Errorf("recorded aggregated list: warning %+v", w)
	}
	// Error bodies are read by googleapi, as the client does.
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

// TestRecordedBodiesRoundTrip reads every member of the real answers that
// the driver reads through computeapi's getters and compares it with the
// recorded value: a member whose tag is misspelt reads as unset and
// fails. Every recorded instance also encodes back to exactly the body it
// was read from (instances.update sends what was read). The members no
// recording has are checked against the discovery document by computeapi's
// tests.
func TestRecordedBodiesRoundTrip(t *testing.T) {
	r := loadRecorded(t)
	instanceReads := func(in *computeapi.Instance) map[string]any {
		md, nic := in.GetMetadata(), first(in.GetNetworkInterfaces())
		return map[string]any{
			"name": in.GetName(), "zone": in.GetZone(), "status": in.GetStatus(), "creationTimestamp": in.GetCreationTimestamp(),
			"fingerprint": in.GetFingerprint(), "labels": in.GetLabels(), "tags.items": in.GetTags().GetItems(),
			"metadata.fingerprint": md.GetFingerprint(), "metadata.items.0.key": first(md.GetItems()).GetKey(), "metadata.items.0.value": first(md.GetItems()).GetValue(),
			"networkInterfaces.0.networkIP":             nic.GetNetworkIP(),
			"networkInterfaces.0.accessConfigs.0.natIP": first(nic.GetAccessConfigs()).GetNatIP(),
		}
	}
	reads := map[string]func(m map[string]any) map[string]any{
		"compute#instance": func(m map[string]any) map[string]any { return instanceReads(decodeAs[computeapi.Instance](t, m)) },
		"compute#operation": func(m map[string]any) map[string]any {
			op := decodeAs[computeapi.Operation](t, m)
			e := first(op.GetError().GetErrors())
			return map[string]any{
				"name": op.GetName(), "zone": op.GetZone(), "region": op.GetRegion(), "status": op.GetStatus(), "operationType": op.GetOperationType(),
				"targetLink": op.GetTargetLink(), "progress": op.GetProgress(), "endTime": op.GetEndTime(), "httpErrorStatusCode": op.GetHttpErrorStatusCode(),
				"error.errors.0.code": e.GetCode(), "error.errors.0.message": e.GetMessage(),
			}
		},
		"compute#address": func(m map[string]any) map[string]any {
			a := decodeAs[computeapi.Address](t, m)
			return map[string]any{
				"name": a.GetName(), "region": a.GetRegion(), "address": a.GetAddress(), "creationTimestamp": a.GetCreationTimestamp(),
				"labelFingerprint": a.GetLabelFingerprint(), "labels": a.GetLabels(),
			}
		},
		"compute#firewall": func(m map[string]any) map[string]any {
			fw := decodeAs[computeapi.Firewall](t, m)
			return map[string]any{
				"name": fw.GetName(), "description": fw.GetDescription(), "disabled": fw.GetDisabled(), "sourceRanges": fw.GetSourceRanges(), "targetTags": fw.GetTargetTags(),
				"allowed.0.IPProtocol": first(fw.GetAllowed()).GetIPProtocol(), "allowed.0.ports": first(fw.GetAllowed()).GetPorts(),
				"creationTimestamp": fw.GetCreationTimestamp(),
			}
		},
		"compute#instanceAggregatedList": func(m map[string]any) map[string]any {
			l := decodeAs[computeapi.InstanceAggregatedList](t, m)
			out := map[string]any{}
			for scope, sl := range l.GetItems() {
				out["items."+scope+".warning.code"] = sl.GetWarning().GetCode()
				for k, v := range instanceReads(first(sl.GetInstances())) {
					out["items."+scope+".instances.0."+k] = v
				}
			}
			return out
		},
	}
	// The members the driver reads that no recording has
	// (recordedNowhere) are checked against the discovery document only.
	unrecorded := map[string]bool{}
	for kind, read := range reads {
		seen := map[string]bool{}
		all := map[string]bool{}
		for _, m := range r[kind] {
			m = denormalize(m)
			for path, got := range read(m) {
				all[anyScope(path)] = true
				want, ok := member(m, path)
				if !ok {
					continue
				}
				seen[anyScope(path)] = true
				w, _ := json.Marshal(want)
				g, _ := json.Marshal(got)
				if string(w) != string(g) {
					t.Errorf("%s %s: read %s; the recorded answer has %s", kind, path, g, w)
				}
			}
		}
		for p := range all {
			if !seen[p] {
				unrecorded[kind+" "+p] = true
			}
		}
	}
	if got := slices.Sorted(maps.Keys(unrecorded)); !slices.Equal(got, recordedNowhere) {
		t.Errorf("members the driver reads that no recording has: %q; want %q", got, recordedNowhere)
	}

	// Instances encode back to what they were read from.
	instances := r["compute#instance"]
	for _, sl := range r["compute#instanceAggregatedList"][0]["items"].(map[string]any) { //nolint:forcetypeassert // The recording's shape.
		l, _ := sl.(map[string]any)["instances"].([]any) //nolint:forcetypeassert // The recording's shape.
		for _, in := range l {
			instances = append(instances, in.(map[string]any)) //nolint:forcetypeassert // The recording's shape.
		}
	}
	for _, m := range instances {
		m = denormalize(m)
		b, err := json.Marshal(decodeAs[computeapi.Instance](t, m))
		if err != nil {
			t.Fatal(err)
		}
		var back map[string]any
		if err := json.Unmarshal(b, &back); err != nil {
			t.Fatal(err)
		}
		if d := firstDiff("", m, back); d != "" {
			t.Errorf("instance %v does not encode back to what it was read from: %s", m["name"], d)
		}
	}
}

// recordedNowhere are the members the driver reads that no recording
// has, by kind.
var recordedNowhere = []string{
	"compute#firewall targetTags",
	"compute#instance tags.items",
	"compute#instanceAggregatedList items.*.instances.0.tags.items",
}

// anyScope is path with the scope of an aggregated list's items as *.
func anyScope(path string) string {
	p := strings.Split(path, ".")
	if len(p) > 1 && p[0] == "items" {
		p[1] = "*"
	}
	return strings.Join(p, ".")
}

// firstDiff names the first member where got differs from want; "" when
// they are the same.
func firstDiff(path string, want, got any) string {
	switch w := want.(type) {
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			return path + ": not an object"
		}
		for _, k := range slices.Sorted(maps.Keys(w)) {
			if d := firstDiff(path+"."+k, w[k], g[k]); d != "" {
				return d
			}
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				return path + "." + k + ": not in what was read"
			}
		}
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			return path + ": not the same array"
		}
		for i := range w {
			if d := firstDiff(path+"."+strconv.Itoa(i), w[i], g[i]); d != "" {
				return d
			}
		}
	default:
		if !reflect.DeepEqual(want, got) {
			return fmt.Sprintf("%s: encoded as %v, read as %v", path, got, want)
		}
	}
	return ""
}

// member is the value at path (dot-separated members and indexes) in m.
func member(m map[string]any, path string) (any, bool) {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			e, ok := x[k]
			if !ok {
				return nil, false
			}
			v = e
		case []any:
			i, err := strconv.Atoi(k)
			if err != nil || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}

func first[T any](s []*T) *T {
	if len(s) == 0 {
		return nil
	}
	return s[0]
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

// decodeAs decodes a recorded body into a T, as the client decodes an
// answer.
func decodeAs[T any](t *testing.T, m map[string]any) *T {
	t.Helper()
	b, _ := json.Marshal(denormalize(m))
	out := new(T)
	if err := json.Unmarshal(b, out); err != nil {
		t.Fatalf("%T: %v", out, err)
	}
	return out
}

func errorsAs(err error, ge **googleapi.Error) bool {
	e, ok := err.(*googleapi.Error) //nolint:errorlint // CheckResponse returns it unwrapped.
	*ge = e
	return ok
}

// TestFakeAnswersInTheRecordedShapes drives the fake with the driver (on
// its real client), then reads its answers raw and compares them with the
// real ones: every field a real answer of the kind has is there with the
// same JSON type, and every answer has only members of its schema in the
// v1 discovery document, with their types.
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
	d, err := gcptest.LoadDiscovery()
	if err != nil {
		t.Fatal(err)
	}
	strict := func(what string, b []byte, schema string) {
		t.Helper()
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			t.Fatal(err)
		}
		if p := d.CheckSchema(schema, v); len(p) > 0 {
			t.Errorf("the fake's %s is not Compute Engine's %s: %v", what, schema, p)
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
		strict("operation "+o, b, "Operation")
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
	strict("instance", b, "Instance")
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
	strict("address", b, "Address")
	sameShape(t, "address", r["compute#address"], m, []string{"address", "addressType", "creationTimestamp", "id", "kind", "labelFingerprint", "name", "networkTier", "region", "selfLink", "status"})

	_, m, b = raw("global/firewalls/pt-wire")
	strict("firewall", b, "Firewall")
	sameShape(t, "firewall", r["compute#firewall"], m, []string{"allowed", "creationTimestamp", "description", "direction", "disabled", "id", "kind", "logConfig", "name", "network", "priority", "selfLink", "sourceRanges"})

	_, m, b = raw("aggregated/instances?maxResults=1")
	strict("aggregated list", b, "InstanceAggregatedList")
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
