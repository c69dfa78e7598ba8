package controlplane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A folder named for the control plane's data that holds something else
// (a home folder with its bin) is refused and left as it is; a new or
// empty folder, or one an earlier control plane used, is taken.
func TestPrepareDirTakesOnlyAFolderOfItsOwn(t *testing.T) {
	home := t.TempDir()
	if err := os.MkdirAll(filepath.Join(home, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(home, "bin", "tool"), []byte("mine"), 0o755); err != nil {
		t.Fatal(err)
	}
	var c ControlPlane
	if err := c.prepareDir(home); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("prepareDir of a folder holding other things = %v; want a refusal", err)
	}
	if b, err := os.ReadFile(filepath.Join(home, "bin", "tool")); err != nil || string(b) != "mine" {
		t.Errorf("the folder's bin/tool after the refusal: %q, %v; want it kept", b, err)
	}

	for name, dir := range map[string]string{"new": filepath.Join(t.TempDir(), "cp"), "empty": t.TempDir()} {
		var c ControlPlane
		if err := c.prepareDir(dir); err != nil {
			t.Errorf("prepareDir of a %s folder = %v", name, err)
		}
		if err := os.MkdirAll(filepath.Join(dir, "bin"), 0o755); err != nil {
			t.Fatal(err)
		}
		var again ControlPlane
		if err := again.prepareDir(dir); err != nil {
			t.Errorf("prepareDir of a %s folder an earlier control plane used = %v", name, err)
		}
	}
}
