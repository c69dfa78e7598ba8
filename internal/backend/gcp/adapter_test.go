package gcp

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"google.golang.org/api/option"
)

// TestCloseOfTheSDK: Close is safe on an sdk never built, and more than
// once on a built one.
func TestCloseOfTheSDK(t *testing.T) {
	if err := (&sdk{}).Close(); err != nil {
		t.Errorf("Close of an sdk never built = %v; want nil", err)
	}
	api, err := NewSDK(context.Background(), "p", option.WithEndpoint("http://127.0.0.1:1"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := api.Close(); err != nil {
			t.Errorf("Close of a built sdk = %v; want nil", err)
		}
	}
}

// TestTheEndpoint: requests go to the endpoint the options name, below
// /compute/v1/projects/<project>, and to compute.googleapis.com when
// they name none.
func TestTheEndpoint(t *testing.T) {
	paths := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths <- r.URL.Path
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	for _, endpoint := range []string{srv.URL, srv.URL + "/"} {
		api, err := NewSDK(context.Background(), "p", option.WithEndpoint(endpoint), option.WithoutAuthentication())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := api.GetRegion(context.Background(), "europe-west1"); err != nil {
			t.Fatal(err)
		}
		if got := <-paths; got != "/compute/v1/projects/p/regions/europe-west1" {
			t.Errorf("endpoint %s: path %s; want /compute/v1/projects/p/regions/europe-west1", endpoint, got)
		}
	}
	api, err := NewSDK(context.Background(), "p", option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	if got := api.(*sdk).base.String(); !strings.HasPrefix(got, "https://compute.googleapis.com/compute/v1/projects/p") { //nolint:forcetypeassert // NewSDK's API is an *sdk.
		t.Errorf("default base %s; want https://compute.googleapis.com/compute/v1/projects/p", got)
	}
}

// TestAnAnswerTooLarge is refused, not read into memory.
func TestAnAnswerTooLarge(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		chunk := []byte(`{"quotas":[` + strings.Repeat(" ", 1<<20))
		for range maxAnswer>>20 + 2 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
			chunk = []byte(strings.Repeat(" ", 1<<20))
		}
	}))
	defer srv.Close()
	api, err := NewSDK(context.Background(), "p", option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.GetRegion(context.Background(), "europe-west1"); err == nil || !strings.Contains(err.Error(), "larger than") {
		t.Errorf("GetRegion of an answer too large = %v; want an error saying so", err)
	}
}

// TestANameStaysOneSegment: whatever a name holds, it is one segment of
// the path it is put in, escaped; it never reaches another resource or
// project, nor the query.
func TestANameStaysOneSegment(t *testing.T) {
	type got struct{ path, raw, query string }
	reqs := make(chan got, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reqs <- got{r.URL.Path, r.URL.EscapedPath(), r.URL.RawQuery}
		_, _ = w.Write([]byte(`{}`))
	}))
	defer srv.Close()
	api, err := NewSDK(context.Background(), "p", option.WithEndpoint(srv.URL), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"../../q/zones/z/instances/x", "a/b", "x?filter=y", "%2F", "a b"} {
		if _, err := api.GetInstance(context.Background(), "europe-west1-b", name); err != nil {
			t.Fatal(err)
		}
		g := <-reqs
		if want := "/compute/v1/projects/p/zones/europe-west1-b/instances/" + name; g.path != want {
			t.Errorf("name %q: path %q; want %q", name, g.path, want)
		}
		if want := "/compute/v1/projects/p/zones/europe-west1-b/instances/" + url.PathEscape(name); g.raw != want {
			t.Errorf("name %q: escaped path %q; want %q", name, g.raw, want)
		}
		if g.query != "prettyPrint=false" {
			t.Errorf("name %q: query %q; want only prettyPrint=false", name, g.query)
		}
	}
}
