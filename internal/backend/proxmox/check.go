package proxmox

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Health reasons of this backend, besides the shared proxy.Reason*.
const (
	// ReasonCertificateInvalid: the API's certificate was refused (wrong
	// CA, wrong host name, expired).
	ReasonCertificateInvalid = "CertificateInvalid"
	// ReasonStorageNotFound: proxmox.isoStorage is missing, inactive or
	// holds no ISOs on the node.
	ReasonStorageNotFound = "StorageNotFound"
	// ReasonTemplateNotFound: a catalogue template does not exist or is not
	// a template.
	ReasonTemplateNotFound = "TemplateNotFound"
	// ReasonNodeOffline: the cluster lists the node as offline.
	ReasonNodeOffline = "NodeOffline"
)

// Check implements proxy.Driver: each configured node, concurrently. One
// /version and one /cluster/resources serve every node; then per node its
// status (version, kernel) and its ISO storage. Templates are checked
// cluster-wide and reported on every node.
func (d *Driver) Check(ctx context.Context) proxy.Health {
	d.warn(ctx)
	targets := make([]proxy.TargetHealth, len(d.cfg.Nodes))
	for i, n := range d.cfg.Nodes {
		targets[i] = proxy.TargetHealth{Target: n, Address: d.cfg.URL, Details: map[string]string{"isoStorage": d.cfg.ISOStorage}}
	}
	unhealthy := func(t *proxy.TargetHealth, reason, msg string) {
		t.Healthy, t.Reason, t.Message = false, reason, msg
	}
	all := func(reason, msg string) proxy.Health {
		for i := range targets {
			unhealthy(&targets[i], reason, msg)
		}
		return proxy.Health{Targets: targets}
	}
	if err := ctx.Err(); err != nil {
		return all(proxy.ReasonTimeout, "the check's time ran out before it started")
	}
	if d.creds != nil {
		c, err := d.creds(ctx)
		if err != nil {
			return all(proxy.ReasonCredentialsUnavailable, err.Error())
		}
		id, err := TokenID(c.Token)
		if err != nil {
			return all(proxy.ReasonCredentialsUnavailable, err.Error())
		}
		for i := range targets {
			targets[i].Details["tokenID"] = id
		}
	}
	v, err := d.api.Version(ctx)
	if err != nil {
		r, m := d.reason(ctx, err)
		return all(r, m)
	}
	res, err := d.api.Resources(ctx, "")
	if err != nil {
		r, m := d.reason(ctx, err)
		return all(r, m)
	}
	idx := indexVMs(res)
	var tmplProblems, tmplDetails []string
	for _, key := range sortedKeys(d.cfg.Templates) {
		id := d.cfg.Templates[key]
		e, ok := idx.byID[id]
		switch {
		case !ok:
			tmplProblems = append(tmplProblems, fmt.Sprintf("template %q (VMID %d) does not exist", key, id))
		case !bool(e.Template):
			tmplProblems = append(tmplProblems, fmt.Sprintf("VM %d (template %q) is not a template", id, key))
		case d.quiet() && !slices.Contains(d.cfg.Nodes, e.Node):
			// A node name only the API knows is its answer.
			tmplDetails = append(tmplDetails, fmt.Sprintf("%s=%d", key, id))
		default:
			tmplDetails = append(tmplDetails, fmt.Sprintf("%s=%d@%s", key, id, e.Node))
		}
	}
	var wg sync.WaitGroup
	for i := range targets {
		wg.Add(1)
		go func(t *proxy.TargetHealth) {
			defer wg.Done()
			t.Details["pveVersion"] = d.answered(v.Version)
			t.Details["templates"] = strings.Join(tmplDetails, ",")
			if st, ok := idx.nodes[t.Target]; ok && st != "online" {
				st = d.word(st, nodeStatuses)
				unhealthy(t, ReasonNodeOffline, fmt.Sprintf("the cluster lists node %s as %s", t.Target, st))
				return
			} else if !ok {
				unhealthy(t, proxy.ReasonAPIError, fmt.Sprintf("node %s is not a member of the cluster", t.Target))
				return
			}
			ns, err := d.api.NodeStatus(ctx, t.Target)
			if err != nil {
				r, m := d.reason(ctx, err)
				unhealthy(t, r, m)
				return
			}
			t.Details["kernel"] = d.answered(ns.CurrentKernel.Release)
			if ns.PVEVersion != "" {
				t.Details["pveVersion"] = d.answered(ns.PVEVersion)
			}
			ss, err := d.api.StorageStatus(ctx, t.Target, d.cfg.ISOStorage)
			if err != nil {
				r, m := d.reason(ctx, err)
				if statusOf(err) == 500 {
					r = ReasonStorageNotFound
				}
				unhealthy(t, r, m)
				return
			}
			t.Details["isoStorageAvailGiB"] = strconv.FormatInt(ss.Avail>>30, 10)
			switch {
			case !bool(ss.Active) || !bool(ss.Enabled):
				unhealthy(t, ReasonStorageNotFound, fmt.Sprintf("storage %s is not active on node %s", d.cfg.ISOStorage, t.Target))
				return
			case !slices.Contains(strings.Split(ss.Content, ","), "iso"):
				content := " (content: " + ss.Content + ")"
				if d.quiet() {
					content = ""
				}
				unhealthy(t, ReasonStorageNotFound, fmt.Sprintf("storage %s of node %s does not hold ISO images%s: allow iso on it", d.cfg.ISOStorage, t.Target, content))
				return
			}
			if len(tmplProblems) > 0 {
				unhealthy(t, ReasonTemplateNotFound, strings.Join(tmplProblems, "; "))
				return
			}
			t.Healthy = true
		}(&targets[i])
	}
	wg.Wait()
	return proxy.Health{Targets: targets}
}

// quiet: the API is a tenant's (a namespaced config's), whose words are
// never quoted in status.
func (d *Driver) quiet() bool { return d.cfg.Guard != nil }

// answered is a version string the API answered, as the health details
// show it: as it is for the platform's API, only its numbers for a
// tenant's (netguard.Version).
func (d *Driver) answered(v string) string {
	if d.quiet() {
		return netguard.Version(v)
	}
	return v
}

// reason maps an error of the check to a health reason and a message.
func (d *Driver) reason(ctx context.Context, err error) (string, string) {
	msg := err.Error()
	var ae *APIError
	var pe *proxy.Error
	switch {
	case errors.As(err, &pe) && pe.Reason == ReasonCertificateInvalid:
		return ReasonCertificateInvalid, msg
	case ctx.Err() != nil:
		return proxy.ReasonTimeout, "the check's time ran out: " + msg
	case isTLSVerification(err):
		return ReasonCertificateInvalid, msg
	case errors.As(err, &ae) && ae.Status == 401:
		return proxy.ReasonUnauthorized, msg
	case errors.As(err, &ae) && ae.Status == 403:
		return proxy.ReasonForbidden, msg
	case isUnreachable(err):
		return proxy.ReasonUnreachable, msg
	case proxy.IsPermanent(err):
		return proxy.ReasonCredentialsUnavailable, msg
	}
	return proxy.ReasonAPIError, msg
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
