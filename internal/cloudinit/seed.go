package cloudinit

import (
	"bytes"
	"strings"

	"github.com/kdomanski/iso9660"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// SeedLabel is the volume label cloud-init's NoCloud source looks for.
const SeedLabel = "cidata"

// SeedISO builds a NoCloud seed: an ISO 9660 image labelled cidata with
// user-data and meta-data at its root, and vendor-data when vendorData is
// not empty. It is built in memory (a few KiB) and rebuilt on every
// attempt, so a cut-off upload is never trusted.
func SeedISO(userData, metaData, vendorData string) ([]byte, error) {
	w, err := iso9660.NewWriter()
	if err != nil {
		return nil, proxy.Transientf("cloudinit: seed: %v", err)
	}
	defer func() { _ = w.Cleanup() }()
	files := map[string]string{"user-data": userData, "meta-data": metaData}
	if vendorData != "" {
		files["vendor-data"] = vendorData
	}
	for name, content := range files {
		if err := w.AddFile(strings.NewReader(content), name); err != nil {
			// The error names the file, never its content.
			return nil, proxy.Transientf("cloudinit: seed: adding %s: %v", name, err)
		}
	}
	var buf bytes.Buffer
	if err := w.WriteTo(&buf, SeedLabel); err != nil {
		return nil, proxy.Transientf("cloudinit: seed: %v", err)
	}
	return buf.Bytes(), nil
}
