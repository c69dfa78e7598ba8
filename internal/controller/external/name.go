package external

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
	"github.com/crossplane/crossplane-runtime/v2/pkg/meta"
	"github.com/crossplane/crossplane-runtime/v2/pkg/reconciler/managed"
	"github.com/crossplane/crossplane-runtime/v2/pkg/resource"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// maxNameLength keeps names valid everywhere they land: a DNS label, a
// Compute Engine instance name, a libvirt domain, a Proxmox VM name.
const maxNameLength = 63

var notNameChar = regexp.MustCompile(`[^a-z0-9-]+`)

// InstanceName is the deterministic backend name of a managed resource:
// readable (namespace and name) and unique across namespaces and scopes
// (a short digest of the full identity, so "a-b/c" and "a/b-c" differ).
func InstanceName(mg resource.Object) string {
	identity := "cluster/" + mg.GetName()
	readable := mg.GetName()
	if ns := mg.GetNamespace(); ns != "" {
		identity = "namespaced/" + ns + "/" + mg.GetName()
		readable = ns + "-" + mg.GetName()
	}
	sum := sha256.Sum256([]byte(identity))
	suffix := hex.EncodeToString(sum[:])[:8]

	readable = notNameChar.ReplaceAllString(strings.ToLower(readable), "-")
	readable = strings.Trim(readable, "-")
	if max := maxNameLength - len(suffix) - 1; len(readable) > max {
		readable = strings.TrimRight(readable[:max], "-")
	}
	if readable == "" || readable[0] < 'a' || readable[0] > 'z' {
		// Compute Engine names must start with a letter.
		readable = "p" + readable
		if len(readable) > maxNameLength-len(suffix)-1 {
			readable = readable[:maxNameLength-len(suffix)-1]
		}
	}
	return readable + "-" + suffix
}

// NameInitializer sets the external-name annotation to InstanceName when it
// is not set, so every reconcile (and every restart) agrees on the name
// before anything is created. An external name set by the user (an
// Observe-only import) is kept.
//
// The same update adds the managed reconciler's finalizer, which the
// reconciler would otherwise add in an update of its own a moment later:
// one write instead of two for every new resource.
type NameInitializer struct {
	Kube client.Client
}

// Initialize implements managed.Initializer.
func (n NameInitializer) Initialize(ctx context.Context, mg resource.Managed) error {
	if meta.GetExternalName(mg) != "" {
		return nil
	}
	meta.SetExternalName(mg, InstanceName(mg))
	if !meta.WasDeleted(mg) {
		meta.AddFinalizer(mg, managed.FinalizerName)
	}
	return errors.Wrap(n.Kube.Update(ctx, mg), "cannot set the external-name annotation")
}
