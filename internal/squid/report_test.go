package squid

import (
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func TestReportRequest(t *testing.T) {
	c := proxy.EgressCheck{URL: "http://Echo.example.com:8080/ip", Username: CheckUsername, Password: "pw"}
	got, err := ReportRequest(c)
	if err != nil {
		t.Fatal(err)
	}
	// base64("egressproxy-check:pw")
	want := "GET http://echo.example.com:8080/ip HTTP/1.1\r\nHost: echo.example.com:8080\r\nProxy-Authorization: Basic ZWdyZXNzcHJveHktY2hlY2s6cHc=\r\nUser-Agent: egressproxy-egress-check\r\nConnection: close\r\n\r\n"
	if got != want {
		t.Errorf("ReportRequest = %q\nwant %q", got, want)
	}
	if got, _ := ReportRequest(proxy.EgressCheck{URL: "http://[2001:db8::1]/", Username: "u", Password: "p"}); !strings.HasPrefix(got, "GET http://[2001:db8::1]/ HTTP/1.1\r\nHost: [2001:db8::1]\r\n") {
		t.Errorf("IPv6 request %q", got)
	}
	if _, err := ReportRequest(proxy.EgressCheck{URL: "https://api.ipify.org/", Username: "u", Password: "p"}); err == nil || !strings.Contains(err.Error(), "http echo URL") {
		t.Errorf("https: %v; want an error asking for an http URL", err)
	}
}

func TestParseReport(t *testing.T) {
	const secret = "sentinel-content-7"
	cases := map[string]struct {
		line    string
		want    Report
		wantErr bool
	}{
		"Address":       {line: ReportMarker + " 1700000000 200 203.0.113.7\n", want: Report{IP: "203.0.113.7", At: time.Unix(1700000000, 0), Status: 200}},
		"JSON":          {line: ReportMarker + ` 1700000000 200 {"ip": "2001:db8::7"}`, want: Report{IP: "2001:db8::7", At: time.Unix(1700000000, 0), Status: 200}},
		"NoSquid":       {line: ReportMarker + " 1700000000 000 ", want: Report{At: time.Unix(1700000000, 0), Failure: "the instance's own Squid did not answer the check"}},
		"Denied":        {line: ReportMarker + " 1700000000 407 " + secret, want: Report{At: time.Unix(1700000000, 0), Status: 407, Failure: "the check through the instance's own Squid was answered 407"}},
		"TwoAddresses":  {line: ReportMarker + " 1700000000 200 203.0.113.7 198.51.100.1", wantErr: true},
		"NotAnAddress":  {line: ReportMarker + " 1700000000 200 " + secret, wantErr: true},
		"OtherMarker":   {line: "egressproxy-egress-checks 1700000000 200 203.0.113.7", wantErr: true},
		"NoTime":        {line: ReportMarker + " x 200 203.0.113.7", wantErr: true},
		"NegativeTime":  {line: ReportMarker + " -5 200 203.0.113.7", wantErr: true},
		"LongStatus":    {line: ReportMarker + " 1700000000 2000 203.0.113.7", wantErr: true},
		"NotHTTPStatus": {line: ReportMarker + " 1700000000 042 203.0.113.7", wantErr: true},
		"TooLong":       {line: ReportMarker + " 1700000000 200 203.0.113.7" + strings.Repeat(" ", MaxReport), wantErr: true},
		"Empty":         {line: "", wantErr: true},
		"OnlyTheMarker": {line: ReportMarker, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseReport([]byte(tc.line))
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseReport(%q) = %+v, %v; want error %v", tc.line, got, err, tc.wantErr)
			}
			if err != nil {
				if strings.Contains(err.Error(), secret) || strings.Contains(err.Error(), "203.0.113.7") {
					t.Errorf("the error quotes the report: %v", err)
				}
				return
			}
			if got != tc.want {
				t.Errorf("ParseReport(%q) = %+v; want %+v", tc.line, got, tc.want)
			}
		})
	}
}

// TestGuestReport: a guest's line from this instance's life that its own
// Squid answered (an HTTP status, 200 or not) says Squid answered inside
// the guest: the address, or why the check failed, in the provider's
// words. A check its Squid did not answer, a line older than the
// instance, and a malformed one do not.
func TestGuestReport(t *testing.T) {
	const secret = "sentinel-guest-9"
	created := time.Unix(1700000000, 0)
	now := created.Add(time.Hour)
	cases := map[string]struct {
		line    string
		want    Report
		wantOK  bool
		wantErr bool
	}{
		"Address":    {line: ReportMarker + " 1700000100 200 203.0.113.7\n", wantOK: true, want: Report{IP: "203.0.113.7", At: time.Unix(1700000100, 0), Status: 200}},
		"Future":     {line: ReportMarker + " 1800000000 200 203.0.113.7\n", wantOK: true, want: Report{IP: "203.0.113.7", At: now, Status: 200}},
		"EchoDown":   {line: ReportMarker + " 1700000100 502 " + secret + "\n", wantOK: true, want: Report{At: time.Unix(1700000100, 0), Status: 502, Failure: "the check through the instance's own Squid was answered 502"}},
		"Denied":     {line: ReportMarker + " 1700000100 403 \n", wantOK: true, want: Report{At: time.Unix(1700000100, 0), Status: 403, Failure: "the check through the instance's own Squid was answered 403"}},
		"NoSquid":    {line: ReportMarker + " 1700000100 000 \n"},
		"Stale":      {line: ReportMarker + " 1699990000 502 \n"},
		"NotHTTP":    {line: ReportMarker + " 1700000100 042 \n", wantErr: true},
		"NotAnEcho":  {line: ReportMarker + " 1700000100 200 " + secret + "\n", wantErr: true},
		"NotAReport": {line: secret, wantErr: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, ok, err := GuestReport([]byte(tc.line), created, now)
			if ok != tc.wantOK || (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("GuestReport(%q) = %+v, %v, %v; want %+v, %v, error %v", tc.line, got, ok, err, tc.want, tc.wantOK, tc.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), secret) {
				t.Errorf("the error quotes the report: %v", err)
			}
			if strings.Contains(got.Failure, secret) {
				t.Errorf("the failure quotes the report: %q", got.Failure)
			}
		})
	}
}

func TestLastReport(t *testing.T) {
	log := "2026-12-04T19:00:00.5Z " + ReportMarker + " 1 000 \n" +
		"2026-12-04T19:00:10.25Z " + ReportMarker + " 1 200 10.0.0.7\n" +
		"2026-12-04T19:00:11Z some other line\n"
	r, ok, err := LastReport([]byte(log))
	want := Report{IP: "10.0.0.7", At: time.Date(2026, 12, 4, 19, 0, 10, 250000000, time.UTC)}
	if err != nil || !ok || !r.At.Equal(want.At) || r.IP != want.IP {
		t.Errorf("LastReport = %+v, %v, %v; want %+v (the kubelet's time, not the line's)", r, ok, err, want)
	}
	if _, ok, err := LastReport([]byte("2026-12-04T19:00:00Z nothing\n")); ok || err != nil {
		t.Errorf("a log without a report: ok %v, %v", ok, err)
	}
	// A forged line without the kubelet's timestamp in front is not one.
	if _, ok, _ := LastReport([]byte(ReportMarker + " 1 200 10.0.0.7\n")); ok {
		t.Error("a line without a timestamp read as a report")
	}
	if _, ok, err := LastReport([]byte("2026-12-04T19:00:00Z " + ReportMarker + " 1 200 nonsense\n")); !ok || err == nil {
		t.Errorf("a malformed report: ok %v, %v; want an error", ok, err)
	}
	// Only the tail is read.
	big := strings.Repeat("x", 3*MaxReport) + "\n" + "2026-12-04T19:00:00Z " + ReportMarker + " 1 200 10.0.0.8\n"
	if r, ok, err := LastReport([]byte(big)); !ok || err != nil || r.IP != "10.0.0.8" {
		t.Errorf("a long log: %+v %v %v", r, ok, err)
	}
	if now := time.Now(); !ReportedAt(now.Add(time.Hour), now).Equal(now) {
		t.Error("a report from the future is not bounded by now")
	}
}
