package pvetest

import (
	"bytes"
	"io"
	"strings"

	"github.com/kdomanski/iso9660"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
)

// Seed is what a guest reads from a NoCloud seed ISO at boot.
type Seed struct {
	// Label is the volume label; cloud-init wants "cidata".
	Label string
	// UserData and MetaData are the two files of the seed.
	UserData, MetaData string
}

// readSeed opens an ISO the way a guest's cloud-init would look at it.
// ISO 9660 writers may mangle names (USER_DAT.;1), so names are compared
// loosely.
func readSeed(b []byte) (Seed, bool) {
	img, err := iso9660.OpenImage(bytes.NewReader(b))
	if err != nil {
		return Seed{}, false
	}
	var s Seed
	s.Label, _ = img.Label()
	root, err := img.RootDir()
	if err != nil {
		return Seed{}, false
	}
	kids, err := root.GetChildren()
	if err != nil {
		return Seed{}, false
	}
	for _, f := range kids {
		name := strings.ToLower(f.Name())
		name = strings.TrimSuffix(strings.SplitN(name, ";", 2)[0], ".")
		name = strings.ReplaceAll(name, "_", "-")
		data, err := io.ReadAll(f.Reader())
		if err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "user-dat"):
			s.UserData = string(data)
		case strings.HasPrefix(name, "meta-dat"):
			s.MetaData = string(data)
		}
	}
	return s, s.UserData != "" || s.MetaData != ""
}

// InstanceID is the instance-id of the seed's meta-data ("" when it names
// none).
func (s Seed) InstanceID() string {
	for _, l := range strings.Split(s.MetaData, "\n") {
		if v, ok := strings.CutPrefix(l, "instance-id:"); ok {
			return cloudinit.MetaValue(v)
		}
	}
	return ""
}
