package kvm_test

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
)

// runSuffix is this test process's own (its PID and a random part), for
// the names and installation IDs a test uses on the real libvirtd, which
// concurrent runs share: their domains and volumes never match it.
func runSuffix() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b))
}

// baseVolumes are the names of the base image volume the driver downloads
// for a catalogue entry and its digest marker (resolvedImage.volume and
// marker).
func baseVolumes(key, url, sha256Hex, format string) []string {
	h := sha256.Sum256([]byte(url + "\n" + strings.ToLower(sha256Hex) + "\n" + format))
	v := fmt.Sprintf("egressproxy-base-%s-%s.%s", key, hex.EncodeToString(h[:])[:12], format)
	return []string{v, v + ".sha256"}
}

// deleteVolumes deletes those of names that are in the host's pool, and no
// other volume.
func deleteVolumes(t *testing.T, h *kvmtest.Host, names ...string) {
	t.Helper()
	have := h.Volumes(t)
	for _, v := range names {
		if slices.Contains(have, v) {
			h.Virsh(t, "vol-delete", "--pool", h.Values["POOL"], v)
		}
	}
}
