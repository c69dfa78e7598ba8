package external

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestConnectionDetails(t *testing.T) {
	const np = "localhost,127.0.0.1,::1,.svc,.cluster.local"
	plain := proxy.Request{Proxy: proxy.Settings{Port: 3128}}
	auth := proxy.Request{Proxy: proxy.Settings{Port: 8080, Auth: proxy.Auth{Enabled: true, Username: "payments", Password: "p@ss:w/rd"}}}
	withTLS := auth
	// The key never goes to the connection Secret.
	withTLS.Proxy.TLS = &proxy.TLS{Cert: "the chain", Key: "the key", CA: "the CA"}
	cases := map[string]struct {
		inst    proxy.Instance
		req     proxy.Request
		noProxy []string
		want    map[string]string
	}{
		// Keys without a value: removed from the Secret, which is not
		// made for them.
		"NoAddressYet": {inst: proxy.Instance{State: proxy.StateProvisioning}, req: plain, want: map[string]string{"egressIP": "", "egressIPs": ""}},
		"AddressOnly": {inst: proxy.Instance{IP: "10.0.0.5"}, req: plain, want: map[string]string{
			"url": "http://10.0.0.5:3128", "endpoint": "10.0.0.5:3128", "host": "10.0.0.5", "port": "3128",
			"HTTP_PROXY": "http://10.0.0.5:3128", "HTTPS_PROXY": "http://10.0.0.5:3128", "http_proxy": "http://10.0.0.5:3128", "https_proxy": "http://10.0.0.5:3128",
			"NO_PROXY": np, "no_proxy": np,
		}},
		"AuthEgressIPAndExtraNoProxy": {inst: proxy.Instance{IP: "10.0.0.5", EgressIP: "203.0.113.7"}, req: auth, noProxy: []string{".corp.example", "localhost", " 10.0.0.0/8 "},
			want: map[string]string{
				"url": "http://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080", "endpoint": "10.0.0.5:8080", "host": "10.0.0.5", "port": "8080",
				"username": "payments", "password": "p@ss:w/rd",
				"HTTP_PROXY": "http://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080", "HTTPS_PROXY": "http://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080",
				"http_proxy": "http://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080", "https_proxy": "http://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080",
				"NO_PROXY": np + ",.corp.example,10.0.0.0/8", "no_proxy": np + ",.corp.example,10.0.0.0/8", "egressIP": "203.0.113.7", "egressIPs": "203.0.113.7",
			}},
		"ServiceName": {inst: proxy.Instance{IP: "10.96.0.10", Host: "p-1.egress.svc"}, req: plain, want: map[string]string{
			"url": "http://p-1.egress.svc:3128", "endpoint": "p-1.egress.svc:3128", "host": "p-1.egress.svc", "port": "3128",
			"HTTP_PROXY": "http://p-1.egress.svc:3128", "HTTPS_PROXY": "http://p-1.egress.svc:3128", "http_proxy": "http://p-1.egress.svc:3128", "https_proxy": "http://p-1.egress.svc:3128",
			"NO_PROXY": np, "no_proxy": np,
		}},
		"TLS": {inst: proxy.Instance{IP: "10.0.0.5"}, req: withTLS, want: map[string]string{
			"url": "https://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080", "endpoint": "10.0.0.5:8080", "host": "10.0.0.5", "port": "8080",
			"username": "payments", "password": "p@ss:w/rd",
			"HTTP_PROXY": "https://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080", "HTTPS_PROXY": "https://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080",
			"http_proxy": "https://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080", "https_proxy": "https://payments:p%40ss%3Aw%2Frd@10.0.0.5:8080",
			"NO_PROXY": np, "no_proxy": np, "ca.crt": "the CA",
		}},
		"IPv6": {inst: proxy.Instance{IP: "2001:db8::5"}, req: plain, want: map[string]string{
			"url": "http://[2001:db8::5]:3128", "endpoint": "[2001:db8::5]:3128", "host": "2001:db8::5", "port": "3128",
			"HTTP_PROXY": "http://[2001:db8::5]:3128", "HTTPS_PROXY": "http://[2001:db8::5]:3128", "http_proxy": "http://[2001:db8::5]:3128", "https_proxy": "http://[2001:db8::5]:3128",
			"NO_PROXY": np, "no_proxy": np,
		}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got map[string]string
			if d := connectionDetails(tc.inst, tc.req, tc.noProxy); d != nil {
				got = map[string]string{}
				for k, v := range d {
					got[k] = string(v)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("connectionDetails (-want +got):\n%s", diff)
			}
		})
	}
}
