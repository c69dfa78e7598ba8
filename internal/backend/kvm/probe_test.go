package kvm

import (
	"context"
	"net"
	"testing"
)

// TestProbeHTTP_needsTheProvidersSquid: an answer counts only when it
// carries the identity of Squid with internal/squid's config.
func TestProbeHTTP_needsTheProvidersSquid(t *testing.T) {
	for _, tc := range []struct {
		answer string
		want   bool
	}{
		{"HTTP/1.1 400 Bad Request\r\nServer: squid\r\nX-Cache: MISS from egress-proxy\r\nConnection: close\r\n\r\nbody", true},
		{"HTTP/1.1 400 Bad Request\r\nServer: squid\r\nX-Cache: MISS from team-a-web-1234\r\n\r\n", false},
		{"SSH-2.0-OpenSSH_9.2\r\n", false},
		{"", false},
	} {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 64)
			_, _ = c.Read(buf)
			_, _ = c.Write([]byte(tc.answer))
			_ = c.Close()
		}()
		if got := probeHTTP(context.Background(), ln.Addr().String()); got != tc.want {
			t.Errorf("probe of %q = %t; want %t", tc.answer, got, tc.want)
		}
		_ = ln.Close()
	}
	if probeHTTP(context.Background(), "127.0.0.1:1") {
		t.Error("a closed port answered")
	}
}
