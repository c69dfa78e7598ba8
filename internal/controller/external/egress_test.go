package external

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

const testEchoURL = "http://echo.example.com/ip"

// egressKind is testKind whose config block names an echo endpoint.
func egressKind() Kind[spec.KVMProxyParameters] {
	k := testKind(nil)
	k.Backend.Block = func(s *spec.ProviderConfigSpec) (Block, bool) {
		return Block{EgressCheck: &spec.EgressCheck{URL: testEchoURL}}, s.KVM != nil
	}
	return k
}

// TestEgressCheckCredential: the check's credential is the provider's own,
// not the proxy user's, stable, and part of the secret digest only when a
// check is configured.
func TestEgressCheckCredential(t *testing.T) {
	ctx := context.Background()
	cr := proxyResource()
	cr.Spec.ForProvider.Proxy.Auth = &spec.ProxyAuth{Enabled: true, Username: "team"}
	with, err := newExternal(egressKind(), nil, nil).request(ctx, cr)
	if err != nil {
		t.Fatal(err)
	}
	without, err := newExternal(testKind(nil), nil, nil).request(ctx, cr)
	if err != nil {
		t.Fatal(err)
	}
	c := with.Proxy.EgressCheck
	if c == nil || c.URL != testEchoURL || c.Username != squid.CheckUsername || len(c.Password) != generatedPasswordLength || c.Password == with.Proxy.Auth.Password {
		t.Fatalf("EgressCheck = %+v; want the config's URL, the check's user and a password of its own", c)
	}
	again, _ := newExternal(egressKind(), nil, nil).request(ctx, cr)
	if again.Proxy.EgressCheck.Password != c.Password {
		t.Error("the check's password differs between reconciles; it must be derived, stable")
	}
	if without.Proxy.EgressCheck != nil || without.SecretDigest == with.SecretDigest {
		t.Errorf("without a check: EgressCheck %+v, digest %s (with one %s); want none, and another digest", without.Proxy.EgressCheck, without.SecretDigest, with.SecretDigest)
	}
}

func TestSetEgress(t *testing.T) {
	running := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: "10.0.0.5:3128"}
	reserved := running
	reserved.EgressIP, reserved.EgressSource = "203.0.113.9", proxy.EgressBackend
	moved := running
	moved.ProxyAddress = "10.0.0.6:3128"
	remote := running
	remote.ProxyAddress, remote.EgressIP, remote.EgressSource, remote.EgressCheckedAt = "", "203.0.113.3", proxy.EgressReported, time.Now()
	unreached := running
	unreached.ProxyAddress = ""
	remoteMoved := remote
	remoteMoved.IP, remoteMoved.EgressIP = "10.0.0.6", "203.0.113.4"
	// A new pod that has not reported yet.
	remoteNew := unreached
	remoteNew.IP = "10.0.0.6"
	blip := running
	blip.ProxyReachable, blip.ProxyAddress = false, ""

	type step struct {
		inst   proxy.Instance
		answer string // the echo's answer; "" fails the check
	}
	cases := map[string]struct {
		kind       Kind[spec.KVMProxyParameters]
		steps      []step
		wantIP     string
		wantSource string
		wantCond   xpv2.ConditionReason // "" for no condition
		wantStatus corev1.ConditionStatus
		wantEvents []string
	}{
		"Verified": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}},
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressVerified, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified"}},
		"DiffersFromTheReservedAddress": {kind: egressKind(), steps: []step{{reserved, "203.0.113.7"}},
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressDiffers, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Warning EgressIPDiffers"}},
		"ChangedWhenThePodMoved": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}, {moved, "203.0.113.8"}},
			wantIP: "203.0.113.8", wantSource: spec.EgressIPVerified, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressIPChanged"}},
		"AProbeThatFailsOnceKeepsTheAddress": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}, {blip, ""}},
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressVerified, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified"}},
		"CheckFails": {kind: egressKind(), steps: []step{{running, ""}},
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse, wantEvents: []string{"Warning EgressCheckFailed"}},
		"ReportedFromInside": {kind: egressKind(), steps: []step{{remote, ""}},
			wantIP: "203.0.113.3", wantSource: spec.EgressIPReported, wantCond: reasonEgressReported, wantStatus: corev1.ConditionTrue},
		"ReportedChangeAfterANewPodReports": {kind: egressKind(), steps: []step{{remote, ""}, {remoteNew, ""}, {remoteMoved, ""}},
			wantIP: "203.0.113.4", wantSource: spec.EgressIPReported, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Warning EgressIPChanged"}},
		"Unreachable": {kind: egressKind(), steps: []step{{unreached, ""}},
			wantCond: reasonEgressNoPath, wantStatus: corev1.ConditionUnknown},
		"NoCheckBackendFigure": {kind: testKind(nil), steps: []step{{reserved, "203.0.113.7"}},
			wantIP: "203.0.113.9", wantSource: spec.EgressIPBackend},
		"NoCheckNoFigure": {kind: testKind(nil), steps: []step{{running, "203.0.113.7"}}},
		// A report the instance still holds after its check was turned
		// off.
		"NoCheckAReportLeftBehind": {kind: testKind(nil), steps: []step{{remote, ""}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := &recorder{}
			e := newExternal(tc.kind, nil, nil)
			e.record = r
			var answer string
			e.egress = &squid.EgressChecker{Ask: func(_ context.Context, _ string, c proxy.EgressCheck) (string, error) {
				if answer == "" {
					return "", errors.New("refused")
				}
				return answer, nil
			}}
			cr := proxyResource()
			var inst proxy.Instance
			for _, s := range tc.steps {
				answer, inst = s.answer, s.inst
				req, err := e.request(context.Background(), cr)
				if err != nil {
					t.Fatal(err)
				}
				before := egressOf(cr.Observation())
				setObservation(cr.Observation(), inst, req, nil)
				e.setEgress(context.Background(), cr, &inst, req, before)
			}
			o := cr.Status.AtProvider
			if o.EgressIP != tc.wantIP || o.EgressIPSource != tc.wantSource || inst.EgressIP != tc.wantIP {
				t.Errorf("egressIP %q (%q), connection Secret's %q; want %q (%q)", o.EgressIP, o.EgressIPSource, inst.EgressIP, tc.wantIP, tc.wantSource)
			}
			if (o.EgressIPVerifiedAt != nil) != (tc.wantSource == spec.EgressIPVerified || tc.wantSource == spec.EgressIPReported) {
				t.Errorf("egressIPVerifiedAt %v with source %q", o.EgressIPVerifiedAt, o.EgressIPSource)
			}
			c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
			if c.Reason != tc.wantCond || (tc.wantCond != "" && c.Status != tc.wantStatus) {
				t.Errorf("EgressVerified %s %s %q; want %s %s", c.Status, c.Reason, c.Message, tc.wantStatus, tc.wantCond)
			}
			if strings.Contains(c.Message, "sentinel") {
				t.Errorf("condition quotes a secret: %s", c.Message)
			}
			if diff := cmp.Diff(tc.wantEvents, r.reasons, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("events: -want, +got:\n%s", diff)
			}
		})
	}
}
