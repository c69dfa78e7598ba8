package provider

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/logging"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/cluster/v1alpha1"
	namespacedv1alpha1 "github.com/egressproxy/provider-egressproxy/apis/namespaced/v1alpha1"
	spec "github.com/egressproxy/provider-egressproxy/apis/spec/v1alpha1"
)

// installationConfigMap holds the installation ID in the provider's own
// namespace (key id). It has no owner, so it outlives the provider's
// revisions and an uninstall: a provider installed again marks and finds
// the same instances. Nothing stops its deletion, so the ID is also read
// back from where the provider records it on every check of a config
// (status.installationID), and a missing ConfigMap is made again from
// there (recoveredInstallationID).
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

	id, err := recoveredInstallationID(ctx, c)
	if err != nil {
		return "", errors.Wrapf(err, "ConfigMap %s, which holds the installation ID, does not exist", key)
	}
	if id == "" {
		id, err = kubeSystemID(ctx, c)
	}
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

// recoveredInstallationID is the installation ID the provider recorded in
// the status of the configs that use its own (no spec.installationID),
// "" when none has one (a new installation), and an error when they
// disagree or cannot be listed: a wrong guess would make every instance
// another installation's, and a new one would make the provider create
// every instance again beside the old ones.
//
// Only cluster-scoped configs count: a namespace's editors may write its
// ProviderConfigs' status, and so would choose the ID or stop the start.
func recoveredInstallationID(ctx context.Context, c client.Reader) (string, error) {
	seen := map[string][]string{}
	add := func(kind, name string, s spec.ProviderConfigSpec, st spec.ProviderConfigStatus) {
		if s.InstallationID == "" && st.InstallationID != "" {
			seen[st.InstallationID] = append(seen[st.InstallationID], kind+" "+name)
		}
	}
	cpcs := &namespacedv1alpha1.ClusterProviderConfigList{}
	legacy := &clusterv1alpha1.ProviderConfigList{}
	for _, l := range []client.ObjectList{cpcs, legacy} {
		err := c.List(ctx, l)
		switch {
		case apimeta.IsNoMatchError(err):
			// The kind is not installed: no config of it records anything.
		case err != nil:
			return "", errors.Wrap(err, "cannot list the ProviderConfigs that record it")
		}
	}
	for _, pc := range cpcs.Items {
		add("ClusterProviderConfig", pc.Name, pc.Spec.ProviderConfigSpec, pc.Status)
	}
	for _, pc := range legacy.Items {
		add("ProviderConfig (egressproxy.io)", pc.Name, pc.Spec.ProviderConfigSpec, pc.Status)
	}
	switch len(seen) {
	case 0:
		return "", nil
	case 1:
		for id := range seen {
			return id, nil
		}
	}
	ids := make([]string, 0, len(seen))
	for id, by := range seen {
		slices.Sort(by)
		ids = append(ids, fmt.Sprintf("%s (%s)", id, strings.Join(by, ", ")))
	}
	slices.Sort(ids)
	return "", errors.Errorf("the configs' status.installationID disagree: %s; create the ConfigMap with the right one as data.id, or pass --installation-id", strings.Join(ids, "; "))
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
