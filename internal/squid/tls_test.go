package squid

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// keyBody is the first line of a PEM key's base64 body: no error or
// printout may hold it.
func keyBody(key string) string {
	if b, _ := pem.Decode([]byte(key)); b == nil {
		return key
	}
	return strings.Split(key, "\n")[1]
}

// TestLoadTLS: a cert-manager Secret loads, with ca.crt as the CA or
// else the chain's last certificate; every broken Secret is an error
// naming the key at fault and quoting none of the key material.
func TestLoadTLS(t *testing.T) {
	c := testenv.NewCerts(t, "proxy.example", "127.0.0.1")
	other := testenv.NewCerts(t, "proxy.example")
	now := time.Now()

	got, err := LoadTLS(c.Secret(), now)
	if err != nil {
		t.Fatalf("LoadTLS(cert-manager's Secret) = %v", err)
	}
	inter := c.Chain[strings.Index(c.Chain, "-----END CERTIFICATE-----\n")+len("-----END CERTIFICATE-----\n"):]
	if got.Cert != c.Chain || got.CA != c.CA+inter || got.Key != c.Key {
		t.Errorf("LoadTLS = chain %v, CA ca.crt and the intermediate %v, key %v; want the Secret's", got.Cert == c.Chain, got.CA == c.CA+inter, got.Key == c.Key)
	}

	noCA := c.Secret()
	delete(noCA, "ca.crt")
	got, err = LoadTLS(noCA, now)
	if err != nil {
		t.Fatalf("LoadTLS without ca.crt = %v", err)
	}
	if got.CA != inter {
		t.Errorf("LoadTLS without ca.crt: CA is not the chain's last certificate (the intermediate)")
	}

	// An EC PARAMETERS block before the key, as openssl ecparam -genkey
	// writes it, is dropped.
	withParams := c.Secret()
	withParams["tls.key"] = append([]byte("-----BEGIN EC PARAMETERS-----\nBggqhkjOPQMBBw==\n-----END EC PARAMETERS-----\n"), withParams["tls.key"]...)
	if got, err := LoadTLS(withParams, now); err != nil || got.Key != c.Key {
		t.Errorf("LoadTLS with EC PARAMETERS first = key kept %v, %v", err == nil && got.Key == c.Key, err)
	}

	pkcs8 := func() []byte {
		k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		der, _ := x509.MarshalPKCS8PrivateKey(k)
		return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der})
	}()
	leafOnly := c.Chain[:strings.Index(c.Chain, "-----END CERTIFICATE-----\n")+len("-----END CERTIFICATE-----\n")]
	with := func(k, v string) map[string][]byte {
		d := c.Secret()
		if v == "" {
			delete(d, k)
		} else {
			d[k] = []byte(v)
		}
		return d
	}
	for name, tc := range map[string]struct {
		data map[string][]byte
		at   time.Time
		want string
	}{
		"NoCertificate":        {with("tls.crt", ""), now, "no key tls.crt"},
		"NoKey":                {with("tls.key", ""), now, "no key tls.key"},
		"KeyInTheCertificate":  {with("tls.crt", c.Key), now, `tls.crt holds a PEM block of type "EC PRIVATE KEY"`},
		"NotPEM":               {with("tls.crt", "not a certificate"), now, "tls.crt holds no PEM certificate"},
		"KeyNotPEM":            {with("tls.key", "not a key"), now, "tls.key holds no PEM private key"},
		"AnotherKey":           {with("tls.key", other.Key), now, "tls.key is not the private key of the first certificate in tls.crt"},
		"AnotherKeyPKCS8":      {with("tls.key", string(pkcs8)), now, "tls.key is not the private key"},
		"EncryptedKey":         {with("tls.key", "-----BEGIN ENCRYPTED PRIVATE KEY-----\nAAAA\n-----END ENCRYPTED PRIVATE KEY-----\n"), now, "tls.key is encrypted"},
		"Expired":              {c.Secret(), now.Add(48 * time.Hour), "expired at"},
		"AnotherCA":            {with("ca.crt", other.CA), now, "tls.crt does not verify against ca.crt"},
		"NoCA":                 {with("ca.crt", ""), now, ""},
		"LeafAloneAgainstRoot": {with("tls.crt", leafOnly), now, "tls.crt does not verify against ca.crt"},
		"LeafAloneNoCA": {func() map[string][]byte {
			d := with("tls.crt", leafOnly)
			delete(d, "ca.crt")
			return d
		}(), now, ""}, // the leaf is then its own CA, which clients accept
	} {
		t.Run(name, func(t *testing.T) {
			_, err := LoadTLS(tc.data, tc.at)
			if tc.want == "" {
				if err != nil {
					t.Errorf("LoadTLS = %v; want it loaded", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("LoadTLS = %v; want an error containing %q", err, tc.want)
			}
			if !proxy.IsPermanent(err) {
				t.Errorf("LoadTLS error is %s; want Permanent", proxy.ClassOf(err))
			}
			for _, k := range []string{c.Key, other.Key, string(pkcs8)} {
				if body := keyBody(k); strings.Contains(err.Error(), body) || strings.Contains(err.Error(), k) {
					t.Errorf("LoadTLS error quotes key material: %v", err)
				}
			}
		})
	}
}

// TestRenderTLS: with TLS the proxy listens with https_port only, naming
// the files the certificate and key are installed as, and the files and
// their hash carry them; printing the files never shows the key.
func TestRenderTLS(t *testing.T) {
	c := testenv.NewCerts(t, "proxy.example")
	s := proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"10.0.0.0/8"}}
	plain, err := Render(s, Options{})
	if err != nil {
		t.Fatal(err)
	}
	s.TLS = &proxy.TLS{Cert: c.Chain, Key: c.Key, CA: c.CA}
	f, err := Render(s, Options{TLSCertPath: "/etc/x/tls.crt", TLSKeyPath: "/etc/x/tls.key"})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(f.SquidConf, "\nhttps_port 3128 tls-cert=/etc/x/tls.crt tls-key=/etc/x/tls.key\n") || strings.Contains(f.SquidConf, "\nhttp_port") {
		t.Errorf("squid.conf with TLS does not listen with https_port alone:\n%s", f.SquidConf)
	}
	if strings.Contains(f.SquidConf, "PRIVATE KEY") || strings.Contains(f.SquidConf, keyBody(c.Key)) {
		t.Errorf("squid.conf holds the key")
	}
	if f.TLSCert != c.Chain || f.TLSKey != c.Key {
		t.Errorf("Files do not carry the certificate and key")
	}
	if Hash(f) == Hash(plain) {
		t.Errorf("Hash is the same with and without TLS")
	}
	renewed := f
	renewed.TLSKey = "another key"
	if Hash(renewed) == Hash(f) {
		t.Errorf("Hash is the same for another key: a rotated key would not roll the proxy")
	}
	if Hash(Files{SquidConf: plain.SquidConf}) != Hash(plain) {
		t.Errorf("Hash of files without TLS changed")
	}
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q"} {
		if out := fmt.Sprintf(verb, f); strings.Contains(out, keyBody(c.Key)) || strings.Contains(out, "PRIVATE KEY") {
			t.Errorf("%s of Files prints the key: %s", verb, out)
		}
	}
	// With an egress check, a plain listener on loopback alone for the
	// check from inside the instance, on ReportPort.
	withCheck := s
	withCheck.EgressCheck = &proxy.EgressCheck{URL: "http://echo.example/ip", Username: CheckUsername, Password: "check-password-0123456789abcdef"}
	fc, err := Render(withCheck, Options{TLSCertPath: "/etc/x/tls.crt", TLSKeyPath: "/etc/x/tls.key"})
	if err != nil {
		t.Fatal(err)
	}
	if got := ReportPort(withCheck); got != 3129 || !strings.Contains(fc.SquidConf, "\nhttp_port 127.0.0.1:3129\n") || strings.Count(fc.SquidConf, "\nhttp_port") != 1 {
		t.Errorf("squid.conf with TLS and a check: ReportPort %d; want one plain listener, 127.0.0.1:3129:\n%s", got, fc.SquidConf)
	}
	if withCheck.TLS, withCheck.Port = nil, 65535; ReportPort(withCheck) != 65535 {
		t.Errorf("ReportPort without TLS = %d; want the proxy's port", ReportPort(withCheck))
	}
	if withCheck.TLS = s.TLS; ReportPort(withCheck) != 65534 {
		t.Errorf("ReportPort with TLS on port 65535 = %d; want 65534", ReportPort(withCheck))
	}
	s.TLS = &proxy.TLS{Cert: c.Chain}
	if _, err := Render(s, Options{}); err == nil || !strings.Contains(err.Error(), "tls:") {
		t.Errorf("Render with TLS lacking a key = %v; want an error naming tls", err)
	}
}
