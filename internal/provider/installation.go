package provider

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// installationConfigMap holds the installation ID in the provider's own
// namespace (key id). It has no owner, so it outlives the provider's
// revisions and an uninstall: a provider installed again marks and finds
// the same instances.
const installationConfigMap = "provider-egressproxy-installation"

// waitInstallationID is defaultInstallationID, tried again every few
// seconds while the provider may not read or create the ConfigMap:
// Crossplane's RBAC manager binds the provider's ServiceAccount shortly
// after the provider's pod starts, and a missing permission must not stop
// the provider (or crash-loop its pod).
func waitInstallationID(ctx context.Context, log logging.Logger, c client.Client, namespace string) (string, error) {
	var logged time.Time
	for {
		id, err := defaultInstallationID(ctx, c, namespace)
		if err == nil || !(kerrors.IsForbidden(err) || kerrors.IsUnauthorized(err)) {
			return id, err
		}
		if time.Since(logged) > 30*time.Second {
			log.Info("waiting for permission to keep the installation ID (Crossplane's RBAC manager grants it; or pass --installation-id)", "error", err.Error())
			logged = time.Now()
		}
		select {
		case <-ctx.Done():
			return "", err
		case <-time.After(2 * time.Second):
		}
	}
}

// defaultInstallationID is the installation ID kept in the ConfigMap
// provider-egressproxy-installation of the provider's namespace, made
// once: the UID of the kube-system namespace when the provider may read
// it (what earlier versions used, so their instances stay theirs), else
// random. Crossplane grants a provider ConfigMaps but no read of
// Namespaces.
func defaultInstallationID(ctx context.Context, c client.Client, namespace string) (string, error) {
	key := types.NamespacedName{Namespace: namespace, Name: installationConfigMap}
	cm := &corev1.ConfigMap{}
	err := c.Get(ctx, key, cm)
	switch {
	case err == nil:
		if id := cm.Data["id"]; id != "" {
			return id, nil
		}
		return "", errors.Errorf("ConfigMap %s has no data.id: put the installation ID back, or pass --installation-id", key)
	case !kerrors.IsNotFound(err):
		return "", errors.Wrapf(err, "cannot read ConfigMap %s, which holds the installation ID (or pass --installation-id)", key)
	}

	id, err := kubeSystemID(ctx, c)
	if err != nil {
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		// 8 hex characters, as the kube-system form has.
		id = "r" + hex.EncodeToString(b)
	}
	cm = &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: installationConfigMap,
			Labels: map[string]string{"app.kubernetes.io/managed-by": "provider-egressproxy"}},
		Data: map[string]string{"id": id},
	}
	if err := c.Create(ctx, cm); err != nil {
		if kerrors.IsAlreadyExists(err) {
			// Another replica made it first: use its ID.
			return defaultInstallationID(ctx, c, namespace)
		}
		return "", errors.Wrapf(err, "cannot create ConfigMap %s to keep the installation ID (or pass --installation-id)", key)
	}
	return id, nil
}

// kubeSystemID is "k" and the first 8 characters of the kube-system
// namespace's UID: stable for the life of a cluster, different between
// clusters.
func kubeSystemID(ctx context.Context, r client.Reader) (string, error) {
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, types.NamespacedName{Name: "kube-system"}, ns); err != nil {
		return "", err
	}
	return "k" + string(ns.UID)[:8], nil
}
