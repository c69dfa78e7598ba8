package proxy

import "context"

type tenantKey struct{}

// WithTenant returns ctx carrying namespace, the namespace of the managed
// resource a call is for ("" for a cluster-scoped one): what a driver
// shares among tenants by itself (KVM's image downloads) is shared by it.
func WithTenant(ctx context.Context, namespace string) context.Context {
	if namespace == "" {
		return ctx
	}
	return context.WithValue(ctx, tenantKey{}, namespace)
}

// TenantOf is the namespace WithTenant put in ctx, "" when none.
func TenantOf(ctx context.Context) string {
	ns, _ := ctx.Value(tenantKey{}).(string)
	return ns
}
