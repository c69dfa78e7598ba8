package external

import (
	"regexp"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	nsproxy "github.com/egressproxy/provider-egressproxy/apis/namespaced/proxy/v1alpha1"
)

var dnsLabel = regexp.MustCompile(`^[a-z]([-a-z0-9]*[a-z0-9])?$`)

func TestInstanceName(t *testing.T) {
	obj := func(ns, name string) *nsproxy.PodProxy {
		return &nsproxy.PodProxy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	cases := map[string]struct {
		ns, name   string
		wantPrefix string
	}{
		"Namespaced":             {"team-payments", "payments-egress", "team-payments-payments-egress-"},
		"ClusterScoped":          {"", "shared", "shared-"},
		"DotsBecomeDashes":       {"", "a.b.c", "a-b-c-"},
		"LeadingDigitGetsLetter": {"", "1proxy", "p1proxy-"},
		"LongIsCut":              {strings.Repeat("n", 63), strings.Repeat("x", 63), strings.Repeat("n", 54) + "-"},
	}
	seen := map[string]string{}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := InstanceName(obj(tc.ns, tc.name))
			if !strings.HasPrefix(got, tc.wantPrefix) {
				t.Errorf("InstanceName(%q, %q) = %q, want prefix %q", tc.ns, tc.name, got, tc.wantPrefix)
			}
			if len(got) > 63 || !dnsLabel.MatchString(got) {
				t.Errorf("InstanceName(%q, %q) = %q: not a DNS label of at most 63 characters", tc.ns, tc.name, got)
			}
			if again := InstanceName(obj(tc.ns, tc.name)); again != got {
				t.Errorf("not deterministic: %q then %q", got, again)
			}
		})
		seen[name] = InstanceName(obj(tc.ns, tc.name))
	}
	// Identities that read alike must not collide.
	if InstanceName(obj("a-b", "c")) == InstanceName(obj("a", "b-c")) {
		t.Error(`"a-b/c" and "a/b-c" share a name`)
	}
	if InstanceName(obj("", "team-x")) == InstanceName(obj("team", "x")) {
		t.Error("a cluster-scoped and a namespaced resource share a name")
	}
}

func TestPick(t *testing.T) {
	cfg := &Config{Name: "ClusterProviderConfig home"}
	cases := map[string]struct {
		key, recorded string
		keys          []string
		want          string
		wantErr       string
	}{
		"Given":            {"b", "", []string{"a", "b"}, "b", ""},
		"OnlyOneIsDefault": {"", "", []string{"a"}, "a", ""},
		"SeveralNeedAKey":  {"", "", []string{"b", "a"}, "", "spec.forProvider.host is required: ClusterProviderConfig home has several (a, b) (the field cannot be added to this resource: delete it and create it again with one of those; no instance was made)"},
		"UnknownKey":       {"c", "", []string{"b", "a"}, "", `spec.forProvider.host: "c" is not in ClusterProviderConfig home: want one of a, b (the field cannot be changed on this resource: delete it and create it again with one of those; no instance was made)`},
		"EmptyCatalogue":   {"", "", nil, "", "spec.forProvider.host: ClusterProviderConfig home has none to choose from"},
		// A proxy made when the config had one key keeps it when the
		// config gains another.
		"RecordedWhenEmpty":      {"", "a", []string{"b", "a"}, "a", ""},
		"GivenBeforeRecorded":    {"b", "a", []string{"b", "a"}, "b", ""},
		"RecordedKeyGoneIsOnly":  {"", "a", []string{"b"}, "b", ""},
		"RecordedKeyGoneSeveral": {"", "a", []string{"b", "c"}, "", "spec.forProvider.host is required: ClusterProviderConfig home has several (b, c)"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Pick("spec.forProvider.host", tc.key, tc.recorded, tc.keys, cfg)
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
			if (err == nil) != (tc.wantErr == "") || (err != nil && err.Error() != tc.wantErr) {
				t.Errorf("error %v, want %q", err, tc.wantErr)
			}
		})
	}
}
