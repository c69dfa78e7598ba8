package localcrossplane

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestProcessTokenRenewalIntegration: on a real kube-apiserver, the token
// a pod's process authenticates with (the file its kubeconfig names) is
// replaced by a new TokenRequest token of the pod's ServiceAccount before
// the old one expires, again and again, and each new one authenticates as
// that ServiceAccount and expires later; a client loaded from the
// kubeconfig reads the file (client-go re-reads it as it changes). When
// the process stops, renewals stop. The API server takes no expiry under
// 10 minutes, so the renewal interval is shortened to a second.
func TestProcessTokenRenewalIntegration(t *testing.T) {
	cp := controlplane.ForTest(t, controlplane.Options{})
	cs, err := kubernetes.NewForConfig(cp.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().ServiceAccounts(Namespace).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "provider-a"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pod, err := cs.CoreV1().Pods(Namespace).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "provider-a-1"},
		Spec:       corev1.PodSpec{ServiceAccountName: "provider-a", Containers: []corev1.Container{{Name: "package-runtime", Image: "example.invalid/p:v1"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}

	var mu sync.Mutex
	var logged []string
	r := &ProcessRuntime{Clientset: cs, Config: cp.Config, TokenExpiry: 10 * time.Minute, TokenRenew: time.Second,
		Log: func(s string) { mu.Lock(); defer mu.Unlock(); logged = append(logged, s) }}
	dir := t.TempDir()
	tokFile, kcFile := filepath.Join(dir, "token"), filepath.Join(dir, "kubeconfig")
	if _, err := r.writeToken(ctx, pod, tokFile); err != nil {
		t.Fatal(err)
	}
	if err := r.writeKubeconfig(kcFile, tokFile); err != nil {
		t.Fatal(err)
	}
	first := readToken(t, tokFile)

	renewCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { r.renewToken(renewCtx, pod, tokFile); close(done) }()
	defer func() { stop(); <-done }()

	tokens := []string{first}
	for len(tokens) < 3 {
		prev := tokens[len(tokens)-1]
		var next string
		testenv.WaitFor(t, "the token file to hold a renewed token", 30*time.Second, func() (bool, string) {
			next = readToken(t, tokFile)
			return next != prev, "the token of the last renewal"
		})
		tokens = append(tokens, next)
	}
	want := "system:serviceaccount:" + Namespace + ":provider-a"
	for i, tok := range tokens {
		tr, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: tok}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !tr.Status.Authenticated || tr.Status.User.Username != want {
			t.Errorf("token %d: authenticated %v as %q (%s); want %s", i, tr.Status.Authenticated, tr.Status.User.Username, tr.Status.Error, want)
		}
	}
	if a, b := expiry(t, tokens[0]), expiry(t, tokens[2]); !b.After(a) {
		t.Errorf("the renewed token expires at %s, the first at %s; want it later", b, a)
	}

	// What the process does: load its kubeconfig and ask who it is.
	cfg, err := clientcmd.BuildConfigFromFlags("", kcFile)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.BearerTokenFile != tokFile {
		t.Errorf("the process's kubeconfig authenticates with token file %q; want %s, which is renewed", cfg.BearerTokenFile, tokFile)
	}
	pcs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ssr, err := pcs.AuthenticationV1().SelfSubjectReviews().Create(ctx, &authenticationv1.SelfSubjectReview{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("the process's kubeconfig after renewals: %v", err)
	}
	if got := ssr.Status.UserInfo.Username; got != want {
		t.Errorf("the process's kubeconfig authenticates as %q; want %s", got, want)
	}

	mu.Lock()
	renewed := strings.Join(logged, "\n")
	mu.Unlock()
	if !strings.Contains(renewed, "pod provider-a-1: ServiceAccount token renewed, valid until ") {
		t.Errorf("the runtime's log says no renewal:\n%s", renewed)
	}

	// Stopped, it renews no more.
	stop()
	<-done
	last := readToken(t, tokFile)
	time.Sleep(2500 * time.Millisecond)
	if readToken(t, tokFile) != last {
		t.Error("the token file changed after the renewal was stopped")
	}
}

func readToken(t *testing.T, file string) string {
	t.Helper()
	b, err := os.ReadFile(file) //nolint:gosec // the test's file.
	if err != nil || len(b) == 0 {
		t.Fatalf("the token file: %q, %v", b, err)
	}
	return string(b)
}

// expiry is a JWT's exp claim.
func expiry(t *testing.T, jwt string) time.Time {
	t.Helper()
	parts := strings.Split(jwt, ".")
	if len(parts) != 3 {
		t.Fatalf("a token of %d parts; want a JWT", len(parts))
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Exp int64 `json:"exp"`
	}
	if err := json.Unmarshal(b, &c); err != nil {
		t.Fatal(err)
	}
	return time.Unix(c.Exp, 0)
}
