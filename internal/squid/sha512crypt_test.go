package squid

import (
	"strings"
	"testing"
)

// The expected hashes were printed by crypt(3) of Debian bookworm's
// libxcrypt, the library basic_ncsa_auth calls; the first two are also the
// examples of the SHA-crypt specification.
func TestSHA512Crypt(t *testing.T) {
	for _, tc := range []struct {
		password, salt string
		rounds         int
		want           string
	}{
		{"Hello world!", "saltstring", 5000, "$6$saltstring$svn8UoSVapNtMuq1ukKS4tPQd8iKwSMHWjl/O817G3uBnIFNjnQJuesI68u4OTLiBFdcbYEdFCoEOfaS35inz1"},
		{"Hello world!", "saltstringsaltstring", 10000, "$6$rounds=10000$saltstringsaltst$OW1/O6BYHV6BcXZu8QVeXbDWra3Oeqh0sbHbbMCVNSnCM/UrjmM0Dp8vOuZeHBy/YTBmSK6H9qs/y3RnOaw5v."},
		{"", "abc", 5000, "$6$abc$mJP3a6FyA8uCnzRtlnNypPwjnvpi5TP9qOrInzrfDmwxUQG38PkpCPdqfTb8JQfAngapMxeim4AZ..hSdRRzD."},
		{strings.Repeat("x", 200), "0123456789abcdef", 5000, "$6$0123456789abcdef$Rru0YcJdWAfylTzYkMBaHfdgEjT2jeUewuTfATTJEn/Inu1Ma3JNgneCwDVl2NaWmkgDKZzdSV8VisQ10exaF."},
		{"pässwörd: with space%", "./AZaz09", 5000, "$6$./AZaz09$A710nMH72JUMDWMA6mf5N0c55QMofawmf3BhqMY0Z3dkkQynTLxUvuyumxgUNX4zY0gUByL4D3y9pKvVIGTBO/"},
		// 64 and 65 bytes: either side of the digest size.
		{strings.Repeat("a", 64), "s", 5000, "$6$s$e/ci9X0P/si6JKhId/bD59PwDCRUXGfXtlmFJBl9WlbG81lQ4/GNHZY264VcCPxDM9r6CfZeIDoPfOHTcfX4A/"},
		{strings.Repeat("b", 65), "s", 5000, "$6$s$6f13rc3drPUbi./GMWfn7XXYto/Or/ppOUQNtsLNKQX0s0lRwmt.RkGcxvL3mWnT16lioZDC2kV/MLiml6Jof0"},
	} {
		if got := sha512Crypt([]byte(tc.password), []byte(tc.salt), tc.rounds); got != tc.want {
			t.Errorf("sha512Crypt(%q, %q, %d)\n got %s\nwant %s", tc.password, tc.salt, tc.rounds, got, tc.want)
		}
	}
}
