package kubernetes

import (
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

const kubeconfigTemplate = `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster:
    server: https://remote.example:6443
    CLUSTER
users:
- name: u
  user:
    USER
contexts:
- name: x
  context: {cluster: c, user: u}
current-context: x
`

func kubeconfig(cluster, user string) []byte {
	return []byte(strings.NewReplacer("CLUSTER", cluster, "USER", user).Replace(kubeconfigTemplate))
}

func TestRESTConfigFromKubeconfig(t *testing.T) {
	cfg, err := RESTConfigFromKubeconfig(kubeconfig("insecure-skip-tls-verify: true", "token: abc"))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Host != "https://remote.example:6443" || cfg.BearerToken != "abc" || cfg.Timeout == 0 {
		t.Errorf("config: host %q, token set %v, timeout %v", cfg.Host, cfg.BearerToken != "", cfg.Timeout)
	}
	for name, kc := range map[string][]byte{
		"exec plugin":     kubeconfig("insecure-skip-tls-verify: true", "exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh}"),
		"token file":      kubeconfig("insecure-skip-tls-verify: true", "tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token"),
		"client key file": kubeconfig("insecure-skip-tls-verify: true", "client-key: /etc/key.pem"),
		"CA file":         kubeconfig("certificate-authority: /etc/ca.pem", "token: abc"),
		"not YAML":        []byte("{{{"),
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := RESTConfigFromKubeconfig(kc); !proxy.IsPermanent(err) {
				t.Errorf("RESTConfigFromKubeconfig = %v; want a Permanent refusal", err)
			}
		})
	}
}

func TestRemotePoolsByKubeconfig(t *testing.T) {
	built := 0
	r := &Remote{Max: 2, build: func([]byte) (*Cluster, error) { built++; return &Cluster{}, nil }}
	a, _ := r.Cluster([]byte("a"))
	if again, _ := r.Cluster([]byte("a")); again != a || built != 1 {
		t.Errorf("the same kubeconfig built %d clusters; want 1, pooled", built)
	}
	if b, _ := r.Cluster([]byte("b")); b == a || built != 2 {
		t.Errorf("a rotated kubeconfig did not build a new cluster")
	}
	r.Cluster([]byte("c"))
	if len(r.pool) != 2 {
		t.Errorf("pool holds %d clusters; want at most Max (2)", len(r.pool))
	}
}
