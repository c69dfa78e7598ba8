package external

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"math/big"
	"sync"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/controller/writes"
)

const (
	// KeySecretName holds the provider's password key in its namespace.
	KeySecretName = "egressproxy-password-key"
	keySecretKey  = "key"
	// generatedPasswordLength is the length of generated passwords.
	generatedPasswordLength = 32
	passwordAlphabet        = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
)

// Passwords generates proxy passwords that need no storage of their own: a
// password is an HMAC of the managed resource's UID under one random key,
// kept in a Secret in the provider's namespace. The same resource always
// gets the same password; deleting the key Secret rotates every generated
// password once the provider restarts (the proxies' configs then roll out
// with the new ones).
type Passwords struct {
	Kube      client.Client
	Reader    client.Reader
	Namespace string

	mu  sync.Mutex
	key []byte
}

// For returns the generated password of the resource with uid.
func (p *Passwords) For(ctx context.Context, uid string) (string, error) {
	key, err := p.loadKey(ctx)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, key)
	_, _ = mac.Write([]byte(uid))
	sum := mac.Sum(nil)
	// Map the digest onto the alphabet; 32 chars of 62 symbols is ~190 bits.
	n := new(big.Int).SetBytes(sum)
	base := big.NewInt(int64(len(passwordAlphabet)))
	out := make([]byte, generatedPasswordLength)
	mod := new(big.Int)
	for i := range out {
		n.DivMod(n, base, mod)
		out[i] = passwordAlphabet[mod.Int64()]
	}
	return string(out), nil
}

// Digest is a keyed digest of secret values, for proxy.Request's
// SecretDigest: it changes when they change and reveals nothing of them.
func (p *Passwords) Digest(ctx context.Context, secrets ...string) (string, error) {
	key, err := p.loadKey(ctx)
	if err != nil {
		return "", err
	}
	mac := hmac.New(sha256.New, key)
	for _, s := range secrets {
		_, _ = mac.Write([]byte(s))
		_, _ = mac.Write([]byte{0})
	}
	return hex.EncodeToString(mac.Sum(nil))[:16], nil
}

func (p *Passwords) loadKey(ctx context.Context) ([]byte, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.key != nil {
		return p.key, nil
	}
	s := &corev1.Secret{}
	err := p.Reader.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: KeySecretName}, s)
	switch {
	case err == nil:
	case kerrors.IsNotFound(err):
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return nil, errors.Wrap(err, "cannot generate the password key")
		}
		s = &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: KeySecretName,
				Labels: map[string]string{"app.kubernetes.io/managed-by": "provider-egressproxy"}},
			Data: map[string][]byte{keySecretKey: key},
		}
		if err := p.Kube.Create(ctx, s); err != nil {
			if !kerrors.IsAlreadyExists(err) {
				return nil, errors.Wrapf(writes.WithoutAnswerText(err), "cannot create Secret %s/%s", p.Namespace, KeySecretName)
			}
			// Another replica won the race: use its key.
			if err := p.Reader.Get(ctx, types.NamespacedName{Namespace: p.Namespace, Name: KeySecretName}, s); err != nil {
				return nil, errors.Wrapf(err, "cannot get Secret %s/%s", p.Namespace, KeySecretName)
			}
		}
	default:
		return nil, errors.Wrapf(err, "cannot get Secret %s/%s", p.Namespace, KeySecretName)
	}
	key := s.Data[keySecretKey]
	if len(key) < 16 {
		return nil, errors.Errorf("Secret %s/%s has no usable key %q: delete it and a new one is made", p.Namespace, KeySecretName, keySecretKey)
	}
	p.key = key
	return key, nil
}
