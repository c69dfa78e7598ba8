package kubelettest

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestSubstitute(t *testing.T) {
	conf := "http_port 3128\nvisible_hostname egress-proxy\nauth_param basic program /usr/lib/squid/basic_ncsa_auth /etc/squid-egress/htpasswd\nacl clients src 10.0.0.0/8\n"
	want := "http_port 127.1.0.7:3128\nvisible_hostname egress-proxy\nauth_param basic program /usr/lib/squid/basic_ncsa_auth /tmp/pod/htpasswd\nacl clients src 10.0.0.0/8\n"
	if diff := cmp.Diff(want, Substitute(conf, "/tmp/pod", "127.1.0.7")); diff != "" {
		t.Errorf("Substitute (-want +got):\n%s", diff)
	}
	tls := "https_port 3128 tls-cert=/etc/squid-egress/tls.crt tls-key=/etc/squid-egress/tls.key\n"
	if diff := cmp.Diff("https_port 127.1.0.7:3128 tls-cert=/tmp/pod/tls.crt tls-key=/tmp/pod/tls.key\n", Substitute(tls, "/tmp/pod", "127.1.0.7")); diff != "" {
		t.Errorf("Substitute of https_port (-want +got):\n%s", diff)
	}
}

func TestAllocateSkipsNetworkAndBroadcast(t *testing.T) {
	k := &Kubelet{next: 1<<16 + 0xfe}
	got := []string{k.allocate(), k.allocate()}
	if diff := cmp.Diff([]string{"127.1.0.254", "127.1.1.1"}, got); diff != "" {
		t.Errorf("addresses (-want +got):\n%s", diff)
	}
}
