package ociimage_test

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage/registrytest"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

var (
	amd64 = ociimage.Platform{Architecture: "amd64"}
	arm64 = ociimage.Platform{Architecture: "arm64"}
)

func image(t *testing.T, p ociimage.Platform, content string) v1.Image {
	t.Helper()
	l, err := ociimage.Layer([]ociimage.File{
		{Path: "/usr/local/bin/app", Mode: 0o755, Data: []byte(content)},
		{Path: "etc/passwd", Data: []byte("nonroot:x:65532:65532::/home/nonroot:/sbin/nologin\n")},
		{Path: "tmp", Dir: true, Mode: 0o777 | fs.ModeSticky},
	})
	if err != nil {
		t.Fatal(err)
	}
	img, err := ociimage.Image(p, ociimage.Config{
		User:       "65532:65532",
		Entrypoint: []string{"/usr/local/bin/app"},
		Env:        []string{"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		Labels:     map[string]string{"org.opencontainers.image.version": "v0.2.0"},
	}, l)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// entries lists a layer's tar entries as "name mode uid:gid type".
func entries(t *testing.T, l v1.Layer) []string {
	t.Helper()
	rc, err := l.Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	var out []string
	testenv.EachTarEntry(t, rc, func(h *tar.Header, _ io.Reader) {
		s := h.Name + " " + strings.TrimLeft(fs.FileMode(h.Mode).String(), "-") + " " + string(h.Typeflag)
		if h.Mode&0o1000 != 0 {
			s += " sticky"
		}
		if h.Uid != 0 || h.Gid != 0 {
			s += " owned"
		}
		if h.Linkname != "" {
			s += " -> " + h.Linkname
		}
		out = append(out, s)
	})
	return out
}

func TestImageConfigAndLayer(t *testing.T) {
	img := image(t, arm64, "binary")
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if cf.OS != "linux" || cf.Architecture != "arm64" {
		t.Errorf("platform: got %s/%s, want linux/arm64", cf.OS, cf.Architecture)
	}
	if cf.Config.User != "65532:65532" || cf.Config.Entrypoint[0] != "/usr/local/bin/app" ||
		cf.Config.Labels["org.opencontainers.image.version"] != "v0.2.0" || len(cf.Config.Env) != 1 {
		t.Errorf("config: got %+v", cf.Config)
	}
	if mt, _ := img.MediaType(); mt != types.OCIManifestSchema1 {
		t.Errorf("media type: got %s, want an OCI manifest", mt)
	}
	ls, err := img.Layers()
	if err != nil || len(ls) != 1 {
		t.Fatalf("layers: %v %d", err, len(ls))
	}
	got := entries(t, ls[0])
	want := []string{
		"etc/ rwxr-xr-x 5",
		"etc/passwd rw-r--r-- 0",
		"tmp/ rwxrwxrwx 5 sticky",
		"usr/ rwxr-xr-x 5",
		"usr/local/ rwxr-xr-x 5",
		"usr/local/bin/ rwxr-xr-x 5",
		"usr/local/bin/app rwxr-xr-x 0",
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("layer entries (-want +got):\n%s", d)
	}
	b, err := ociimage.ReadFile(img, "usr/local/bin/app")
	if err != nil || string(b) != "binary" {
		t.Errorf("ReadFile: got %q, %v", b, err)
	}
	if _, err := ociimage.ReadFile(img, "/nothing"); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ReadFile of a missing file: got %v, want not-exist", err)
	}
}

func TestLayerIsReproducible(t *testing.T) {
	a, b := image(t, amd64, "same"), image(t, amd64, "same")
	da, _ := a.Digest()
	db, _ := b.Digest()
	if da != db {
		t.Errorf("the same inputs gave two digests: %s and %s", da, db)
	}
	c := image(t, amd64, "other")
	if dc, _ := c.Digest(); dc == da {
		t.Error("different content gave the same digest")
	}
}

func TestLayerRefusesBadPaths(t *testing.T) {
	for _, files := range [][]ociimage.File{
		{{Path: "/"}},
		{{Path: ""}},
		{{Path: "a", Data: []byte("1")}, {Path: "/a", Data: []byte("2")}},
	} {
		if _, err := ociimage.Layer(files); err == nil {
			t.Errorf("Layer(%+v): no error", files)
		}
	}
	// A path climbing out of the root stays inside it.
	l, err := ociimage.Layer([]ociimage.File{{Path: "../../etc/x", Data: []byte("x")}})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]string{"etc/ rwxr-xr-x 5", "etc/x rw-r--r-- 0"}, entries(t, l)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestDirLayer(t *testing.T) {
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "usr/sbin"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "usr/sbin/squid"), []byte("squid"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("usr/sbin", filepath.Join(dir, "sbin")); err != nil {
		t.Fatal(err)
	}
	l, err := ociimage.DirLayer(dir)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"sbin rwxrwxrwx 2 -> usr/sbin", "usr/ rwxr-xr-x 5", "usr/sbin/ rwxr-xr-x 5", "usr/sbin/squid rwxr-xr-x 0"}
	if d := cmp.Diff(want, entries(t, l)); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

func TestIndex(t *testing.T) {
	idx, err := ociimage.Index(image(t, amd64, "x86"), image(t, arm64, "arm"))
	if err != nil {
		t.Fatal(err)
	}
	m, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, d := range m.Manifests {
		got = append(got, d.Platform.String())
	}
	if d := cmp.Diff([]string{"linux/amd64", "linux/arm64"}, got); d != "" {
		t.Errorf("index platforms (-want +got):\n%s", d)
	}
	arm, err := ociimage.ForPlatform(idx, arm64)
	if err != nil {
		t.Fatal(err)
	}
	if b, _ := ociimage.ReadFile(arm, "usr/local/bin/app"); string(b) != "arm" {
		t.Errorf("arm64 image holds %q", b)
	}
	if _, err := ociimage.Index(image(t, amd64, "a"), image(t, amd64, "b")); err == nil {
		t.Error("two images for linux/amd64: no error")
	}
}

func TestWriteTarball(t *testing.T) {
	file := filepath.Join(t.TempDir(), "img.tar")
	img := image(t, amd64, "bin")
	if err := ociimage.WriteTarball(file, "example.test/org/app:v1", img); err != nil {
		t.Fatal(err)
	}
	back, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The docker tarball format re-encodes the manifest; the config (and
	// so the layers' diff IDs) survives.
	want, _ := img.ConfigName()
	if got, _ := back.ConfigName(); got != want {
		t.Errorf("read back config %s, wrote %s", got, want)
	}
	if b, _ := ociimage.ReadFile(back, "usr/local/bin/app"); string(b) != "bin" {
		t.Errorf("read back %q", b)
	}
}

func TestWriteOCIArchive(t *testing.T) {
	file := filepath.Join(t.TempDir(), "img.oci.tar")
	idx, err := ociimage.Index(image(t, amd64, "x86"), image(t, arm64, "arm"))
	if err != nil {
		t.Fatal(err)
	}
	if err := ociimage.WriteOCIArchive(file, "example.test/org/squid:v1", idx); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	names := map[string][]byte{}
	testenv.EachTarEntry(t, f, func(h *tar.Header, content io.Reader) {
		b, _ := io.ReadAll(content)
		names[h.Name] = b
	})
	if _, ok := names["oci-layout"]; !ok {
		t.Fatal("no oci-layout in the archive")
	}
	var top v1.IndexManifest
	if err := json.Unmarshal(names["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].Annotations["io.containerd.image.name"] != "example.test/org/squid:v1" ||
		top.Manifests[0].Annotations["org.opencontainers.image.ref.name"] != "v1" {
		t.Fatalf("index.json: %+v", top.Manifests)
	}
	want, _ := idx.Digest()
	if top.Manifests[0].Digest != want {
		t.Errorf("index.json names %s, want the index %s", top.Manifests[0].Digest, want)
	}
	if _, ok := names["blobs/sha256/"+want.Hex]; !ok {
		t.Error("the index's blob is missing")
	}
}

func TestPushPull(t *testing.T) {
	reg := registrytest.Start(t)
	ctx := context.Background()
	idx, err := ociimage.Index(image(t, amd64, "x86"), image(t, arm64, "arm"))
	if err != nil {
		t.Fatal(err)
	}
	ref := reg.Host + "/egressproxy/app:v0.2.0"
	if err := reg.Client.Push(ctx, ref, idx); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[ociimage.Platform]string{amd64: "x86", arm64: "arm"} {
		img, err := reg.Client.Pull(ctx, ref, p)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := ociimage.ReadFile(img, "usr/local/bin/app"); string(b) != want {
			t.Errorf("%s: pulled %q, want %q", p, b, want)
		}
	}
	single := reg.Host + "/egressproxy/one:v1"
	if err := reg.Client.Push(ctx, single, image(t, arm64, "arm")); err != nil {
		t.Fatal(err)
	}
	if _, err := reg.Client.Pull(ctx, single, amd64); err == nil || !strings.Contains(err.Error(), "linux/arm64, not linux/amd64") {
		t.Errorf("pulling an arm64 image for amd64: got %v", err)
	}
	// Without the test CA the registry's certificate is refused.
	if err := (ociimage.Registry{}).Push(ctx, reg.Host+"/egressproxy/app:untrusted", idx); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Errorf("push without trusting the CA: got %v, want a certificate error", err)
	}
}

func TestParsePlatform(t *testing.T) {
	p, err := ociimage.ParsePlatform("linux/arm64/v8")
	if err != nil || p.String() != "linux/arm64/v8" {
		t.Errorf("got %v %v", p, err)
	}
	if _, err := ociimage.ParsePlatform("amd64"); err == nil {
		t.Error("amd64 alone: no error")
	}
}
