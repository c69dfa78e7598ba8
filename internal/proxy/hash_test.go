package proxy

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// legacy is the HashInput of an extension in the shape of the per-kind
// block the contract carried before extensions, as the gcp and kubernetes
// backends' extensions give it.
type legacy struct {
	AddressType    string
	RetainAddress  bool
	ManageFirewall bool
	ServiceType    string
}

func (l legacy) HashInput() any { return l }

// TestHashIsStable pins Hash to the digests it gave at each RenderVersion
// (those of version 2 from before the per-kind block left the contract):
// a change here makes every existing instance read as changed, and so be
// updated once; raise RenderVersion for that, and pin its digests here.
// The digests of earlier versions never change: RenderedEarlier finds
// instances by them.
func TestHashIsStable(t *testing.T) {
	base := Request{Name: "n", Mark: Mark{UID: "u", InstallationID: "i"}, Placement: Placement{Location: "zone-a", MachineType: "small", Image: "debian"},
		Proxy:     Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}, AllowedPorts: []int32{443}, Auth: Auth{Enabled: true, Username: "proxy", Password: "pw"}},
		CloudInit: "secret", SecretDigest: "digest"}
	with := func(e Extension) Request { r := base; r.Extension = e; return r }
	cases := map[string]struct {
		req  Request
		want map[int]string // by RenderVersion
	}{
		"NoExtension":      {req: base, want: map[int]string{2: "e39ed18a4acc7296", 3: "04ade1111cb4ab16"}},
		"EmptyLegacyBlock": {req: with(legacy{}), want: map[int]string{2: "e39ed18a4acc7296", 3: "04ade1111cb4ab16"}},
		"GCPExposure":      {req: with(legacy{AddressType: "Static", RetainAddress: true, ManageFirewall: true}), want: map[int]string{2: "9384b65166624d06", 3: "62cef5fc233e6828"}},
		"PodService":       {req: with(legacy{ServiceType: "LoadBalancer"}), want: map[int]string{2: "74cfc763a118e988", 3: "0733242935ff8be8"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if _, ok := tc.want[RenderVersion]; !ok {
				t.Fatalf("no digest pinned for RenderVersion %d: pin Hash's digest of this request", RenderVersion)
			}
			got := map[int]string{}
			for v := range tc.want {
				got[v] = HashAt(tc.req, v)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Hash(...) by RenderVersion: -want, +got:\n%s", diff)
			}
			if h := Hash(tc.req); h != tc.want[RenderVersion] {
				t.Errorf("Hash(...) = %s, want the digest of RenderVersion %d, %s", h, RenderVersion, tc.want[RenderVersion])
			}
		})
	}
}

// TestRenderedEarlier: an instance whose stored hash is the same request's
// at an earlier RenderVersion was made by a provider that rendered
// differently; one made from another request, or at this version, was not.
func TestRenderedEarlier(t *testing.T) {
	req := Request{Name: "web", Proxy: Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}}
	other := req
	other.Proxy.Port = 8080
	cases := map[string]struct {
		stored string
		want   bool
	}{
		"Version1":              {stored: HashAt(req, 1), want: true},
		"PreviousVersion":       {stored: HashAt(req, RenderVersion-1), want: true},
		"ThisVersion":           {stored: Hash(req), want: false},
		"AnotherRequestBefore":  {stored: HashAt(other, RenderVersion-1), want: false},
		"AnotherRequestNow":     {stored: Hash(other), want: false},
		"NoHashStored":          {stored: "", want: false},
		"NextVersionIsNotEarly": {stored: HashAt(req, RenderVersion+1), want: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := RenderedEarlier(tc.stored, req); got != tc.want {
				t.Errorf("RenderedEarlier(%q, req) = %v, want %v", tc.stored, got, tc.want)
			}
		})
	}
}

// TestHashIgnoresIdentityAndSecrets: name, mark, password and cloud-init
// never change the digest (secrets enter it only through SecretDigest).
func TestHashIgnoresIdentityAndSecrets(t *testing.T) {
	a := Request{Name: "a", Mark: Mark{UID: "1"}, Proxy: Settings{Auth: Auth{Password: "x"}}, CloudInit: "c1"}
	b := Request{Name: "b", Mark: Mark{UID: "2"}, Proxy: Settings{Auth: Auth{Password: "y"}, AllowedPorts: []int32{}}, CloudInit: "c2", Labels: map[string]string{}}
	if Hash(a) != Hash(b) {
		t.Errorf("Hash differs for requests differing only in identity, secrets and empty lists")
	}
	b.SecretDigest = "changed"
	if Hash(a) == Hash(b) {
		t.Errorf("Hash is the same although SecretDigest changed")
	}
}

// TestHashCarriesTheRenderVersion: an instance made by a provider that
// rendered differently (version 1 hashed the request alone) reads as not
// up to date, so the provider that raised RenderVersion updates it once,
// and a request hashes the same every time.
func TestHashCarriesTheRenderVersion(t *testing.T) {
	req := Request{Name: "web", Proxy: Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}}
	b, err := json.Marshal(hashInput{Proxy: req.Proxy, Extension: noExtension}) // what version 1 marshalled
	if err != nil {
		t.Fatal(err)
	}
	v1 := sha256.Sum256(b)
	if got, old := Hash(req), hex.EncodeToString(v1[:])[:16]; got == old {
		t.Errorf("Hash = %s, the version 1 hash: instances rendered before version %d would not be updated", got, RenderVersion)
	}
	again := req
	again.Proxy.AllowedPorts = []int32{} // empty and nil mean the same
	if a, b := Hash(req), Hash(again); a != b {
		t.Errorf("Hash = %s, then %s for the same request", a, b)
	}
}

// TestHashOfTLS: the proxy's certificate changes the digest, its key does
// not (it enters through SecretDigest), and neither key nor certificate
// appears in what is printed of the settings.
func TestHashOfTLS(t *testing.T) {
	const key = "-----BEGIN PRIVATE KEY-----\nsentinel-tls-key\n-----END PRIVATE KEY-----\n"
	plain := Request{Name: "web", Proxy: Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}}
	withTLS := plain
	withTLS.Proxy.TLS = &TLS{Cert: "cert-1", Key: key, CA: "ca"}
	if Hash(plain) == Hash(withTLS) {
		t.Errorf("Hash is the same with and without TLS")
	}
	otherKey := withTLS
	otherKey.Proxy.TLS = &TLS{Cert: "cert-1", Key: "another key", CA: "ca"}
	if Hash(withTLS) != Hash(otherKey) {
		t.Errorf("Hash changed with the key alone: the key must enter only through SecretDigest")
	}
	renewed := withTLS
	renewed.Proxy.TLS = &TLS{Cert: "cert-2", Key: key, CA: "ca"}
	if Hash(withTLS) == Hash(renewed) {
		t.Errorf("Hash is the same for a renewed certificate: the proxy would not be updated")
	}
	if withTLS.Proxy.TLS.Key != key {
		t.Errorf("Hash changed the request's key")
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s"} {
		if s := fmt.Sprintf(verb, *withTLS.Proxy.TLS); strings.Contains(s, "sentinel-tls-key") {
			t.Errorf("%s of a TLS prints the key: %s", verb, s)
		}
	}
}
