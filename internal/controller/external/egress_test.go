package external

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	clusterproxy "github.com/egressproxy/provider-egressproxy/apis/cluster/proxy/v1alpha1"
	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/proxy/proxytest"
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
	reserved.EgressIP, reserved.EgressSource, reserved.BackendEgressIP = "203.0.113.9", proxy.EgressBackend, "203.0.113.9"
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
	// The instance's own Squid answered its check, but not with the
	// echo's address.
	failedInside := unreached
	failedInside.EgressFailure, failedInside.EgressCheckedAt = "the check through the instance's own Squid was answered 502", time.Now()
	// A GCP instance's external address, and a guest reporting another.
	natReported := remote
	natReported.BackendEgressIP = "203.0.113.9"
	natSame := natReported
	natSame.EgressIP = natSame.BackendEgressIP
	natFailed := failedInside
	natFailed.EgressIP, natFailed.EgressSource, natFailed.BackendEgressIP = "203.0.113.9", proxy.EgressBackend, "203.0.113.9"
	// Three replicas behind a load balancer: the check sees one.
	balanced := running
	balanced.ServingReplicas = 3
	balancedMoved := moved
	balancedMoved.ServingReplicas = 3

	// The same proxy recreated: another instance at the same name.
	recreated := running
	recreated.CreatedAt = time.Date(2026, 12, 6, 1, 2, 3, 0, time.UTC)
	recreatedBooting := recreated
	recreatedBooting.ProxyReachable, recreatedBooting.ProxyAddress = false, ""
	// A GCP instance whose ephemeral address changed at a restart.
	reservedMoved := reserved
	reservedMoved.EgressIP, reservedMoved.BackendEgressIP = "203.0.113.10", "203.0.113.10"

	// The same instance updated in place.
	updated := running
	updated.SpecHash = "v2"
	// The backend's figure differs from what the echo sees, for good (a
	// NAT in front of the instance).
	natBehind := reserved
	natBlip := natBehind
	natBlip.ProxyReachable, natBlip.ProxyAddress = false, ""

	// A GCP instance reached at its external address, and the same after
	// a stop and start that gave it another ephemeral address; a pod
	// moved to another node; a remote pod replaced, reporting a failed
	// check or none yet.
	gcp := running
	gcp.ProxyAddress, gcp.BackendEgressIP = "203.0.113.9:3128", "203.0.113.9"
	gcpRestarted := gcp
	gcpRestarted.ProxyAddress, gcpRestarted.BackendEgressIP = "203.0.113.10:3128", "203.0.113.10"
	podMoved := running
	podMoved.IP, podMoved.ProxyAddress = "10.1.0.7", "10.1.0.7:3128"
	// The same, booting: the backend names the new address before the
	// proxy answers there.
	gcpRestartedBooting := gcpRestarted
	gcpRestartedBooting.ProxyReachable, gcpRestartedBooting.ProxyAddress = false, ""
	// Booting at another ephemeral address that the backend gives as the
	// egress address meanwhile.
	reservedMovedBooting := reservedMoved
	reservedMovedBooting.ProxyReachable, reservedMovedBooting.ProxyAddress = false, ""
	podMovedBooting := podMoved
	podMovedBooting.ProxyReachable, podMovedBooting.ProxyAddress = false, ""
	remotePod := remote
	remotePod.Details = map[string]string{"pod": "p-1"}
	// Another pod behind the same Service (a rollout): the same route.
	replacedFailed := failedInside
	replacedFailed.Details = map[string]string{"pod": "p-2"}
	replacedSilent := unreached
	replacedSilent.Details = map[string]string{"pod": "p-2"}
	sameFailed := replacedFailed
	sameFailed.Details = remotePod.Details
	// A pod clients reach at another address (no Service in front).
	movedFailed := replacedFailed
	movedFailed.IP = "10.0.0.6"
	movedSilent := replacedSilent
	movedSilent.IP = "10.0.0.6"

	type step struct {
		inst   proxy.Instance
		answer string // the echo's answer; "" fails the check
	}
	cases := map[string]struct {
		kind        Kind[spec.KVMProxyParameters]
		steps       []step
		restartAt   int  // the provider restarts before this step (a checker with no memory); 0 for never
		lastNoCheck bool // the last step's config names no check
		wantIP      string
		wantSource  string
		wantCond    xpv2.ConditionReason // "" for no condition
		wantStatus  corev1.ConditionStatus
		wantMsg     []string // in the condition's message
		wantEvents  []string
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
		"AMovedPodsFailedCheckKeepsNoAddress": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}, {moved, ""}},
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		"ARecreatedInstancesFailedCheckKeepsNoAddress": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}, {recreated, ""}},
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		"ARecreatedInstanceBootingKeepsNoAddress": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}, {recreatedBooting, ""}},
			wantCond: reasonEgressPending, wantStatus: corev1.ConditionUnknown,
			wantMsg:    []string{"a new instance replaced the one whose egress address was checked"},
			wantEvents: []string{"Normal EgressIPVerified"}},
		"ARecreatedInstanceIsVerifiedAgain": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}, {recreatedBooting, ""}, {recreated, "203.0.113.7"}},
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressVerified, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified", "Normal EgressIPVerified"}},
		"TheBackendsFigureMovedAndTheCheckFails": {kind: egressKind(), steps: []step{{reserved, "203.0.113.9"}, {reservedMoved, ""}},
			wantIP: "203.0.113.10", wantSource: spec.EgressIPBackend, wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		"TheBackendsFigureMovedIsCheckedAtOnce": {kind: egressKind(), steps: []step{{reserved, "203.0.113.9"}, {reservedMoved, "203.0.113.10"}},
			wantIP: "203.0.113.10", wantSource: spec.EgressIPVerified, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressIPChanged"}},
		"AnUpdateInPlaceWhoseCheckFailsKeepsTheAddress": {kind: egressKind(), steps: []step{{running, "203.0.113.7"}, {updated, ""}},
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		// A probe that fails once while the echo and the backend disagree
		// keeps what the echo saw: no flapping to the backend's figure.
		"DiffersThenAProbeFailsKeepsTheCheckedAddress": {kind: egressKind(), steps: []step{{natBehind, "203.0.113.7"}, {natBlip, ""}},
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressDiffers, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Warning EgressIPDiffers"}},
		"CheckFails": {kind: egressKind(), steps: []step{{running, ""}},
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse, wantEvents: []string{"Warning EgressCheckFailed"}},
		"OneReplicaOfSeveralPerCheck": {kind: egressKind(), steps: []step{{balanced, "203.0.113.7"}, {balanced, "203.0.113.7"}},
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressVerified, wantStatus: corev1.ConditionTrue,
			wantMsg:    []string{"the proxy has 3 replicas and the check sees one at a time"},
			wantEvents: []string{"Normal EgressIPVerified"}},
		"OneReplicaOfSeveralChangedSaysItOnce": {kind: egressKind(), steps: []step{{balanced, "203.0.113.7"}, {balancedMoved, "203.0.113.8"}, {balancedMoved, "203.0.113.8"}},
			wantIP: "203.0.113.8", wantSource: spec.EgressIPVerified, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantMsg:    []string{"the proxy has 3 replicas and the check sees one at a time"},
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressIPChanged"}},
		"ReportedFromInside": {kind: egressKind(), steps: []step{{remote, ""}},
			wantIP: "203.0.113.3", wantSource: spec.EgressIPReported, wantCond: reasonEgressReported, wantStatus: corev1.ConditionTrue},
		// The new pod reported nothing at first: no address is published
		// in between, and its report is compared with the old pod's
		// (egressIPsBefore), a change whether or not the provider saw
		// the silence.
		"ANewPodsReportAfterItsSilence": {kind: egressKind(), steps: []step{{remote, ""}, {remoteNew, ""}, {remoteMoved, ""}},
			wantIP: "203.0.113.4", wantSource: spec.EgressIPReported, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantMsg: []string{"changed from 203.0.113.3 to 203.0.113.4"}, wantEvents: []string{"Warning EgressIPChanged"}},
		"ANewPodsSameReportAfterItsSilence": {kind: egressKind(), steps: []step{{remote, ""}, {remoteNew, ""}, {remote, ""}},
			wantIP: "203.0.113.3", wantSource: spec.EgressIPReported, wantCond: reasonEgressReported, wantStatus: corev1.ConditionTrue},
		"ReportedChangeAfterANewPodReports": {kind: egressKind(), steps: []step{{remote, ""}, {remoteMoved, ""}},
			wantIP: "203.0.113.4", wantSource: spec.EgressIPReported, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Warning EgressIPChanged"}},
		// After a restart the checker remembers nothing: status says
		// through what the address was checked.
		// The address checked is the old address's: the instance no
		// longer has it (an ephemeral address released at the stop).
		"AnInstanceBootingAtANewAddressKeepsNoAddress": {kind: egressKind(), steps: []step{{inst: gcp, answer: "203.0.113.9"}, {inst: gcpRestartedBooting}},
			wantCond: reasonEgressPending, wantStatus: corev1.ConditionUnknown,
			wantMsg:    []string{"the instance's address changed since its egress address was checked"},
			wantEvents: []string{"Normal EgressIPVerified"}},
		// Its first check is compared with the address checked before
		// it booted there: a change, though none was published between.
		"AnInstanceBootingAtANewAddressThenCheckedIsAChange": {kind: egressKind(), steps: []step{{inst: gcp, answer: "203.0.113.9"}, {inst: gcpRestartedBooting}, {inst: gcpRestarted, answer: "203.0.113.10"}},
			wantIP: "203.0.113.10", wantSource: spec.EgressIPVerified, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantMsg: []string{"changed from 203.0.113.9 to 203.0.113.10"}, wantEvents: []string{"Normal EgressIPVerified", "Warning EgressIPChanged"}},
		"AnInstanceBootingAtTheBackendsNewFigureThenCheckedIsAChange": {kind: egressKind(), steps: []step{{inst: reserved, answer: "203.0.113.9"}, {inst: reservedMovedBooting}, {inst: reservedMoved, answer: "203.0.113.10"}},
			wantIP: "203.0.113.10", wantSource: spec.EgressIPVerified, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantMsg: []string{"changed from 203.0.113.9 to 203.0.113.10"}, wantEvents: []string{"Normal EgressIPVerified", "Warning EgressIPChanged"}},
		"AMovedPodBootingKeepsNoAddress": {kind: egressKind(), steps: []step{{inst: running, answer: "203.0.113.7"}, {inst: podMovedBooting}},
			wantCond: reasonEgressPending, wantStatus: corev1.ConditionUnknown,
			wantEvents: []string{"Normal EgressIPVerified"}},
		"AfterARestartAFailedCheckThroughANewEphemeralAddressKeepsNoAddress": {kind: egressKind(), steps: []step{{inst: gcp, answer: "203.0.113.9"}, {inst: gcpRestarted}}, restartAt: 1,
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		"AfterARestartAMovedPodsFailedCheckKeepsNoAddress": {kind: egressKind(), steps: []step{{inst: running, answer: "203.0.113.7"}, {inst: podMoved}}, restartAt: 1,
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		"AfterARestartAMovedPodBootingThenFailingKeepsNoAddress": {kind: egressKind(), steps: []step{{inst: running, answer: "203.0.113.7"}, {inst: blip}, {inst: podMoved}}, restartAt: 1,
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		"AfterARestartAFailedCheckThroughTheSameProxyKeepsTheAddress": {kind: egressKind(), steps: []step{{inst: running, answer: "203.0.113.7"}, {inst: running}}, restartAt: 1,
			wantIP: "203.0.113.7", wantSource: spec.EgressIPVerified, wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressCheckFailed"}},
		"APodAtANewAddressWhoseReportFailedKeepsNoAddress": {kind: egressKind(), steps: []step{{inst: remotePod}, {inst: movedFailed}},
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse, wantEvents: []string{"Warning EgressCheckFailed"}},
		"APodAtANewAddressNotReportingYetKeepsNoAddress": {kind: egressKind(), steps: []step{{inst: remotePod}, {inst: movedSilent}},
			wantCond: reasonEgressNoPath, wantStatus: corev1.ConditionUnknown},
		// A rollout behind the Service: the address stays published, in
		// status and the connection Secret, until a check says otherwise.
		"APodReplacedBehindItsServiceWhoseReportFailedKeepsTheAddress": {kind: egressKind(), steps: []step{{inst: remotePod}, {inst: replacedFailed}},
			wantIP: "203.0.113.3", wantSource: spec.EgressIPReported, wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Warning EgressCheckFailed"}},
		"APodReplacedBehindItsServiceNotReportingYetKeepsTheAddress": {kind: egressKind(), steps: []step{{inst: remotePod}, {inst: replacedSilent}},
			wantIP: "203.0.113.3", wantSource: spec.EgressIPReported, wantCond: reasonEgressNoPath, wantStatus: corev1.ConditionUnknown},
		"TheSamePodsFailedReportKeepsTheAddress": {kind: egressKind(), steps: []step{{inst: remotePod}, {inst: sameFailed}},
			wantIP: "203.0.113.3", wantSource: spec.EgressIPReported, wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Warning EgressCheckFailed"}},
		"Unreachable": {kind: egressKind(), steps: []step{{unreached, ""}},
			wantCond: reasonEgressNoPath, wantStatus: corev1.ConditionUnknown},
		"CheckFailedInsideKeepsTheReportedAddress": {kind: egressKind(), steps: []step{{remote, ""}, {failedInside, ""}},
			wantIP: "203.0.113.3", wantSource: spec.EgressIPReported, wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantMsg:    []string{"the egress check from inside the instance with " + testEchoURL + " failed at ", "answered 502"},
			wantEvents: []string{"Warning EgressCheckFailed"}},
		"CheckFailedInsideKeepsTheBackendsFigure": {kind: egressKind(), steps: []step{{natFailed, ""}},
			wantIP: "203.0.113.9", wantSource: spec.EgressIPBackend, wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantMsg: []string{"from inside the instance", "answered 502"}, wantEvents: []string{"Warning EgressCheckFailed"}},
		"ReportedDiffersFromTheBackendsFigure": {kind: egressKind(), steps: []step{{natReported, ""}},
			wantIP: "203.0.113.9", wantSource: spec.EgressIPBackend, wantCond: reasonEgressDiffers, wantStatus: corev1.ConditionFalse,
			wantMsg:    []string{"the check from inside the instance saw 203.0.113.3", "but the backend says the instance's address is 203.0.113.9"},
			wantEvents: []string{"Warning EgressIPDiffers"}},
		"ReportedAsTheBackendsFigure": {kind: egressKind(), steps: []step{{natSame, ""}},
			wantIP: "203.0.113.9", wantSource: spec.EgressIPReported, wantCond: reasonEgressReported, wantStatus: corev1.ConditionTrue},
		// The condition says what a check found; the backend's figure
		// stays published.
		"CheckRemovedDropsTheCondition": {kind: egressKind(), steps: []step{{reserved, "203.0.113.9"}, {reserved, ""}}, lastNoCheck: true,
			wantIP: "203.0.113.9", wantSource: spec.EgressIPBackend, wantEvents: []string{"Normal EgressIPVerified"}},
		"NoCheckBackendFigure": {kind: testKind(nil), steps: []step{{reserved, "203.0.113.7"}},
			wantIP: "203.0.113.9", wantSource: spec.EgressIPBackend},
		"NoCheckNoFigure": {kind: testKind(nil), steps: []step{{running, "203.0.113.7"}}},
		// A report the instance still holds after its check was turned
		// off.
		"NoCheckAReportLeftBehind": {kind: testKind(nil), steps: []step{{remote, ""}}},
		"NoCheckAReportLeftBehindOverTheBackendsFigure": {kind: testKind(nil), steps: []step{{natReported, ""}},
			wantIP: "203.0.113.9", wantSource: spec.EgressIPBackend},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := &recorder{}
			e := newExternal(tc.kind, nil, nil)
			e.record = r
			var answer string
			// Each step a reconcile after the one before, once Squid's idle
			// connection from its check is gone.
			var elapsed time.Duration
			start := time.Now()
			checker := func() *squid.EgressChecker {
				return &squid.EgressChecker{Ask: func(_ context.Context, _ string, c proxy.EgressCheck) (string, error) {
					if answer == "" {
						return "", errors.New("refused")
					}
					return answer, nil
				}, Now: func() time.Time { return start.Add(elapsed) }}
			}
			e.egress = checker()
			cr := proxyResource()
			var inst proxy.Instance
			for i, s := range tc.steps {
				if i > 0 {
					elapsed += squid.IdleConnectionGap
				}
				if tc.restartAt > 0 && i == tc.restartAt {
					e.egress = checker()
				}
				answer, inst = s.answer, s.inst
				if tc.lastNoCheck && i == len(tc.steps)-1 {
					e.kind = testKind(nil)
				}
				req, err := e.request(context.Background(), cr)
				if err != nil {
					t.Fatal(err)
				}
				before := egressOf(cr.Observation())
				standingReport(&inst, req, false)
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
			if tc.wantCond == "" && slices.ContainsFunc(cr.Status.Conditions, func(c xpv2.Condition) bool { return c.Type == spec.TypeEgressVerified }) {
				t.Errorf("conditions %v; want no %s without a check", cr.Status.Conditions, spec.TypeEgressVerified)
			}
			for _, m := range tc.wantMsg {
				if strings.Count(c.Message, m) != 1 {
					t.Errorf("EgressVerified message %q; want it to say %q once", c.Message, m)
				}
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

// TestObserveAReportOfAFailedCheck: a proxy the provider cannot reach,
// whose own Squid answered the check from inside it but not with the
// echo's address (the echo down, a 502), is Ready on that answer; the
// condition says the check from inside failed and why, without quoting
// the answer, and the address reported before stays published. A report
// its Squid did not answer leaves it not Ready.
func TestObserveAReportOfAFailedCheck(t *testing.T) {
	ctx := context.Background()
	mem := proxytest.NewMemory("memory", testInstallation)
	e := newExternal(egressKind(), mem, nil)
	e.egress = &squid.EgressChecker{}
	ours(t, mem, e)
	cr := proxyResource()
	observe := func(status, body string) {
		t.Helper()
		line := fmt.Sprintf("%s %d %s %s\n", squid.ReportMarker, time.Now().Unix(), status, body)
		if err := mem.ReportEgress(proxytest.MemoryIDPrefix+testName, line); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Observe(ctx, cr); err != nil {
			t.Fatal(err)
		}
	}
	egress := xpv2.ConditionType(spec.TypeEgressVerified)

	observe("200", "203.0.113.3")
	if c := cr.GetCondition(egress); c.Reason != reasonEgressReported {
		t.Fatalf("EgressVerified %s %s %q after a report of 203.0.113.3; want Reported", c.Status, c.Reason, c.Message)
	}

	observe("502", "sentinel-guest-text")
	o := cr.Status.AtProvider
	if r := cr.GetCondition(xpv2.TypeReady); r.Status != corev1.ConditionTrue || !o.ProxyReachable {
		t.Errorf("Ready %s %q, proxyReachable %v; want True: Squid answered inside the instance", r.Status, r.Message, o.ProxyReachable)
	}
	c := cr.GetCondition(egress)
	if c.Status != corev1.ConditionFalse || c.Reason != reasonEgressFailed || !strings.Contains(c.Message, "the egress check from inside the instance") || !strings.Contains(c.Message, "answered 502") {
		t.Errorf("EgressVerified %s %s %q; want False CheckFailed, saying the check from inside failed with 502", c.Status, c.Reason, c.Message)
	}
	if strings.Contains(c.Message, "sentinel") {
		t.Errorf("EgressVerified quotes the instance's answer: %q", c.Message)
	}
	if o.EgressIP != "203.0.113.3" || o.EgressIPSource != spec.EgressIPReported {
		t.Errorf("egressIP %q (%s); want 203.0.113.3 Reported, kept", o.EgressIP, o.EgressIPSource)
	}

	observe("000", "")
	if r := cr.GetCondition(xpv2.TypeReady); r.Status == corev1.ConditionTrue || cr.Status.AtProvider.ProxyReachable {
		t.Errorf("Ready %s %q after a report that the instance's Squid did not answer; want not Ready", r.Status, r.Message)
	}
}

// TestRemoveCondition: every kind, of both scopes, loses the condition
// removeCondition names and keeps the others.
func TestRemoveCondition(t *testing.T) {
	egress := xpv2.ConditionType(spec.TypeEgressVerified)
	for _, cr := range []resource.Managed{
		&nsproxy.KVMProxy{}, &nsproxy.ProxmoxProxy{}, &nsproxy.GCPProxy{}, &nsproxy.PodProxy{},
		&clusterproxy.KVMProxy{}, &clusterproxy.ProxmoxProxy{}, &clusterproxy.GCPProxy{}, &clusterproxy.PodProxy{},
	} {
		cr.SetConditions(xpv2.Available(), egressCondition(corev1.ConditionTrue, reasonEgressVerified, "verified"))
		removeCondition(cr, egress)
		if c := cr.GetCondition(egress); c.Reason != "" {
			t.Errorf("%T: %s %s remains", cr, c.Type, c.Reason)
		}
		if c := cr.GetCondition(xpv2.TypeReady); c.Reason != xpv2.ReasonAvailable {
			t.Errorf("%T: Ready %s; want it kept", cr, c.Reason)
		}
	}
}

// TestAnEgressCheckDueSoonIsLookedAtWhenDue: a reconcile asks to be
// looked at again when the next check is due (retryAfter keeps that only
// when sooner than the poll), so that an interval shorter than the poll,
// or checks squid.IdleConnectionGap apart, are not stretched to polls.
func TestAnEgressCheckDueSoonIsLookedAtWhenDue(t *testing.T) {
	running := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: "10.0.0.5:3128"}
	for _, tc := range []struct {
		name string
		ago  time.Duration // how long ago, by the checker's clock, its check finished
		want time.Duration // the soon noted
	}{
		{"JustChecked", 0, squid.IdleConnectionGap},
		{"DueInFourSeconds", squid.IdleConnectionGap - 4*time.Second, 4 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			k := egressKind()
			k.Backend.Block = func(s *spec.ProviderConfigSpec) (Block, bool) {
				return Block{EgressCheck: &spec.EgressCheck{URL: testEchoURL, Interval: &metav1.Duration{Duration: time.Minute}}}, s.KVM != nil
			}
			e := newExternal(k, nil, nil)
			e.hints = newRetryHints(0)
			e.egress = &squid.EgressChecker{Ask: func(context.Context, string, proxy.EgressCheck) (string, error) { return "203.0.113.7", nil },
				Now: func() time.Time { return time.Now().Add(-tc.ago) }}
			cr := proxyResource()
			req, err := e.request(context.Background(), cr)
			if err != nil {
				t.Fatal(err)
			}
			inst := running
			setObservation(cr.Observation(), inst, req, nil)
			e.setEgress(context.Background(), cr, &inst, req, egressOf(cr.Observation()))
			if cr.Status.AtProvider.EgressIP != "203.0.113.7" {
				t.Fatalf("egressIP %q; want the check's address", cr.Status.AtProvider.EgressIP)
			}
			got, ok := e.hints.takeSoon(types.NamespacedName{Namespace: cr.GetNamespace(), Name: cr.GetName()})
			if !ok || got > tc.want || got < tc.want-time.Second {
				t.Errorf("looked at again in %v (noted %v); want about %v, when the next check is due", got, ok, tc.want)
			}
		})
	}
	// The shortest of a reconcile's notes counts, whichever came first.
	h := newRetryHints(0)
	mg := proxyResource()
	h.noteSoon(mg, 4*time.Second)
	h.noteSoon(mg, 10*time.Second)
	if d, _ := h.takeSoon(types.NamespacedName{Namespace: mg.GetNamespace(), Name: mg.GetName()}); d != 4*time.Second {
		t.Errorf("two notes, 4s then 10s: looked at again in %v; want 4s", d)
	}
}

// TestAMovedProxysCheckInFlight: while the check through a moved proxy
// (a pod on another node) is slower than a reconcile waits, the address
// checked through the old one is not published, and the resource is
// looked at again within the check's timeout, not at the next poll.
func TestAMovedProxysCheckInFlight(t *testing.T) {
	running := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: "10.0.0.5:3128"}
	moved := running
	moved.IP, moved.ProxyAddress = "10.1.0.7", "10.1.0.7:3128"
	e := newExternal(egressKind(), nil, nil)
	e.hints = newRetryHints(0)
	slow := make(chan struct{})
	t.Cleanup(func() { close(slow) })
	e.egress = &squid.EgressChecker{Wait: 10 * time.Millisecond, Timeout: 3 * time.Second, Ask: func(_ context.Context, addr string, _ proxy.EgressCheck) (string, error) {
		if addr == moved.ProxyAddress {
			<-slow
		}
		return "203.0.113.7", nil
	}}
	cr := proxyResource()
	key := types.NamespacedName{Namespace: cr.GetNamespace(), Name: cr.GetName()}
	observe := func(inst proxy.Instance) { t.Helper(); observeEgress(t, e, cr, inst) }
	observe(running)
	// The first check may outlast Wait too: look again until it answered.
	for i := 0; cr.Status.AtProvider.EgressIP == "" && i < 100; i++ {
		time.Sleep(10 * time.Millisecond)
		observe(running)
	}
	if o := cr.Status.AtProvider; o.EgressIP != "203.0.113.7" || o.EgressIPSource != spec.EgressIPVerified {
		t.Fatalf("egressIP %q (%s); want 203.0.113.7 Verified", o.EgressIP, o.EgressIPSource)
	}
	e.hints.takeSoon(key)

	observe(moved)
	o := cr.Status.AtProvider
	c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
	if o.EgressIP != "" || o.EgressIPSource != "" || c.Reason != reasonEgressPending {
		t.Errorf("the moved proxy's check in flight: egressIP %q (%s), EgressVerified %s %q; want no address, Checking", o.EgressIP, o.EgressIPSource, c.Reason, c.Message)
	}
	if d, ok := e.hints.takeSoon(key); !ok || d > 3*time.Second {
		t.Errorf("with the check in flight, looked at again in %v (noted: %v); want within the check's 3s timeout", d, ok)
	}
}

// TestAnEchoURLChangeKeepsNothingTheOldURLSaw: after the config names
// another echo URL (a team's echo replaced by the platform's), what the
// old URL saw is neither shown as the new URL's word nor kept when the
// new URL's check fails; the condition names the URL that answered.
func TestAnEchoURLChangeKeepsNothingTheOldURLSaw(t *testing.T) {
	const teamEcho, platformEcho = "http://echo.team.example/ip", "http://echo.platform.example/ip"
	url := teamEcho
	k := testKind(nil)
	k.Backend.Block = func(s *spec.ProviderConfigSpec) (Block, bool) {
		return Block{EgressCheck: &spec.EgressCheck{URL: url}}, s.KVM != nil
	}
	e := newExternal(k, nil, nil)
	var elapsed time.Duration
	start := time.Now()
	e.egress = &squid.EgressChecker{Ask: func(_ context.Context, _ string, c proxy.EgressCheck) (string, error) {
		if c.URL == teamEcho {
			return "203.0.113.7", nil
		}
		return "", errors.New("refused")
	}, Now: func() time.Time { return start.Add(elapsed) }}
	cr := proxyResource()
	running := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: "10.0.0.5:3128"}
	observe := func() (string, xpv2.Condition) {
		t.Helper()
		req, err := e.request(context.Background(), cr)
		if err != nil {
			t.Fatal(err)
		}
		inst := running
		before := egressOf(cr.Observation())
		setObservation(cr.Observation(), inst, req, nil)
		e.setEgress(context.Background(), cr, &inst, req, before)
		return cr.Status.AtProvider.EgressIP, cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
	}
	if ip, c := observe(); ip != "203.0.113.7" || c.Reason != reasonEgressVerified || !strings.HasPrefix(c.Message, teamEcho+" saw 203.0.113.7") {
		t.Fatalf("egressIP %q, EgressVerified %s %q; want 203.0.113.7 verified by %s", ip, c.Reason, c.Message, teamEcho)
	}

	url = platformEcho
	elapsed += 5 * time.Second // the new URL's check waits for Squid's idle connection to go
	if ip, c := observe(); ip != "" || strings.Contains(c.Message, "203.0.113.7") || c.Reason != reasonEgressPending || !strings.Contains(c.Message, platformEcho) {
		t.Errorf("right after the URL changed: egressIP %q, EgressVerified %s %q; want no address, Checking with %s", ip, c.Reason, c.Message, platformEcho)
	}
	elapsed += squid.IdleConnectionGap
	if ip, c := observe(); ip != "" || c.Reason != reasonEgressFailed || !strings.Contains(c.Message, platformEcho+" failed") {
		t.Errorf("the new URL's check failed: egressIP %q (%s), EgressVerified %s %q; want no address, CheckFailed naming %s", ip, cr.Status.AtProvider.EgressIPSource, c.Reason, c.Message, platformEcho)
	}
}

// observeEgress is one Observe's egress part for cr with inst: status as
// setObservation fills it, then setEgress with what status said before.
func observeEgress(t *testing.T, e *external[spec.KVMProxyParameters], cr *nsproxy.KVMProxy, inst proxy.Instance) {
	t.Helper()
	req, err := e.request(context.Background(), cr)
	if err != nil {
		t.Fatal(err)
	}
	before := egressOf(cr.Observation())
	standingReport(&inst, req, false)
	setObservation(cr.Observation(), inst, req, nil)
	e.setEgress(context.Background(), cr, &inst, req, before)
}

// TestARestartKeepsOnlyAnAddressTheSameURLSaw: after a provider restart
// (a checker with no memory) the address status holds stays published
// by a failed, pending or unreachable check only when the config still
// names the echo URL that saw it, as egressIPCheckedWith says; after the
// URL changed with the restart, or in a status that does not say, none
// is published until the URL named now answers.
func TestARestartKeepsOnlyAnAddressTheSameURLSaw(t *testing.T) {
	const oldEcho, newEcho = "http://echo.team.example/ip", "http://echo.platform.example/ip"
	running := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: "10.0.0.5:3128"}
	blip := running
	blip.ProxyReachable, blip.ProxyAddress = false, ""
	unreached := running
	unreached.ProxyAddress = ""
	failedInside := unreached
	failedInside.EgressFailure, failedInside.EgressCheckedAt = "the check through the instance's own Squid was answered 502", time.Now()
	remote := unreached
	remote.EgressIP, remote.EgressSource, remote.EgressCheckedAt = "203.0.113.7", proxy.EgressReported, time.Now()

	cases := map[string]struct {
		first      proxy.Instance // checked with oldEcho, before the restart
		after      proxy.Instance // observed after the restart
		url        string         // the config's URL after the restart
		hang       bool           // the check after the restart does not answer yet
		legacy     bool           // the status was written without egressIPCheckedWith
		wantIP     string
		wantWith   string
		wantReason xpv2.ConditionReason
	}{
		"SameURLFailedCheckKeeps":         {first: running, after: running, url: oldEcho, wantIP: "203.0.113.7", wantWith: oldEcho, wantReason: reasonEgressFailed},
		"OtherURLFailedCheckDrops":        {first: running, after: running, url: newEcho, wantReason: reasonEgressFailed},
		"SameURLPendingCheckKeeps":        {first: running, after: running, url: oldEcho, hang: true, wantIP: "203.0.113.7", wantWith: oldEcho, wantReason: reasonEgressPending},
		"OtherURLPendingCheckDrops":       {first: running, after: running, url: newEcho, hang: true, wantReason: reasonEgressPending},
		"SameURLProbeBlipKeeps":           {first: running, after: blip, url: oldEcho, wantIP: "203.0.113.7", wantWith: oldEcho, wantReason: reasonEgressVerified},
		"OtherURLProbeBlipDrops":          {first: running, after: blip, url: newEcho, wantReason: reasonEgressPending},
		"OtherURLUnreachableDrops":        {first: running, after: unreached, url: newEcho, wantReason: reasonEgressNoPath},
		"SameURLFailedReportKeeps":        {first: remote, after: failedInside, url: oldEcho, wantIP: "203.0.113.7", wantWith: oldEcho, wantReason: reasonEgressFailed},
		"OtherURLFailedReportDrops":       {first: remote, after: failedInside, url: newEcho, wantReason: reasonEgressFailed},
		"AStatusNotNamingItsURLKeepsNone": {first: running, after: running, url: oldEcho, legacy: true, wantReason: reasonEgressFailed},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			url := oldEcho
			k := testKind(nil)
			k.Backend.Block = func(s *spec.ProviderConfigSpec) (Block, bool) {
				return Block{EgressCheck: &spec.EgressCheck{URL: url}}, s.KVM != nil
			}
			e := newExternal(k, nil, nil)
			e.hints = newRetryHints(0)
			e.egress = &squid.EgressChecker{Ask: func(context.Context, string, proxy.EgressCheck) (string, error) { return "203.0.113.7", nil }}
			cr := proxyResource()
			observeEgress(t, e, cr, tc.first)
			if o := cr.Status.AtProvider; o.EgressIP != "203.0.113.7" || o.EgressIPCheckedWith != oldEcho {
				t.Fatalf("before the restart: egressIP %q checked with %q; want 203.0.113.7 with %s", o.EgressIP, o.EgressIPCheckedWith, oldEcho)
			}
			if tc.legacy {
				cr.Status.AtProvider.EgressIPCheckedWith = ""
			}

			url = tc.url
			hang := make(chan struct{})
			t.Cleanup(func() { close(hang) })
			e.egress = &squid.EgressChecker{Wait: 10 * time.Millisecond, Ask: func(context.Context, string, proxy.EgressCheck) (string, error) {
				if tc.hang {
					<-hang
				}
				return "", errors.New("refused")
			}}
			observeEgress(t, e, cr, tc.after)
			if !tc.hang {
				// The failed check answers within the checker's timeout.
				for i := 0; i < 100 && cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified)).Reason == reasonEgressPending; i++ {
					time.Sleep(10 * time.Millisecond)
					observeEgress(t, e, cr, tc.after)
				}
			}
			o := cr.Status.AtProvider
			c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
			got := struct{ IP, With, Reason string }{o.EgressIP, o.EgressIPCheckedWith, string(c.Reason)}
			want := struct{ IP, With, Reason string }{tc.wantIP, tc.wantWith, string(tc.wantReason)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("after the restart (%s): -want, +got:\n%s", c.Message, diff)
			}
		})
	}
}

// reportDriver is a driver whose Get changes what the wrapped driver
// reports (the instance's last start, the settings it runs).
type reportDriver struct {
	proxy.Driver
	mod func(*proxy.Instance)
}

func (d reportDriver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	inst, err := d.Driver.Get(ctx, ref)
	if err == nil {
		d.mod(&inst)
	}
	return inst, err
}

// TestAReportNotOfTheCurrentCheckDoesNotStand: a proxy the provider
// cannot reach, whose instance holds a report of its own egress check,
// is Ready on it and publishes its address only while the report is the
// instance's word on the settings the config names: not once the config
// names no check, not when it predates the instance's last start (an
// update's restart), and its address not while the instance runs other
// settings (an update pending, maybe of the echo URL).
func TestAReportNotOfTheCurrentCheckDoesNotStand(t *testing.T) {
	reported := time.Now().Add(-20 * time.Second).Truncate(time.Second)
	cases := map[string]struct {
		noCheck      bool
		mod          func(*proxy.Instance)
		wantReady    bool
		wantIP       string
		wantReason   xpv2.ConditionReason
		wantProgress string // in status.atProvider.progress
	}{
		"AReportOfThisStartStands": {mod: func(i *proxy.Instance) { i.StartedAt = reported.Add(-10 * time.Second) },
			wantReady: true, wantIP: "203.0.113.3", wantReason: reasonEgressReported},
		"ACheckTurnedOffLeavesNoReportStanding": {noCheck: true, mod: func(*proxy.Instance) {}},
		"AReportFromBeforeTheLastStartDoesNotStand": {mod: func(i *proxy.Instance) { i.StartedAt = reported.Add(15 * time.Second) },
			wantProgress: "predates the instance's last start"},
		"AReportOfOtherSettingsPublishesNoAddress": {mod: func(i *proxy.Instance) { i.SpecHash = "other-settings" },
			wantReady: true, wantReason: reasonEgressNoPath},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			mem := proxytest.NewMemory("memory", testInstallation)
			e := newExternal(egressKind(), reportDriver{Driver: mem, mod: tc.mod}, nil)
			e.egress = &squid.EgressChecker{}
			ours(t, mem, e)
			if tc.noCheck {
				e.kind = testKind(nil)
			}
			line := fmt.Sprintf("%s %d 200 203.0.113.3\n", squid.ReportMarker, reported.Unix())
			if err := mem.ReportEgress(proxytest.MemoryIDPrefix+testName, line); err != nil {
				t.Fatal(err)
			}
			cr := proxyResource()
			if _, err := e.Observe(ctx, cr); err != nil {
				t.Fatal(err)
			}
			o := cr.Status.AtProvider
			ready := cr.GetCondition(xpv2.TypeReady).Status == corev1.ConditionTrue
			c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
			got := struct {
				Ready, Reachable bool
				IP, Reason       string
			}{ready, o.ProxyReachable, o.EgressIP, string(c.Reason)}
			want := struct {
				Ready, Reachable bool
				IP, Reason       string
			}{tc.wantReady, tc.wantReady, tc.wantIP, string(tc.wantReason)}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("-want, +got (progress %q, EgressVerified %q):\n%s", o.Progress, c.Message, diff)
			}
			if !strings.Contains(o.Progress, tc.wantProgress) {
				t.Errorf("progress %q; want it to say %q", o.Progress, tc.wantProgress)
			}
		})
	}
}

// TestAnUpdateTakesNoReportOfTheSettingsBefore: the instance an Update
// returns may still hold the report its check made with the settings
// before (another echo URL): the Update publishes no address from it,
// and keeps one checked before only while the config names the URL that
// saw it.
func TestAnUpdateTakesNoReportOfTheSettingsBefore(t *testing.T) {
	const oldEcho, newEcho = "http://echo.team.example/ip", "http://echo.platform.example/ip"
	for name, tc := range map[string]struct {
		url    string
		wantIP string
	}{
		"AnotherURL": {url: newEcho},
		"TheSameURL": {url: oldEcho, wantIP: "203.0.113.3"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			url := oldEcho
			k := testKind(nil)
			k.Backend.Block = func(s *spec.ProviderConfigSpec) (Block, bool) {
				return Block{EgressCheck: &spec.EgressCheck{URL: url}}, s.KVM != nil
			}
			mem := proxytest.NewMemory("memory", testInstallation)
			e := newExternal(k, mem, nil)
			e.egress = &squid.EgressChecker{}
			ours(t, mem, e)
			line := fmt.Sprintf("%s %d 200 203.0.113.3\n", squid.ReportMarker, time.Now().Unix())
			if err := mem.ReportEgress(proxytest.MemoryIDPrefix+testName, line); err != nil {
				t.Fatal(err)
			}
			cr := proxyResource()
			if _, err := e.Observe(ctx, cr); err != nil {
				t.Fatal(err)
			}
			if o := cr.Status.AtProvider; o.EgressIP != "203.0.113.3" || o.EgressIPCheckedWith != oldEcho {
				t.Fatalf("before the update: egressIP %q with %q; want 203.0.113.3 Reported with %s", o.EgressIP, o.EgressIPCheckedWith, oldEcho)
			}
			url = tc.url
			cr.Spec.ForProvider.Proxy.AllowedClientCIDRs = []string{"10.1.0.0/16"}
			if _, err := e.Update(ctx, cr); err != nil {
				t.Fatal(err)
			}
			o := cr.Status.AtProvider
			if o.EgressIP != tc.wantIP || (tc.wantIP != "" && o.EgressIPCheckedWith != oldEcho) {
				t.Errorf("after the update: egressIP %q (%s) with %q; want %q", o.EgressIP, o.EgressIPSource, o.EgressIPCheckedWith, tc.wantIP)
			}
		})
	}
}
