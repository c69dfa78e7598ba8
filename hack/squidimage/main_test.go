package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage/registrytest"
)

// rootfs is a small root filesystem folder, its files last modified at
// mtime.
func rootfs(t *testing.T, mtime time.Time) string {
	t.Helper()
	dir := t.TempDir()
	for p, data := range map[string]string{"usr/sbin/squid": "#!/bin/sh\n", "etc/squid/squid.conf": "http_port 3128\n"} {
		f := filepath.Join(dir, p)
		if err := os.MkdirAll(filepath.Dir(f), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(f, []byte(data), 0o755); err != nil { //nolint:gosec // A test's file.
			t.Fatal(err)
		}
		if err := os.Chtimes(f, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func digestOf(t *testing.T, layoutDir string) string {
	t.Helper()
	b, err := os.ReadFile(layoutDir + ".digest") //nolint:gosec // The test's own folder.
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The same root filesystem written at different times gives the same
// digest; the layout, in a tar as hack/xpkg.sh makes it, pushes to a
// registry under that digest, which pulls back the image.
func TestLayoutReproducibleAndPushedByDigest(t *testing.T) {
	out := t.TempDir()
	var digests []string
	for i, mtime := range []time.Time{time.Unix(1_000_000, 0), time.Now()} {
		dir := filepath.Join(out, fmt.Sprintf("oci%d", i+1))
		if err := run(rootfs(t, mtime), "", "localhost/egressproxy/squid:test", "", "", dir); err != nil {
			t.Fatal(err)
		}
		digests = append(digests, digestOf(t, dir))
	}
	if digests[0] != digests[1] || !strings.HasPrefix(digests[0], "sha256:") {
		t.Fatalf("two builds of one root filesystem: digests %v; want one sha256 digest", digests)
	}

	archive := filepath.Join(out, "squid-egressproxy-v0.0.1.oci.tar")
	if b, err := exec.Command("tar", "--sort=name", "--mtime=@0", "--owner=0", "--group=0", "--numeric-owner",
		"-C", filepath.Join(out, "oci1"), "-cf", archive, ".").CombinedOutput(); err != nil {
		t.Fatalf("tar: %v\n%s", err, b)
	}
	reg := registrytest.Start(t)
	ctx := context.Background()
	got, err := reg.Client.PushLayout(ctx, archive, reg.Host+"/egressproxy/squid-egressproxy:v0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	want := reg.Host + "/egressproxy/squid-egressproxy@" + digests[0]
	if got != want {
		t.Errorf("pushed %q; want %q", got, want)
	}
	img, err := reg.Client.Pull(ctx, want, ociimage.Platform{OS: "linux", Architecture: runtime.GOARCH})
	if err != nil {
		t.Fatalf("pulling %s: %v", want, err)
	}
	if b, err := ociimage.ReadFile(img, "etc/squid/squid.conf"); err != nil || string(b) != "http_port 3128\n" {
		t.Errorf("etc/squid/squid.conf of the pulled image: %q, %v", b, err)
	}

	// A folder that is not such a layout is refused, naming it.
	if _, err := reg.Client.PushLayout(ctx, t.TempDir(), reg.Host+"/egressproxy/x:1"); err == nil {
		t.Error("pushing an empty folder: no error")
	}
}
