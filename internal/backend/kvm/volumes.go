package kvm

import (
	"bytes"
	"context"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"
	"github.com/kdomanski/iso9660"
	"libvirt.org/go/libvirtxml"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Volumes carry no mark of their own, so the driver touches a volume named
// after an instance (its overlay, its seed) only when it can tell it is
// that instance's: never one a domain other than the instance's uses, never
// a base image, and only one of the shape it creates. Anything else is
// left as it is and reported, so an external name cannot make Create or
// Delete replace someone else's disk.

// basePrefix starts every base image volume (see resolvedImage.volume). An
// instance name starting with it could name a base image's volume.
const basePrefix = "egressproxy-base-"

// userOf returns the name of a domain other than except that uses the
// volume (by its path, as a file or block disk, or by pool and volume
// name, as a volume disk), or "".
func userOf(ctx context.Context, api Libvirt, pool libvirt.StoragePool, vol libvirt.StorageVol, path, except string) (string, error) {
	doms, err := api.ConnectListAllDomains(ctx, libvirt.ConnectListDomainsActive|libvirt.ConnectListDomainsInactive)
	if err != nil {
		return "", err
	}
	for _, dom := range doms {
		if dom.Name == except {
			continue
		}
		x, err := api.DomainGetXMLDesc(ctx, dom)
		if isCode(err, libvirt.ErrNoDomain) {
			continue
		}
		if err != nil {
			return "", err
		}
		var def libvirtxml.Domain
		if err := def.Unmarshal(x); err != nil {
			// A definition libvirt gave but that does not parse: the
			// volume may be its disk, so it is not claimed.
			return dom.Name, nil
		}
		if def.Devices != nil && slices.ContainsFunc(def.Devices.Disks, func(d libvirtxml.DomainDisk) bool { return usesVolume(d, pool.Name, vol.Name, path) }) {
			return dom.Name, nil
		}
	}
	return "", nil
}

// usesVolume tells whether disk d is the volume.
func usesVolume(d libvirtxml.DomainDisk, pool, vol, path string) bool {
	switch s := d.Source; {
	case s == nil:
		return false
	case s.File != nil:
		return s.File.File == path
	case s.Block != nil:
		return s.Block.Dev == path
	case s.Volume != nil:
		return s.Volume.Pool == pool && s.Volume.Volume == vol
	}
	return false
}

// claimable refuses vol, named after instance name in pool, when a domain
// other than the instance's uses it.
func claimable(ctx context.Context, api Libvirt, pool libvirt.StoragePool, vol libvirt.StorageVol, name, hostName string) (string, error) {
	path, err := api.StorageVolGetPath(ctx, vol)
	if err != nil {
		return "", err
	}
	user, err := userOf(ctx, api, pool, vol, path, name)
	if err != nil {
		return "", err
	}
	if user != "" {
		return "", proxy.Permanentf("volume %s in pool %s on host %s is a disk of domain %s; it is left as it is: choose another external name",
			vol.Name, pool.Name, hostName, user)
	}
	return path, nil
}

// isOverlay reports whether vol is an overlay as the driver creates them:
// qcow2 backed by a base image volume.
func isOverlay(ctx context.Context, api Libvirt, vol libvirt.StorageVol) (volDesc, bool, error) {
	x, err := api.StorageVolGetXMLDesc(ctx, vol)
	if err != nil {
		return volDesc{}, false, err
	}
	desc, err := parseVolDesc(x)
	if err != nil {
		return volDesc{}, false, nil
	}
	base := desc.BackingStore.Path
	i := strings.LastIndex(base, "/")
	return desc, base != "" && strings.HasPrefix(base[i+1:], basePrefix), nil
}

// seedInfo is what a volume says of itself as a seed.
type seedInfo struct {
	// seed: a NoCloud seed (labelled cidata), or a cut-off upload of one.
	seed bool
	// cut: an upload cut off by a crash (zeros, or a label without
	// readable files); hostname and mark are then unknown.
	cut bool
	// hostname is the meta-data's local-hostname: the instance's name.
	hostname string
	// mark is the ownership mark the meta-data carries (seedMarkLines);
	// empty for a seed of an earlier version.
	mark proxy.Mark
	// modified is when the volume was written, if the pool says.
	modified time.Time
}

// of reports whether the seed is one the driver made for the instance
// name: an ISO labelled cidata whose meta-data names it, or what an
// upload of one cut off by a crash leaves.
func (si seedInfo) of(name string) bool { return si.seed && (si.cut || si.hostname == name) }

// foreign reports whether the seed carries a mark other than m: it is
// another resource's, and so is the overlay of its name.
func (si seedInfo) foreign(m proxy.Mark) bool { return si.mark != (proxy.Mark{}) && si.mark != m }

// The meta-data keys of a seed's mark: cloud-init ignores keys it does
// not know.
const (
	metaUID          = "egressproxy-uid: "
	metaInstallation = "egressproxy-installation: "
)

// seedMarkLines is the mark as meta-data lines, so that a seed left
// without its domain can be told apart: whose, and which installation's.
func seedMarkLines(m proxy.Mark) string {
	return metaUID + m.UID + "\n" + metaInstallation + m.InstallationID + "\n"
}

// readSeed reads vol, when it is no larger than seedReserve and backed
// by nothing, as a seed.
func readSeed(ctx context.Context, api Libvirt, vol libvirt.StorageVol) (seedInfo, error) {
	x, err := api.StorageVolGetXMLDesc(ctx, vol)
	if err != nil {
		return seedInfo{}, err
	}
	desc, err := parseVolDesc(x)
	if err != nil || desc.Capacity == 0 || desc.Capacity > seedReserve || desc.BackingStore.Path != "" {
		return seedInfo{}, nil
	}
	var buf bytes.Buffer
	if err := api.StorageVolDownload(ctx, vol, &buf, desc.Capacity); err != nil {
		return seedInfo{}, err
	}
	if !bytes.ContainsFunc(buf.Bytes(), func(r rune) bool { return r != 0 }) {
		// Created and never written, or cut off within the ISO's system
		// area (its first 32 KiB are zeros): a crashed upload of ours.
		return seedInfo{seed: true, cut: true}, nil
	}
	img, err := iso9660.OpenImage(bytes.NewReader(buf.Bytes()))
	if err != nil {
		return seedInfo{}, nil
	}
	if label, err := img.Label(); err != nil || label != cloudinit.SeedLabel {
		return seedInfo{}, nil
	}
	cut := seedInfo{seed: true, cut: true} // a seed cut off after its label
	root, err := img.RootDir()
	if err != nil {
		return cut, nil
	}
	files, err := root.GetChildren()
	if err != nil {
		return cut, nil
	}
	for _, f := range files {
		if f.Name() != "meta-data" {
			continue
		}
		b, err := io.ReadAll(io.LimitReader(f.Reader(), 64<<10))
		if err != nil {
			return seedInfo{}, nil
		}
		si := seedInfo{seed: true, modified: desc.modified()}
		for _, line := range strings.Split(string(b), "\n") {
			line = strings.TrimSpace(line)
			switch {
			case strings.HasPrefix(line, "local-hostname: "):
				si.hostname = cloudinit.MetaValue(strings.TrimPrefix(line, "local-hostname: "))
			case strings.HasPrefix(line, metaUID):
				si.mark.UID = strings.TrimPrefix(line, metaUID)
			case strings.HasPrefix(line, metaInstallation):
				si.mark.InstallationID = strings.TrimPrefix(line, metaInstallation)
			}
		}
		return si, nil
	}
	return seedInfo{}, nil
}

// ownVolumes returns the overlay and the seed of instance name that are
// its own (see the top of this file), whether or not its domain exists;
// others of the same names are left out, with a log line.
//
// A seed that carries a mark other than mark (seedMarkLines) is another
// resource's, and so is the overlay of its name: neither is returned.
func (d *Driver) ownVolumes(ctx context.Context, api Libvirt, pool libvirt.StoragePool, name, hostName string, mark proxy.Mark) ([]libvirt.StorageVol, error) {
	var out []libvirt.StorageVol
	for _, vn := range []string{seedName(name), overlayName(name)} {
		v, err := api.StorageVolLookupByName(ctx, pool, vn)
		if isCode(err, libvirt.ErrNoStorageVol) {
			continue
		}
		if err != nil {
			return nil, err
		}
		if _, err := claimable(ctx, api, pool, v, name, hostName); err != nil {
			if !proxy.IsPermanent(err) {
				return nil, err
			}
			d.log(ctx).Info("kvm leaves a volume another domain uses", "host", hostName, "volume", vn)
			continue
		}
		var own bool
		if vn == overlayName(name) {
			_, own, err = isOverlay(ctx, api, v)
		} else {
			var si seedInfo
			si, err = readSeed(ctx, api, v)
			own = si.of(name)
			if own && si.foreign(mark) {
				d.log(ctx).Info("kvm leaves the volumes of another resource", "host", hostName, "volume", vn)
				return nil, nil
			}
		}
		if err != nil {
			return nil, err
		}
		if !own {
			d.log(ctx).Info("kvm leaves a volume it did not create", "host", hostName, "volume", vn)
			continue
		}
		// The overlay (read second) goes first, as the domain uses them.
		out = append([]libvirt.StorageVol{v}, out...)
	}
	return out, nil
}

// deleteOwnVolumes deletes the overlay and the seed of instance name when
// they are its own (ownVolumes).
func (d *Driver) deleteOwnVolumes(ctx context.Context, api Libvirt, pool libvirt.StoragePool, name, hostName string, mark proxy.Mark) error {
	vols, err := d.ownVolumes(ctx, api, pool, name, hostName, mark)
	if err != nil {
		return err
	}
	for _, v := range vols {
		if err := api.StorageVolDelete(ctx, v); err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
			return err
		}
	}
	return nil
}

// leftovers reports the volumes a Create cut short left of instance name
// on h, for a resource being deleted whose domain is missing (see
// proxy.Ref.Deleting): NotFound when there are none.
func (d *Driver) leftovers(ctx context.Context, api Libvirt, h Host, name string, mark proxy.Mark) (proxy.Instance, error) {
	missing := proxy.NotFoundf("domain %s does not exist on host %s", name, h.Name)
	pool, err := api.StoragePoolLookupByName(ctx, h.pool())
	if isCode(err, libvirt.ErrNoStoragePool) {
		return proxy.Instance{}, missing
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	vols, err := d.ownVolumes(ctx, api, pool, name, h.Name, mark)
	if err != nil {
		return proxy.Instance{}, err
	}
	if len(vols) == 0 {
		return proxy.Instance{}, missing
	}
	names := make([]string, len(vols))
	for i, v := range vols {
		names[i] = v.Name
	}
	return proxy.Instance{ID: formatID(h.Name, name), Name: name, Mark: mark, State: proxy.StateStopped,
		Progress: "no domain; volumes " + strings.Join(names, ", ") + " remain in pool " + pool.Name + " and are deleted with the resource"}, nil
}
