package proxmox_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox"
	"github.com/egressproxy/provider-egressproxy/internal/backend/proxmox/pvetest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Sentinel secrets: they must appear in no error, instance or log line.
const (
	sentinelSecret = "S3NT1NEL-7f3a9c1e-token-secret"
	sentinelToken  = "egress@pve!provider=" + sentinelSecret
	sentinelCA     = "-----BEGIN CERTIFICATE-----\nS3NT1NEL-ca-body-q8w7e6r5\n-----END CERTIFICATE-----\n"
)

func assertNoSentinel(t *testing.T, where, text string) {
	t.Helper()
	for _, s := range []string{sentinelSecret, "S3NT1NEL-ca-body"} {
		if strings.Contains(text, s) {
			t.Errorf("%s leaks %q: %s", where, s, text)
		}
	}
}

// TestTokenAndCASentinels: a refused token, a malformed token and a CA
// Secret that is not a certificate are each Permanent, with an error that
// says which and quotes neither; nothing is logged of them either.
func TestTokenAndCASentinels(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		token  string
		ca     []byte
		reason string
		says   string
	}{
		{name: "refused token", token: sentinelToken, reason: "Unauthorized", says: "401 invalid token value!"},
		{name: "malformed token", token: sentinelSecret, says: "want user@realm!tokenid=secret"},
		{name: "the secret alone", token: "3f9a1c2e-5b7d-4e2a-9c3f-0a1b2c3d4e5f", says: "holds only the token's secret"},
		{name: "CA is not PEM", ca: []byte(sentinelCA), reason: proxmox.ReasonCertificateInvalid, says: "holds no PEM certificate"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			token, ca := c.token, c.ca
			if token == "" {
				token = f.fake.Token()
			}
			if ca == nil {
				ca = f.fake.CAPEM()
			}
			f.setCredentials(token, ca)
			req := f.request("pt-sentinel", "6e7f8091-0001-4a5e-9d55-0a9c1f1e2b3c")
			_, err := f.drv.Create(ctx, req)
			wantErr(t, "Create", err, proxy.ClassPermanent, c.says)
			var pe *proxy.Error
			if c.reason != "" && (!errors.As(err, &pe) || pe.Reason != c.reason) {
				t.Errorf("Create = %#v; want reason %s", err, c.reason)
			}
			h := f.drv.Check(ctx)
			for _, tg := range h.Targets {
				if tg.Healthy {
					t.Errorf("Check: %s healthy with bad credentials", tg.Target)
				}
				assertNoSentinel(t, "Check", fmt.Sprintf("%+v", tg))
			}
			assertNoSentinel(t, "the error", fmt.Sprintf("%v %+v", err, err))
			assertNoSentinel(t, "the log", f.logs.String())
		})
	}
}

// A token copied with the header's PVEAPIToken= prefix (as in a curl
// example) works as the token itself.
func TestTokenWithTheHeadersPrefix(t *testing.T) {
	f := newFixture(t)
	f.setCredentials("PVEAPIToken="+f.fake.Token()+"\n", f.fake.CAPEM())
	ready(t, f, "pt-prefixed", "6e7f8091-0002-4a5e-9d55-0a9c1f1e2b3c")
}

// TestCredentialsRotateWithoutRestart: the same driver picks up a new
// token and a new CA on its next request: nothing is cached but the
// connection pool, which is keyed by the CA.
func TestCredentialsRotateWithoutRestart(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	r := ready(t, f, "pt-rotate", "7f809102-0001-4a5e-9d55-0a9c1f1e2b3c")

	newToken := "egress@pve!provider=11111111-2222-4333-8444-555555555555"
	f.fake.SetToken(newToken)
	_, err := f.drv.Get(ctx, r.ref())
	wantErr(t, "Get with the old token", err, proxy.ClassPermanent, "401")
	f.setCredentials(newToken, f.fake.CAPEM())
	if _, err := f.drv.Get(ctx, r.ref()); err != nil {
		t.Errorf("Get after the token Secret was updated: %v", err)
	}

	newCA, err := f.fake.RotateCA()
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.drv.Get(ctx, r.ref())
	wantErr(t, "Get with the old CA", err, proxy.ClassPermanent, "certificate")
	f.setCredentials(newToken, newCA)
	if _, err := f.drv.Get(ctx, r.ref()); err != nil {
		t.Errorf("Get after the CA Secret was updated: %v", err)
	}
}

// TestTLSFailureIsPermanent: a certificate that does not verify (no CA,
// or another cluster's) is Permanent with reason CertificateInvalid, in
// calls and in the health check; verification is on unless the config
// turns it off, which works and logs a warning.
func TestTLSFailureIsPermanent(t *testing.T) {
	ctx := context.Background()
	other := pvetest.New(t, pvetest.Options{})
	for name, ca := range map[string][]byte{"system roots": nil, "another cluster's CA": other.CAPEM()} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t)
			f.setCredentials(f.fake.Token(), ca)
			_, err := f.drv.Get(ctx, proxy.Ref{Name: "pt-tls", Mark: proxy.Mark{UID: "x", InstallationID: testInstallation}})
			wantErr(t, "Get", err, proxy.ClassPermanent, "certificate")
			var pe *proxy.Error
			if !errors.As(err, &pe) || pe.Reason != proxmox.ReasonCertificateInvalid {
				t.Errorf("Get = %#v; want reason %s", err, proxmox.ReasonCertificateInvalid)
			}
			for _, tg := range f.drv.Check(ctx).Targets {
				if tg.Reason != proxmox.ReasonCertificateInvalid {
					t.Errorf("Check %s: %s %q; want %s", tg.Target, tg.Reason, tg.Message, proxmox.ReasonCertificateInvalid)
				}
			}
		})
	}
	t.Run("insecureSkipTLSVerify", func(t *testing.T) {
		f := newFixture(t, withConfig(func(c *proxmox.Config) { c.InsecureSkipTLSVerify = true }))
		f.setCredentials(f.fake.Token(), nil)
		if _, err := f.drv.List(ctx, testInstallation); err != nil {
			t.Errorf("List with verification off: %v", err)
		}
		if !strings.Contains(f.logs.String(), "WARNING: proxmox.insecureSkipTLSVerify is true") {
			t.Errorf("no warning logged; log:\n%s", f.logs.String())
		}
	})
}

// A proxmox.url with user info, a query, a fragment or a path is refused,
// never quoted: what is there may be a password or a token.
func TestNewClientRefusesWhatTheURLMustNotCarry(t *testing.T) {
	creds := func(context.Context) (proxmox.Credentials, error) { return proxmox.Credentials{}, nil }
	for _, u := range []string{
		"https://root%40pam:SENTINEL@pve.example:8006",
		"https://pve.example:8006?token=SENTINEL",
		"https://pve.example:8006?",
		"https://pve.example:8006#SENTINEL",
		"https://pve.example:8006/SENTINEL",
		"http://pve.example:8006",
	} {
		_, err := proxmox.NewClient(u, creds, false, 0, nil)
		if err == nil || !proxy.IsPermanent(err) || strings.Contains(err.Error(), "SENTINEL") || !strings.Contains(err.Error(), "proxmox.url") {
			t.Errorf("NewClient(%q) = %v; want a Permanent error naming proxmox.url, quoting nothing of it", u, err)
		}
	}
	for _, u := range []string{"https://pve.example:8006", "https://pve.example:8006/", "https://[2001:db8::1]:8006"} {
		if _, err := proxmox.NewClient(u, creds, false, 0, nil); err != nil {
			t.Errorf("NewClient(%q) = %v; want nil", u, err)
		}
	}
}
