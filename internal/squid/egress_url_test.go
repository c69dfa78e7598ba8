package squid

import (
	"strings"
	"testing"
)

// TestParseCheckURL pins what parseCheckURL accepts and refuses among the
// URLs the CRD's egressCheck.url Pattern lets through. The CRD's CEL rules
// (apis/spec/v1alpha1/providerconfig.go, EgressCheck.URL) refuse the same
// bad ones at admission; TestAdmissionIntegration checks that side.
func TestParseCheckURL(t *testing.T) {
	good := map[string]checkURL{
		"http://echo.example/ip":                   {host: "echo.example", port: "80", path: "/ip"},
		"http://echo.example":                      {host: "echo.example", port: "80", path: "/"},
		"https://api.ipify.org":                    {https: true, host: "api.ipify.org", port: "443", path: "/"},
		"https://Echo.Example:8443/a/b":            {https: true, host: "echo.example", port: "8443", path: "/a/b"},
		"http://echo.example:1/ip":                 {host: "echo.example", port: "1", path: "/ip"},
		"http://echo.example:65535/ip":             {host: "echo.example", port: "65535", path: "/ip"},
		"http://echo.example:08080/ip":             {host: "echo.example", port: "08080", path: "/ip"},
		"http://203.0.113.7:8080/ip":               {host: "203.0.113.7", port: "8080", path: "/ip"},
		"https://echo.example/%2F%7e":              {https: true, host: "echo.example", port: "443", path: "/%2F%7e"},
		"https://echo.example/a%20b":               {https: true, host: "echo.example", port: "443", path: "/a%20b"},
		"http://[2001:db8::1]/ip":                  {host: "2001:db8::1", port: "80", path: "/ip"},
		"http://[2001:DB8::1]:8080/ip":             {host: "2001:db8::1", port: "8080", path: "/ip"},
		"http://[::ffff:203.0.113.7]/ip":           {host: "::ffff:203.0.113.7", port: "80", path: "/ip"},
		"http://[::ffff:cb00:7107]/ip":             {host: "::ffff:cb00:7107", port: "80", path: "/ip"},
		"http://[::FFFF:cb00:7107]/ip":             {host: "::ffff:cb00:7107", port: "80", path: "/ip"},
		"https://echo.example.com:8443/v1/ip%2Fv4": {https: true, host: "echo.example.com", port: "8443", path: "/v1/ip%2Fv4"},
		"http://[64:ff9b::203.0.113.7]/ip":         {host: "64:ff9b::203.0.113.7", port: "80", path: "/ip"},
		"https://echo.example/a-b_c.d~e/f/g":       {https: true, host: "echo.example", port: "443", path: "/a-b_c.d~e/f/g"},
	}
	for raw, want := range good {
		got, msg := parseCheckURL(raw)
		if msg != "" {
			t.Errorf("parseCheckURL(%q) refused: %s", raw, msg)
			continue
		}
		if got != want {
			t.Errorf("parseCheckURL(%q) = %+v, want %+v", raw, got, want)
		}
	}

	// Each matches the CRD's Pattern; a CEL rule of the CRD refuses it.
	bad := map[string]string{
		"http://echo.example:99999/ip": `has port "99999"`,
		"http://echo.example:65536/ip": `has port "65536"`,
		"http://echo.example:0/ip":     `has port "0"`,
		"http://echo.example:00000/ip": `has port "00000"`,
		"https://echo.example/%zz":     "is not a URL",
		"https://echo.example/a%":      "is not a URL",
		"https://echo.example/a%2":     "is not a URL",
		"https://echo.example/%2z":     "is not a URL",
		"https://echo.example/%%41":    "is not a URL",
		"http://[1.2.3.4]/":            "is not a URL",
		"http://[::1::2]/":             "is not a URL",
		"http://[12345::1]/":           "is not a URL",
		"http://[::]:0/":               `has port "0"`,
		"http://[:]/":                  "is not a URL",
		"http://[.]/":                  "is not a URL",
		"http://[abc]/":                "is not a URL",
	}
	for raw, want := range bad {
		if got, msg := parseCheckURL(raw); msg == "" {
			t.Errorf("parseCheckURL(%q) = %+v, want refused (%s)", raw, got, want)
		} else if !strings.Contains(msg, want) {
			t.Errorf("parseCheckURL(%q) refused with %q, want %q in it", raw, msg, want)
		}
	}
}
