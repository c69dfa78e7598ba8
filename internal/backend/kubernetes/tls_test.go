package kubernetes

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// TestPodProxyTLS: with TLS the proxy's Secret holds the certificate and
// key, the pod mounts both (each required) where squid.conf's https_port
// reads them, and a renewed certificate changes the pod template's config
// hash, which rolls the pod; the Deployment itself never holds the key.
func TestPodProxyTLS(t *testing.T) {
	certs := testenv.NewCerts(t, "proxy.example")
	tlsOf, err := squid.LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	req := testRequest()
	req.Proxy.TLS = tlsOf
	files := render(t, req)
	if !strings.Contains(files.SquidConf, "\nhttps_port 3128 tls-cert="+ConfigMountPath+"/"+KeyTLSCert+" tls-key="+ConfigMountPath+"/"+KeyTLSKey+"\n") {
		t.Errorf("squid.conf does not listen with TLS on the mounted files:\n%s", files.SquidConf)
	}
	dep := buildDeployment(Config{}, req, files, "h", now)
	s := buildSecret(dep, req, files)
	if string(s.Data[KeyTLSCert]) != certs.Chain || string(s.Data[KeyTLSKey]) != certs.Key {
		t.Errorf("the Secret does not hold the certificate and key")
	}
	var items []corev1.KeyToPath
	for _, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == "config" {
			items = v.Secret.Items
		}
	}
	mounted := map[string]bool{}
	for _, it := range items {
		mounted[it.Key] = it.Path == it.Key
	}
	if !mounted[KeyTLSCert] || !mounted[KeyTLSKey] {
		t.Errorf("config volume items %+v; want tls.crt and tls.key under their names", items)
	}
	if strings.Contains(fmtDeployment(dep), strings.Split(certs.Key, "\n")[1]) {
		t.Errorf("the Deployment holds the key")
	}

	renewed := testenv.NewCerts(t, "proxy.example")
	req2 := testRequest()
	if req2.Proxy.TLS, err = squid.LoadTLS(renewed.Secret(), time.Now()); err != nil {
		t.Fatal(err)
	}
	before := dep.Spec.Template.Annotations[AnnotationConfigHash]
	if after := buildDeployment(Config{}, req2, render(t, req2), "h", now).Spec.Template.Annotations[AnnotationConfigHash]; after == before {
		t.Errorf("config hash unchanged (%s) after a renewal: the pod would keep the old certificate", after)
	}
}

func fmtDeployment(d any) string {
	b, _ := json.Marshal(d)
	return string(b)
}

// TestCredentialsTurnedOffLeaveTheSecret: an update turning auth and TLS
// off rewrites the proxy's Secret with squid.conf and the owner key alone
// (its data is replaced, not merged), the new pod mounts neither the
// htpasswd nor the TLS files, and the config hash changes, so the pod
// that had them is replaced.
func TestCredentialsTurnedOffLeaveTheSecret(t *testing.T) {
	certs := testenv.NewCerts(t, "proxy.example")
	tlsOf, err := squid.LoadTLS(certs.Secret(), time.Now())
	if err != nil {
		t.Fatal(err)
	}
	on := testRequest()
	on.Proxy.Auth = proxy.Auth{Enabled: true, Username: "alice", Password: "S3NT1NEL-password"}
	on.Proxy.TLS = tlsOf
	depOn := buildDeployment(Config{}, on, render(t, on), "h", now)
	existing := buildSecret(depOn, on, render(t, on))

	off := testRequest()
	depOff := buildDeployment(Config{}, off, render(t, off), "h", now)
	next, err := rewritten(existing, buildSecret(depOff, off, render(t, off)))
	if err != nil {
		t.Fatal(err)
	}
	data := next.(*corev1.Secret).Data //nolint:forcetypeassert // rewritten keeps the type.
	if len(data) != 3 || data[KeySquidConf] == nil || data[OwnerKey(off.Mark.UID)] == nil || data[KeyConfigHash] == nil {
		t.Errorf("the rewritten Secret holds %v; want squid.conf, the config hash and the owner key only", slices.Sorted(maps.Keys(data)))
	}
	for _, v := range depOff.Spec.Template.Spec.Volumes {
		if v.Secret == nil {
			continue
		}
		for _, it := range v.Secret.Items {
			if it.Key == KeyHtpasswd || it.Key == KeyTLSCert || it.Key == KeyTLSKey {
				t.Errorf("the pod still mounts %s", it.Key)
			}
		}
	}
	if depOn.Spec.Template.Annotations[AnnotationConfigHash] == depOff.Spec.Template.Annotations[AnnotationConfigHash] {
		t.Error("config hash unchanged: the pod with the credentials would stay")
	}
}
