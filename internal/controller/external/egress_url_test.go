package external

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	xpv2 "github.com/crossplane/crossplane/apis/v2/core/v2"
	"github.com/google/go-cmp/cmp"

	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestEgressConditionShowsNoCredentialOfTheURL: a config stored before
// admission refused it may name an echo URL with user info or a query
// (a password, a token). The driver refuses to render it, but every
// Observe still fills the EgressVerified condition, which a namespace's
// users read (on a ClusterProviderConfig, every tenant): its message
// names the field instead of quoting such a URL, whichever branch wrote
// it.
func TestEgressConditionShowsNoCredentialOfTheURL(t *testing.T) {
	const clean = "http://echo.example/ip"
	running := proxy.Instance{Name: testName, State: proxy.StateRunning, IP: "10.0.0.5", ProxyReachable: true, ProxyAddress: "10.0.0.5:3128"}
	blip := running
	blip.ProxyReachable, blip.ProxyAddress = false, ""
	failedInside := running
	failedInside.ProxyAddress = ""
	failedInside.EgressFailure, failedInside.EgressCheckedAt = "the check through the instance's own Squid was answered 502", time.Now()

	cases := map[string]struct {
		url        string
		after      proxy.Instance
		hang       bool
		wantReason xpv2.ConditionReason
	}{
		"UserInfoCheckFails":        {url: "http://probe:s3cret@echo.example/ip", after: running, wantReason: reasonEgressFailed},
		"UserInfoCheckPending":      {url: "http://probe:s3cret@echo.example/ip", after: running, hang: true, wantReason: reasonEgressPending},
		"UserInfoProbeBlip":         {url: "http://probe:s3cret@echo.example/ip", after: blip, wantReason: reasonEgressPending},
		"UserInfoReportFailed":      {url: "http://probe:s3cret@echo.example/ip", after: failedInside, wantReason: reasonEgressFailed},
		"QueryTokenCheckFails":      {url: "http://echo.example/ip?token=s3cret", after: running, wantReason: reasonEgressFailed},
		"FragmentTokenCheckPending": {url: "http://echo.example/ip#s3cret", after: running, hang: true, wantReason: reasonEgressPending},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			url := clean
			k := testKind(nil)
			k.Backend.Block = func(s *spec.ProviderConfigSpec) (Block, bool) {
				return Block{EgressCheck: &spec.EgressCheck{URL: url}}, s.KVM != nil
			}
			e := newExternal(k, nil, nil)
			e.hints = newRetryHints(0)
			e.egress = &squid.EgressChecker{Ask: func(context.Context, string, proxy.EgressCheck) (string, error) { return "203.0.113.7", nil }}
			cr := proxyResource()
			observeEgress(t, e, cr, running)

			url = tc.url
			hang := make(chan struct{})
			t.Cleanup(func() { close(hang) })
			e.egress = &squid.EgressChecker{Wait: 10 * time.Millisecond, Ask: func(_ context.Context, _ string, c proxy.EgressCheck) (string, error) {
				if tc.hang {
					<-hang
				}
				refuse := func(context.Context, string, string) (net.Conn, error) { return nil, errors.New("refused") }
				_, err := squid.AskEgress(context.Background(), refuse, "10.0.0.5:3128", c)
				return "", err
			}}
			observeEgress(t, e, cr, tc.after)
			if !tc.hang {
				for i := 0; i < 100 && cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified)).Reason == reasonEgressPending; i++ {
					time.Sleep(10 * time.Millisecond)
					observeEgress(t, e, cr, tc.after)
				}
			}
			c := cr.GetCondition(xpv2.ConditionType(spec.TypeEgressVerified))
			got := struct {
				Reason          string
				QuotesSecret    bool
				NamesTheField   bool
				CheckedWithSeen bool
			}{string(c.Reason), strings.Contains(c.Message, "s3cret"), strings.Contains(c.Message, "egressCheck.url"), strings.Contains(cr.Status.AtProvider.EgressIPCheckedWith, "s3cret")}
			want := got
			want.Reason, want.QuotesSecret, want.NamesTheField, want.CheckedWithSeen = string(tc.wantReason), false, true, false
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("EgressVerified %q: -want, +got:\n%s", c.Message, diff)
			}
		})
	}
}
