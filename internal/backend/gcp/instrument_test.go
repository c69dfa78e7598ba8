package gcp

import (
	"net/http"
	"net/url"
	"testing"
)

func TestComputeMethod(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/compute/v1/projects/p/zones/europe-west1-b/instances/team-a-x", "instances.get"},
		{"POST", "/compute/v1/projects/p/zones/europe-west1-b/instances", "instances.insert"},
		{"PUT", "/compute/v1/projects/p/zones/z/instances/x", "instances.update"},
		{"DELETE", "/compute/v1/projects/p/zones/z/instances/x", "instances.delete"},
		{"GET", "/compute/v1/projects/p/aggregated/instances", "instances.aggregatedList"},
		{"GET", "/compute/v1/projects/p/zones/z/operations/operation-1", "zoneOperations.get"},
		{"GET", "/compute/v1/projects/p/regions/r/operations/operation-1", "regionOperations.get"},
		{"GET", "/compute/v1/projects/p/global/operations/operation-1", "globalOperations.get"},
		{"POST", "/compute/v1/projects/p/regions/r/addresses/x/setLabels", "addresses.setLabels"},
		{"PATCH", "/compute/v1/projects/p/global/firewalls/x", "firewalls.patch"},
		{"GET", "/compute/v1/projects/p/regions/r", "regions.get"},
		{"GET", "/token", "other"},
	} {
		req := &http.Request{Method: tc.method, URL: &url.URL{Path: tc.path}}
		if got := computeMethod(req); got != tc.want {
			t.Errorf("computeMethod(%s %s) = %q; want %q", tc.method, tc.path, got, tc.want)
		}
	}
}
