package external

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestSetEgressReplicas: a proxy whose replicas the provider reaches one
// by one (a PodProxy of several pods) has the check sent through each,
// and every address seen published, sorted, in status and in the
// connection Secret; a replica not yet checked keeps what was verified; a
// new set of addresses is a change.
func TestSetEgressReplicas(t *testing.T) {
	replicas := func(addrs ...string) proxy.Instance {
		inst := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: addrs[0]}
		for i, a := range addrs {
			inst.Replicas = append(inst.Replicas, proxy.Replica{Name: "pod-" + string(rune('a'+i)), Node: "node-" + string(rune('a'+i)), ProxyAddress: a})
		}
		if len(addrs) == 1 {
			inst.Replicas = nil
		}
		return inst
	}
	// What the echo sees through each pod: the node it stands on.
	seenThrough := map[string]string{"10.1.0.5:3128": "203.0.113.20", "10.1.1.6:3128": "203.0.113.10", "10.1.2.7:3128": "203.0.113.10"}

	type step struct {
		inst proxy.Instance
		down string // a replica's address whose check fails
	}
	cases := map[string]struct {
		steps      []step
		wantIPs    []string
		wantCond   xpv2.ConditionReason
		wantStatus corev1.ConditionStatus
		wantEvents []string
		wantInMsg  string
	}{
		"TwoNodesTwoAddresses": {steps: []step{{inst: replicas("10.1.0.5:3128", "10.1.1.6:3128")}},
			wantIPs: []string{"203.0.113.10", "203.0.113.20"}, wantCond: reasonEgressVerified, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified"}, wantInMsg: "saw 203.0.113.10, 203.0.113.20 through the proxy's replicas"},
		"TwoPodsOneAddress": {steps: []step{{inst: replicas("10.1.1.6:3128", "10.1.2.7:3128")}},
			wantIPs: []string{"203.0.113.10"}, wantCond: reasonEgressVerified, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified"}, wantInMsg: "saw 203.0.113.10 through the proxy at"},
		"ScaledUpOntoAnotherNode": {steps: []step{{inst: replicas("10.1.1.6:3128")}, {inst: replicas("10.1.0.5:3128", "10.1.1.6:3128")}},
			wantIPs: []string{"203.0.113.10", "203.0.113.20"}, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressIPChanged"}, wantInMsg: "changed from 203.0.113.10 to 203.0.113.10, 203.0.113.20"},
		"ScaledDown": {steps: []step{{inst: replicas("10.1.0.5:3128", "10.1.1.6:3128")}, {inst: replicas("10.1.1.6:3128")}},
			wantIPs: []string{"203.0.113.10"}, wantCond: reasonEgressChanged, wantStatus: corev1.ConditionTrue,
			wantEvents: []string{"Normal EgressIPVerified", "Warning EgressIPChanged"}, wantInMsg: "changed from 203.0.113.10, 203.0.113.20 to 203.0.113.10"},
		"OneReplicaFailsFirst": {steps: []step{{inst: replicas("10.1.0.5:3128", "10.1.1.6:3128"), down: "10.1.0.5:3128"}},
			wantCond: reasonEgressFailed, wantStatus: corev1.ConditionFalse,
			wantEvents: []string{"Warning EgressCheckFailed"}, wantInMsg: "through replica pod-a: refused"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			r := &recorder{}
			e := newExternal(egressKind(), nil, nil)
			e.record = r
			var mu sync.Mutex
			var down string
			var asked []string
			e.egress = &squid.EgressChecker{Ask: func(_ context.Context, addr string, _ proxy.EgressCheck) (string, error) {
				mu.Lock()
				defer mu.Unlock()
				asked = append(asked, addr)
				if addr == down {
					return "", errors.New("refused")
				}
				return seenThrough[addr], nil
			}}
			cr := proxyResource()
			var inst proxy.Instance
			var req proxy.Request
			for _, s := range tc.steps {
				inst, down = s.inst, s.down
				var err error
				if req, err = e.request(context.Background(), cr); err != nil {
					t.Fatal(err)
				}
				before := egressOf(cr.Observation())
				setObservation(cr.Observation(), inst, req, nil)
				e.setEgress(context.Background(), cr, &inst, req, before)
			}
			o := cr.Status.AtProvider
			wantIP := ""
			if len(tc.wantIPs) > 0 {
				wantIP = tc.wantIPs[0]
			}
			if o.EgressIP != wantIP || !cmp.Equal(o.EgressIPs, tc.wantIPs, cmpopts.EquateEmpty()) {
				t.Errorf("egressIP %q, egressIPs %v; want %q, %v", o.EgressIP, o.EgressIPs, wantIP, tc.wantIPs)
			}
			d := connectionDetails(inst, req, nil)
			if string(d[spec.ConnectionEgressIP]) != wantIP || string(d[spec.ConnectionEgressIPs]) != strings.Join(tc.wantIPs, ",") {
				t.Errorf("connection Secret egressIP %q, egressIPs %q; want %q, %q", d[spec.ConnectionEgressIP], d[spec.ConnectionEgressIPs], wantIP, strings.Join(tc.wantIPs, ","))
			}
			c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
			if c.Reason != tc.wantCond || c.Status != tc.wantStatus || !strings.Contains(c.Message, tc.wantInMsg) {
				t.Errorf("EgressVerified %s %s %q; want %s %s containing %q", c.Status, c.Reason, c.Message, tc.wantStatus, tc.wantCond, tc.wantInMsg)
			}
			if diff := cmp.Diff(tc.wantEvents, r.reasons, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("events: -want, +got:\n%s", diff)
			}
			for _, rep := range inst.Replicas {
				if !strings.Contains(strings.Join(asked, " "), rep.ProxyAddress) {
					t.Errorf("no check through replica %s at %s (asked %v)", rep.Name, rep.ProxyAddress, asked)
				}
			}
		})
	}
}

// TestForgetEgressForgetsEveryReplica: a proxy that goes leaves no check
// of any of its replicas behind.
func TestForgetEgressForgetsEveryReplica(t *testing.T) {
	e := newExternal(egressKind(), nil, nil)
	var mu sync.Mutex
	n := 0
	e.egress = &squid.EgressChecker{Ask: func(context.Context, string, proxy.EgressCheck) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		n++
		return "203.0.113.10", nil
	}}
	cr := proxyResource()
	req, err := e.request(context.Background(), cr)
	if err != nil {
		t.Fatal(err)
	}
	inst := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: "10.1.0.5:3128",
		Replicas: []proxy.Replica{{Name: "a", ProxyAddress: "10.1.0.5:3128"}, {Name: "b", ProxyAddress: "10.1.1.6:3128"}, {Name: "c", ProxyAddress: "10.1.2.7:3128"}}}
	check := func() {
		i := inst
		e.setEgress(context.Background(), cr, &i, req, egressOf(cr.Observation()))
	}
	check()
	check() // cached: no new check
	if n != 3 {
		t.Fatalf("%d checks for 3 replicas, twice within the interval; want 3", n)
	}
	e.forgetEgress(cr)
	check()
	if n != 6 {
		t.Errorf("%d checks after the proxy was forgotten; want 6: every replica's result forgotten", n)
	}
}

// TestARestartKeepsNoAddressOfReplacedReplicas: after a provider restart
// (a checker with no memory), a failed check through a proxy's replicas
// keeps the addresses checked before only when it goes through the same
// replicas: pods replaced behind the same Service (on other nodes, while
// the provider was down) may leave from addresses none of the old ones
// did, as the checker would have said (Moved) without the restart.
func TestARestartKeepsNoAddressOfReplacedReplicas(t *testing.T) {
	replicas := func(addrs ...string) proxy.Instance {
		inst := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.96.0.10", ProxyReachable: true, ProxyAddress: addrs[0]}
		for i, a := range addrs {
			inst.Replicas = append(inst.Replicas, proxy.Replica{Name: "pod-" + string(rune('a'+i)), ProxyAddress: a})
		}
		return inst
	}
	for name, tc := range map[string]struct {
		after   proxy.Instance
		wantIPs []string
	}{
		"TheSameReplicas":     {after: replicas("10.1.1.7:3128", "10.1.1.6:3128"), wantIPs: []string{"203.0.113.10"}},
		"ReplicasReplaced":    {after: replicas("10.1.2.8:3128", "10.1.2.9:3128")},
		"AReplicaOnANewNode":  {after: replicas("10.1.1.6:3128", "10.1.2.9:3128")},
		"ScaledUpOntoNewNode": {after: replicas("10.1.1.6:3128", "10.1.1.7:3128", "10.1.2.9:3128")},
	} {
		t.Run(name, func(t *testing.T) {
			e := newExternal(egressKind(), nil, nil)
			e.egress = &squid.EgressChecker{Ask: func(context.Context, string, proxy.EgressCheck) (string, error) { return "203.0.113.10", nil }}
			cr := proxyResource()
			observeEgress(t, e, cr, replicas("10.1.1.6:3128", "10.1.1.7:3128"))
			if got := cr.Status.AtProvider.EgressIPs; !cmp.Equal(got, []string{"203.0.113.10"}) {
				t.Fatalf("before the restart: egressIPs %v; want [203.0.113.10]", got)
			}
			e.egress = &squid.EgressChecker{Ask: func(context.Context, string, proxy.EgressCheck) (string, error) { return "", errors.New("refused") }}
			observeEgress(t, e, cr, tc.after)
			o := cr.Status.AtProvider
			c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
			if !cmp.Equal(o.EgressIPs, tc.wantIPs, cmpopts.EquateEmpty()) || c.Reason != reasonEgressFailed {
				t.Errorf("after the restart: egressIPs %v, EgressVerified %s %q; want %v, CheckFailed", o.EgressIPs, c.Reason, c.Message, tc.wantIPs)
			}
		})
	}
}
