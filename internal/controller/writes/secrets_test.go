package writes

import (
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// A connection Secret in the cache keeps the digest of its data, not the
// data (a proxy's password among it), and still tells whether it holds
// some details: the same ones, not changed, missing or extra ones.
func TestCachedConnectionSecretHoldsOnlyADigest(t *testing.T) {
	const password = "sentinel-password-4f1c"
	data := map[string][]byte{"url": []byte("http://proxy:" + password + "@10.0.0.5:3128"), "password": []byte(password)}
	s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"a": "b"}}, Data: data}
	digestOnly(s)
	if len(s.Data) != 0 || len(s.StringData) != 0 {
		t.Errorf("the cached Secret kept its data: %v", s.Data)
	}
	for k, v := range s.Annotations {
		if strings.Contains(k+v, password) {
			t.Errorf("the cached Secret's annotation %s=%s holds the password", k, v)
		}
	}
	digestOnly(s) // a transform may be applied twice
	if s.Annotations["a"] != "b" {
		t.Errorf("the cached Secret lost its annotations: %v", s.Annotations)
	}
	if !HeldData(s, map[string][]byte{"password": []byte(password), "url": data["url"]}) {
		t.Error("HeldData of the same data = false, want true")
	}
	for name, other := range map[string]map[string][]byte{
		"Changed": {"url": data["url"], "password": []byte("other")},
		"Missing": {"url": data["url"]},
		"Extra":   {"url": data["url"], "password": []byte(password), "host": []byte("10.0.0.5")},
		"Moved":   {"url": []byte(password), "password": data["url"]},
	} {
		if HeldData(s, other) {
			t.Errorf("%s: HeldData = true, want false", name)
		}
	}
	// Read from the API server (no digest): its own data counts.
	live := &corev1.Secret{Data: data}
	if !HeldData(live, data) || HeldData(live, map[string][]byte{"url": data["url"]}) {
		t.Error("HeldData of a Secret read from the API server does not compare its data")
	}
}
