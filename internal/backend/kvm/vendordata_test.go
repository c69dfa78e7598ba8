package kvm

import (
	"strings"
	"testing"
)

// TestVendorDataInTheSeed: the config's vendorData is the seed's
// vendor-data byte for byte, beside the provider's user-data, and it is
// in no log line or span; without it the seed has no vendor-data.
func TestVendorDataInTheSeed(t *testing.T) {
	const vendor = "#!/bin/sh\n# S3NT1NEL-vendor-token\necho platform > /etc/motd\n"
	e := newTestEnv(t, func(e *testEnv) { e.cfg.VendorData = vendor })
	createAndBootReq(t, e, e.request("web", "uid-1"))
	if got, ok := e.seedFile(seedName("web"), "vendor-data"); !ok || got != vendor {
		t.Errorf("the seed's vendor-data is %q (%v); want the config's vendorData", got, ok)
	}
	if ud := e.seedUserData(seedName("web")); strings.Contains(ud, "S3NT1NEL") {
		t.Error("the vendor-data is in the user-data")
	}
	if strings.Contains(e.logs.String(), "S3NT1NEL") {
		t.Error("the vendor-data is in the log")
	}
	for _, s := range e.spans.Ended() {
		for _, a := range s.Attributes() {
			if strings.Contains(a.Value.String(), "S3NT1NEL") {
				t.Errorf("span %s attribute %s holds the vendor-data", s.Name(), a.Key)
			}
		}
	}

	plain := newTestEnv(t)
	createAndBootReq(t, plain, plain.request("web", "uid-1"))
	if _, ok := plain.seedFile(seedName("web"), "vendor-data"); ok {
		t.Error("a config without vendorData wrote a vendor-data")
	}
}
