package kubernetes_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// remoteIdentityTests: a config reaching a cluster with an identity of its
// own is checked for every permission the driver uses there, not only for
// read and list. The identity is a user the admin impersonates, granted
// exactly kubernetes.Permissions: with all of them, Check is healthy and a
// proxy's whole life (Create, Get, Update, List, Delete) runs, so the list
// is enough; with any one taken away, Check is unhealthy and names it.
func (e *env) remoteIdentityTests(t *testing.T) {
	ctx := context.Background()
	ns := e.namespace(t)
	user := "pt-remote-" + ns
	perms := kubernetes.Permissions(ns, false)

	cfg := *e.cp.Config
	cfg.Impersonate.UserName = user
	c, err := client.New(&cfg, client.Options{Scheme: e.scheme})
	if err != nil {
		t.Fatal(err)
	}
	d := kubernetes.New(kubernetes.Options{Provider: testProvider, Config: kubernetes.Config{Namespace: ns}, Client: c, Host: cfg.Host})

	t.Run("AllPermissionsHealthyAndEnough", func(t *testing.T) {
		e.grant(t, user, ns, perms)
		waitFor(t, "Check with every permission of kubernetes.Permissions to be healthy", func() (bool, string) {
			h := d.Check(ctx)
			return h.Healthy(), fmt.Sprintf("%+v", h)
		})
		req := request("remote-perms")
		inst, err := d.Create(ctx, req)
		if err != nil {
			t.Fatalf("Create with exactly kubernetes.Permissions = %v; want it to succeed (a permission the driver uses is missing from the list)", err)
		}
		if _, err := d.Get(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Live: true}); err != nil {
			t.Errorf("Get = %v", err)
		}
		req.Proxy.AllowedPorts = []int32{443, 8443}
		// Retried as the reconciler would: the Deployment controller's status
		// writes may come between the read and the write.
		waitFor(t, "Update to succeed", func() (bool, string) {
			_, err := d.Update(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}, req)
			return err == nil || !strings.Contains(err.Error(), "the object has been modified"), fmt.Sprint(err)
		})
		if _, err := d.Update(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}, req); err != nil {
			t.Errorf("Update = %v", err)
		}
		// Two replicas bring a disruption budget, one takes it away.
		for _, n := range []int32{2, 1} {
			if err := updateRetried(t, d, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}, withReplicas(req, n)); err != nil {
				t.Errorf("Update to %d replicas = %v", n, err)
			}
		}
		if _, err := d.List(ctx, testInstallation); err != nil {
			t.Errorf("List = %v", err)
		}
		if err := d.Delete(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark}); err != nil {
			t.Errorf("Delete = %v", err)
		}
	})

	for _, drop := range []string{"create deployments.apps", "delete deployments.apps", "update secrets", "list servicecidrs.networking.k8s.io", "get namespaces"} {
		t.Run("Without/"+drop, func(t *testing.T) {
			some := slices.DeleteFunc(slices.Clone(perms), func(p kubernetes.Permission) bool { return strings.HasPrefix(p.String(), drop+" ") })
			if len(some) != len(perms)-1 {
				t.Fatalf("%q matches %d permissions of %v; want 1", drop, len(perms)-len(some), perms)
			}
			e.grant(t, user, ns, some)
			// Each missing permission is named, in the one message.
			waitFor(t, "Check to be "+proxy.ReasonForbidden+" naming "+drop, func() (bool, string) {
				h := d.Check(ctx)
				m := h.Targets[0].Message
				return !h.Healthy() && h.Targets[0].Reason == proxy.ReasonForbidden && strings.Contains(m, "may not "+drop+" ") && strings.Contains(m, "docs/pod-proxy.md"),
					fmt.Sprintf("%+v", h)
			})
		})
	}
}

// grant makes the RBAC objects that give user exactly ps (replacing what
// an earlier grant gave): a Role per namespace, a ClusterRole for the
// cluster-wide ones.
func (e *env) grant(t *testing.T, user, ns string, ps []kubernetes.Permission) {
	t.Helper()
	ctx := context.Background()
	rules := map[string][]rbacv1.PolicyRule{}
	for _, p := range ps {
		r := rbacv1.PolicyRule{APIGroups: []string{p.Group}, Resources: []string{p.Resource}, Verbs: []string{p.Verb}}
		if p.Name != "" {
			r.ResourceNames = []string{p.Name}
		}
		rules[p.Namespace] = append(rules[p.Namespace], r)
	}
	subject := []rbacv1.Subject{{Kind: rbacv1.UserKind, APIGroup: rbacv1.GroupName, Name: user}}
	put := func(obj client.Object) {
		_ = e.live.Delete(ctx, obj)
		if err := e.live.Create(ctx, obj); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.live.Delete(context.Background(), obj) })
	}
	for _, ns := range []string{ns, "default", ""} {
		if ns == "" {
			meta := metav1.ObjectMeta{Name: user}
			put(&rbacv1.ClusterRole{ObjectMeta: meta, Rules: rules[""]})
			put(&rbacv1.ClusterRoleBinding{ObjectMeta: meta, Subjects: subject, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: user}})
			continue
		}
		meta := metav1.ObjectMeta{Name: user, Namespace: ns}
		put(&rbacv1.Role{ObjectMeta: meta, Rules: rules[ns]})
		put(&rbacv1.RoleBinding{ObjectMeta: meta, Subjects: subject, RoleRef: rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: user}})
	}
}
