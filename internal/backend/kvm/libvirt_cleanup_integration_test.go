package kvm_test

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
)

// runSuffix is this test process's own (its PID and a random part), for
// the names and installation IDs a test uses on the real libvirtd, which
// concurrent runs share: their domains and volumes never match it.
func runSuffix() string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%d-%s", os.Getpid(), hex.EncodeToString(b))
}
