package telemetry

import (
	"bytes"
	"context"
	"io"
	"mime/multipart"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
)

// TestWire: at VWire a request and its answer are logged with their
// method, URL, status, the headers and bodies that are not secret, and
// no secret anywhere (headers, the URL's user and query, JSON and form
// fields, metadata values, upload bodies); the bodies go on unchanged.
// Below VWire nothing is logged.
func TestWire(t *testing.T) {
	const s = "S3NT1NEL-wire-4d2c9b"
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		got = append(got, string(b))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Set-Cookie", "PVEAuthCookie="+s)
		_, _ = io.WriteString(w, `{"data":{"name":"egp-1","cipassword":"`+s+`","metadata":{"items":[{"key":"user-data","value":"#cloud-config `+s+`"}]},"nextPageToken":"`+s+`"}}`)
	}))
	defer srv.Close()
	var mp bytes.Buffer
	mw := multipart.NewWriter(&mp)
	fw, _ := mw.CreateFormFile("filename", "seed.iso")
	_, _ = io.WriteString(fw, "user-data "+s)
	_ = mw.Close()
	bodies := []struct{ ct, body string }{
		{"application/json", `{"name":"egp-1","machineType":"e2-small","metadata":{"items":[{"key":"user-data","value":"` + s + `"},{"key":"ssh-keys","value":"` + s + `"}]},"password":"` + s + `","private_key":"` + s + `"}`},
		{"application/x-www-form-urlencoded", url.Values{"cores": {"1"}, "cipassword": {s}, "sshkeys": {s}}.Encode()},
		{mw.FormDataContentType(), mp.String()},
	}
	for _, v := range []int{VDetail, VWire} {
		var logs bytes.Buffer
		l := funcr.New(func(p, a string) { logs.WriteString(p + " " + a + "\n") }, funcr.Options{Verbosity: v})
		c := &http.Client{Transport: Wire("test", func(context.Context) logr.Logger { return l }, nil)}
		got = nil
		for _, b := range bodies {
			req, _ := http.NewRequest(http.MethodPost, strings.Replace(srv.URL, "http://", "http://user:"+s+"@", 1)+"/api2/json/x?access_token="+s+"&content=iso", strings.NewReader(b.body))
			req.Header.Set("Content-Type", b.ct)
			req.Header.Set("Authorization", "PVEAPIToken=root@pam!t="+s)
			resp, err := c.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			answer, _ := io.ReadAll(resp.Body)
			_ = resp.Body.Close()
			if !strings.Contains(string(answer), s) {
				t.Errorf("the answer's body was changed: %s", answer)
			}
		}
		for i, b := range bodies {
			if got[i] != b.body {
				t.Errorf("the server got body %q; want %q", got[i], b.body)
			}
		}
		text := logs.String()
		if strings.Contains(text, s) {
			t.Errorf("V(%d): the wire log holds a secret:\n%s", v, text)
		}
		if v < VWire {
			if text != "" {
				t.Errorf("V(%d): logged %s; want nothing", v, text)
			}
			continue
		}
		for _, w := range []string{`"msg"="test wire request"`, `"msg"="test wire response"`, `"method"="POST"`, "content=iso", `"status"="200 OK"`,
			`\"machineType\":\"e2-small\"`, `\"key\":\"user-data\",\"value\":\"[redacted]\"`, "cores=1", `"Authorization"="[redacted]"`,
			`"Content-Type"="application/json"`, `\"name\":\"egp-1\"`, "bytes, multipart/form-data, not shown"} {
			if !strings.Contains(text, w) {
				t.Errorf("the wire log lacks %s:\n%s", w, text)
			}
		}
	}
}

// TestWireHidesWhatAGuestWrote: what a guest wrote (its egress check's
// report, which holds what the echo endpoint answered) is not in the
// wire log, in any of the answers that carry it.
func TestWireHidesWhatAGuestWrote(t *testing.T) {
	const text = "sentinel-guest-text"
	for name, body := range map[string]string{
		"getGuestAttributes":       `{"kind":"compute#guestAttributes","variableKey":"egressproxy/egress-check","variableValue":"egressproxy-egress-check 1700000000 200 ` + text + `"}`,
		"getGuestAttributes query": `{"kind":"compute#guestAttributes","queryPath":"egressproxy/","queryValue":{"items":[{"namespace":"egressproxy","key":"egress-check","value":"` + text + `"}]}}`,
		"agent/file-read":          `{"data":{"content":"` + text + `","bytes-read":19}}`,
	} {
		got := redactBody("application/json; charset=UTF-8", []byte(body), int64(len(body)))
		if strings.Contains(got, text) || !strings.Contains(got, Redacted) {
			t.Errorf("%s: the wire log shows %s; want the guest's text redacted", name, got)
		}
	}
}
