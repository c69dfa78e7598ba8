package writes

import (
	"context"
	"encoding/json"
	"maps"
	"slices"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// crossplane-runtime's connection publisher writes an existing connection
// Secret with a JSON merge patch of the whole Secret, which adds and
// changes keys but never removes one. A key the details no longer hold (a
// password once authentication is off, an egress address no longer
// known) would stay in the Secret, and the Secret would never match the
// details again. withoutStaleKeys makes such a patch remove every key of
// keys (the provider's own) that the details leave out; keys of anyone
// else stay.

// withoutStaleKeys is patch, of obj, with every key of keys that its data
// leaves out set to null, when it is a merge patch of a connection Secret
// with data; otherwise patch itself.
func withoutStaleKeys(obj client.Object, patch client.Patch, keys []string) client.Patch {
	if _, ok := isConnectionSecret(obj); !ok || len(keys) == 0 {
		return patch
	}
	return editMerge(obj, patch, func(p map[string]any) bool {
		data, ok := p["data"].(map[string]any)
		if !ok || len(data) == 0 {
			return false
		}
		if !slices.ContainsFunc(slices.Collect(maps.Values(data)), func(v any) bool { return v != nil }) {
			// Only keys to remove (removals): the others stay as they are.
			return false
		}
		for _, k := range keys {
			if _, held := data[k]; !held {
				data[k] = nil
			}
		}
		return true
	})
}

// editMerge is patch, a JSON merge patch of obj, as edit changes it; patch
// itself when it is another kind of patch or edit changes nothing.
func editMerge(obj client.Object, patch client.Patch, edit func(p map[string]any) (changed bool)) client.Patch {
	if patch.Type() != types.MergePatchType {
		return patch
	}
	b, err := patch.Data(obj)
	if err != nil {
		return patch
	}
	var p map[string]any
	if err := json.Unmarshal(b, &p); err != nil || !edit(p) {
		return patch
	}
	out, err := json.Marshal(p)
	if err != nil {
		return patch
	}
	return client.RawPatch(types.MergePatchType, out)
}

// keysClient is a client whose connection Secret patches remove the stale
// keys of keys.
type keysClient struct {
	client.Client
	keys []string
}

// Create makes no key of obj's data without a value (removals).
func (c keysClient) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if s, ok := isConnectionSecret(obj); ok {
		withoutRemovals(s)
	}
	return c.Client.Create(ctx, obj, opts...)
}

func (c keysClient) Patch(ctx context.Context, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
	return c.Client.Patch(ctx, obj, withoutStaleKeys(obj, patch, c.keys), opts...)
}

// RemovingStaleKeys returns mgr as crossplane-runtime's reconcilers should
// see it when they write through mgr's own client: the same manager, with
// connection Secret patches that remove the keys of keys the details leave
// out. (A Client does the same with its ConnectionKeys.)
func RemovingStaleKeys(mgr manager.Manager, keys []string) manager.Manager {
	return view{Manager: mgr, client: keysClient{Client: mgr.GetClient(), keys: keys}}
}
