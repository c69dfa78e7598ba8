package proxmox

import (
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// What the driver writes on a VM, and why where:
//
//   - Tags carry the ownership mark and the spec hash. /cluster/resources
//     lists every guest's tags, so one request tells Get whose a VM is and
//     whether it is complete, without reading its config: that is what
//     keeps an Observe at two requests. The clone call cannot set tags, so
//     they are written by the configure step.
//   - The description carries the mark too (written by the clone call
//     itself, so a VM is marked from the moment it has a name), plus what
//     only the driver needs now and then: the creation time, the proxy
//     port, where the seed ISO was uploaded and an update in progress.
//
// Proxmox tags are lowercase [a-z0-9_][a-z0-9_+.-]*, which a Kubernetes
// UID, an installation ID and a hash all are.
const (
	// TagManaged is on every VM the provider manages.
	TagManaged = "egressproxy"
	// TagUIDPrefix + the managed resource's UID.
	TagUIDPrefix = "ep-u-"
	// TagInstallationPrefix + the installation ID.
	TagInstallationPrefix = "ep-i-"
	// TagSpecPrefix + proxy.Hash of the request the VM was completed
	// with; absent until its first start was done.
	TagSpecPrefix = "ep-s-"
)

var tagRe = regexp.MustCompile(`^[a-z0-9_][a-z0-9_+.\-]*$`)

// tags is a parsed tag list.
type tags struct {
	managed bool
	mark    proxy.Mark
	spec    string
	others  []string // tags that are not ours, kept as they are
}

func splitTags(s string) []string {
	return strings.FieldsFunc(s, func(r rune) bool { return r == ';' || r == ',' || r == ' ' })
}

func parseTags(s string) tags {
	var t tags
	for _, tag := range splitTags(s) {
		switch {
		case tag == TagManaged:
			t.managed = true
		case strings.HasPrefix(tag, TagUIDPrefix):
			t.mark.UID = strings.TrimPrefix(tag, TagUIDPrefix)
		case strings.HasPrefix(tag, TagInstallationPrefix):
			t.mark.InstallationID = strings.TrimPrefix(tag, TagInstallationPrefix)
		case strings.HasPrefix(tag, TagSpecPrefix):
			t.spec = strings.TrimPrefix(tag, TagSpecPrefix)
		default:
			t.others = append(t.others, tag)
		}
	}
	t.managed = t.managed && t.mark.UID != ""
	return t
}

// String renders the tags: the VM's own first, then ours.
func (t tags) String() string {
	out := slices.Clone(t.others)
	out = append(out, TagManaged, TagUIDPrefix+t.mark.UID, TagInstallationPrefix+t.mark.InstallationID)
	if t.spec != "" {
		out = append(out, TagSpecPrefix+t.spec)
	}
	return strings.Join(out, ";")
}

// MarkTags returns the tags that mark a VM as the resource's, with the
// spec hash when spec is not empty: what a complete VM carries.
func MarkTags(mark proxy.Mark, spec string) string {
	return tags{mark: mark, spec: spec}.String()
}

// checkMark refuses marks that cannot be written as tags.
func checkMark(m proxy.Mark) error {
	if !tagRe.MatchString(TagUIDPrefix+m.UID) || m.UID == "" {
		return proxy.Permanentf("the resource UID %q cannot be written as a Proxmox tag", m.UID)
	}
	if !tagRe.MatchString(TagInstallationPrefix+m.InstallationID) || m.InstallationID == "" {
		return proxy.Permanentf("the installation ID %q cannot be written as a Proxmox tag", m.InstallationID)
	}
	return nil
}

// description is what the driver keeps in a VM's description.
type description struct {
	name      string
	mark      proxy.Mark
	createdAt time.Time
	port      int
	// seedNode and seedVolID say where the seed ISO was uploaded; the node
	// matters on node-local storage, after a migration too.
	seedNode, seedVolID string
	// applying is the spec hash of an update whose seed is uploaded and
	// whose reboot is pending; applyingSince is that upload's start (the
	// server's clock, from its UPID).
	applying      string
	applyingSince int64
	// rebootedBefore are the reboots that started in applyingSince's
	// second before the upload: not the reboot that applies it.
	rebootedBefore []string
	// rest is the admin's text, kept.
	rest []string
}

const (
	descHeader = "Egress proxy managed by provider-egressproxy: do not edit the egressproxy- lines or the ep- tags."
	descPrefix = "egressproxy-"
)

func (d description) String() string {
	lines := []string{descHeader,
		descPrefix + "name: " + d.name,
		descPrefix + "uid: " + d.mark.UID,
		descPrefix + "installation: " + d.mark.InstallationID,
	}
	if !d.createdAt.IsZero() {
		lines = append(lines, descPrefix+"created-at: "+d.createdAt.UTC().Format(time.RFC3339))
	}
	if d.port != 0 {
		lines = append(lines, descPrefix+"port: "+strconv.Itoa(d.port))
	}
	if d.seedVolID != "" {
		lines = append(lines, descPrefix+"seed: "+d.seedNode+" "+d.seedVolID)
	}
	if d.applying != "" {
		lines = append(lines, strings.Join(append([]string{fmt.Sprintf("%sapplying: %s %d", descPrefix, d.applying, d.applyingSince)}, d.rebootedBefore...), " "))
	}
	lines = append(lines, d.rest...)
	return strings.Join(lines, "\n")
}

func parseDescription(s string) description {
	var d description
	for _, line := range strings.Split(strings.ReplaceAll(s, "\r\n", "\n"), "\n") {
		trimmed := strings.TrimSpace(line)
		key, val, ok := strings.Cut(strings.TrimPrefix(trimmed, descPrefix), ": ")
		if trimmed == descHeader {
			continue
		}
		if !strings.HasPrefix(trimmed, descPrefix) || !ok {
			if trimmed != "" {
				d.rest = append(d.rest, line)
			}
			continue
		}
		val = strings.TrimSpace(val)
		switch key {
		case "name":
			d.name = val
		case "uid":
			d.mark.UID = val
		case "installation":
			d.mark.InstallationID = val
		case "created-at":
			d.createdAt, _ = time.Parse(time.RFC3339, val)
		case "port":
			d.port, _ = strconv.Atoi(val)
		case "seed":
			d.seedNode, d.seedVolID, _ = strings.Cut(val, " ")
		case "applying":
			f := strings.Fields(val)
			if len(f) < 2 {
				f = append(f, "", "")
			}
			d.applying = f[0]
			d.applyingSince, _ = strconv.ParseInt(f[1], 10, 64)
			d.rebootedBefore = f[2:]
		default:
			d.rest = append(d.rest, line)
		}
	}
	return d
}

// MarkDescription returns the description a VM of the resource carries
// from its clone on (for tests that make such a VM by hand).
func MarkDescription(name string, mark proxy.Mark, createdAt time.Time) string {
	return description{name: name, mark: mark, createdAt: createdAt}.String()
}

// ID formats are vms/<vmid>/<name>: no node, because VMs migrate; the
// name so that a VMID reused by another VM is not mistaken for ours.
var idRe = regexp.MustCompile(`^vms/([1-9][0-9]{2,8})/([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$`)

func formatID(vmid int, name string) string { return fmt.Sprintf("vms/%d/%s", vmid, name) }

func parseID(id string) (int, string, error) {
	m := idRe.FindStringSubmatch(id)
	if m == nil {
		return 0, "", proxy.Permanentf("malformed instance ID %q: want vms/<vmid>/<name>", id)
	}
	vmid, _ := strconv.Atoi(m[1])
	return vmid, m[2], nil
}

// maxProbes is how many VMIDs one resource may try: its probe window.
const maxProbes = 32

// probeWindow returns the VMIDs a resource's VM may have, in the order
// Create tries them: from an FNV-1a hash of its UID into [lo, hi], going
// forward and wrapping. Concurrent creates of different resources start
// at different places, and one resource always looks at the same places,
// so a crash between clone and status write finds its VM again.
func probeWindow(uid string, lo, hi int) []int {
	span := hi - lo + 1
	if span <= 0 {
		return nil
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(uid))
	first := int(h.Sum64() % uint64(span))
	n := min(maxProbes, span)
	out := make([]int, 0, n)
	for i := range n {
		out = append(out, lo+(first+i)%span)
	}
	return out
}

// seedFile is the seed ISO's file name: the instance name and a UID
// prefix, so two installations' proxies of the same name never share one.
// parseSeedFile reads the proxy name and UID prefix back from a seed
// file name (seedFile); ok is false for any other file.
func parseSeedFile(file string) (name, uidPrefix string, ok bool) {
	rest, ok := strings.CutPrefix(file, "egressproxy-")
	if !ok {
		return "", "", false
	}
	rest, ok = strings.CutSuffix(rest, ".iso")
	i := strings.LastIndex(rest, "-")
	if !ok || i <= 0 {
		return "", "", false
	}
	name, uidPrefix = rest[:i], rest[i+1:]
	if !nameRe.MatchString(name) || uidPrefix == "" || len(uidPrefix) > 12 || strings.Trim(uidPrefix, "0123456789abcdefghijklmnopqrstuvwxyz") != "" {
		return "", "", false
	}
	return name, uidPrefix, true
}

func seedFile(name, uid string) string {
	u := strings.ReplaceAll(uid, "-", "")
	if len(u) > 12 {
		u = u[:12]
	}
	return "egressproxy-" + name + "-" + u + ".iso"
}
