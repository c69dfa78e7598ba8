//go:build linux

package controlplane

import "testing"

// pruneStale, built on every system, reads the node's record by a name of
// its own: the one the node writes.
func TestNodeRecordFileIsTheNodes(t *testing.T) {
	if nodeRecordFile != nodeDirFile {
		t.Fatalf("nodeRecordFile = %q; the node records its folder in %q", nodeRecordFile, nodeDirFile)
	}
}
