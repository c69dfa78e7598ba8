package netguard

// ForContent returns the guard of downloads whose bytes reach the tenant
// (an image a namespaced config or a proxy names by URL, uploaded into a
// pool the tenant's VMs boot from): g refusing, besides what g refuses,
// every address that is not public, whether or not the cluster's
// networks are known (a private network holds more than the cluster),
// and opening only the ranges the platform team allows for content
// (Options.ContentAllowed), not those it allows for tenants' endpoints.
// A nil Guard (the platform's configs) stays nil.
func (g *Guard) ForContent() *Guard {
	if g == nil {
		return nil
	}
	c := *g
	c.allowed, c.content = g.contentAllowed, true
	return &c
}
