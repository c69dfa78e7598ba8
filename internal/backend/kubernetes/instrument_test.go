package kubernetes

import (
	"net/http"
	"net/url"
	"testing"
)

func TestAPIMethod(t *testing.T) {
	for _, tc := range []struct{ method, url, want string }{
		{"GET", "/api/v1/namespaces/proxies/pods?labelSelector=a%3Db", "pods.list"},
		{"GET", "/api/v1/namespaces/proxies/pods?watch=true", "pods.watch"},
		{"GET", "/apis/apps/v1/namespaces/proxies/deployments/team-a-x", "deployments.get"},
		{"POST", "/apis/apps/v1/namespaces/proxies/deployments", "deployments.create"},
		{"PATCH", "/api/v1/namespaces/proxies/secrets/team-a-x", "secrets.patch"},
		{"PUT", "/apis/apps/v1/namespaces/proxies/deployments/x/status", "deployments/status.update"},
		{"DELETE", "/apis/apps/v1/namespaces/proxies/deployments/x", "deployments.delete"},
		{"DELETE", "/api/v1/namespaces/proxies/pods", "pods.deletecollection"},
		{"GET", "/api/v1/namespaces/proxies", "namespaces.get"},
		{"GET", "/apis/networking.k8s.io/v1/servicecidrs", "servicecidrs.list"},
		{"POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "selfsubjectaccessreviews.create"},
		{"GET", "/version", "version.get"},
		{"GET", "/apis", "discovery.get"},
	} {
		u, _ := url.Parse(tc.url)
		if got := apiMethod(&http.Request{Method: tc.method, URL: u}); got != tc.want {
			t.Errorf("apiMethod(%s %s) = %q; want %q", tc.method, tc.url, got, tc.want)
		}
	}
}
