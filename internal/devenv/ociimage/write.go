package ociimage

import (
	"archive/tar"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// WriteTarball writes img as a `docker save` tarball tagged ref
// ("registry.example/org/name:tag"): the format `crossplane xpkg build
// --embed-runtime-image-tarball` and `ctr images import` read.
func WriteTarball(file, ref string, img v1.Image) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	return writeFile(file, func(w io.Writer) error { return tarball.Write(tag, img, w) })
}

// Annotations containerd and OCI tools read for an image's name in an OCI
// archive's index.json.
const (
	annotationContainerdName = "io.containerd.image.name"
	annotationRefName        = "org.opencontainers.image.ref.name"
)

// WriteOCIArchive writes idx as an OCI image layout in a tar archive
// (oci-layout, index.json, blobs/), its entry named ref: the multi-arch
// format `ctr images import` and skopeo's oci-archive read.
func WriteOCIArchive(file, ref string, idx v1.ImageIndex) error {
	tag, err := name.NewTag(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	dir, err := os.MkdirTemp("", "ociimage-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{
		annotationContainerdName: tag.Name(),
		annotationRefName:        tag.TagStr(),
	})); err != nil {
		return fmt.Errorf("writing the image layout: %w", err)
	}
	return writeFile(file, func(w io.Writer) error { return tarDir(w, dir) })
}

// tarDir writes the regular files and directories below dir as a tar.
func tarDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := walkBelow(dir, func(p, rel string, d fs.DirEntry) error {
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: rel + "/", Mode: 0o755, ModTime: epoch})
		}
		b, err := os.ReadFile(p) //nolint:gosec // A file the caller named.
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: rel, Mode: 0o644, Size: int64(len(b)), ModTime: epoch}); err != nil {
			return err
		}
		_, err = tw.Write(b)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// writeFile writes through a temporary file renamed into place, so that a
// failed write leaves no half file behind.
func writeFile(file string, write func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(file), "."+filepath.Base(file)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := write(tmp); err != nil {
		_ = tmp.Close()
		return fmt.Errorf("writing %s: %w", file, err)
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil { //nolint:gosec // An image or package file, read by other tools: not a secret.
		return err
	}
	return os.Rename(tmp.Name(), file)
}

// Registry says how to reach a registry.
type Registry struct {
	// RootCAs verifies the registry's certificate; nil means the system
	// roots.
	RootCAs *x509.CertPool
	// Auth logs in; nil means the docker config's credentials, if any
	// (anonymous otherwise).
	Auth authn.Authenticator
}

func (r Registry) options(ctx context.Context) []remote.Option {
	t := http.DefaultTransport.(*http.Transport).Clone() //nolint:forcetypeassert // net/http's default transport is an *http.Transport.
	if r.RootCAs != nil {
		t.TLSClientConfig = &tls.Config{RootCAs: r.RootCAs, MinVersion: tls.VersionTLS12}
	}
	opts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(t)}
	if r.Auth != nil {
		opts = append(opts, remote.WithAuth(r.Auth))
	} else {
		opts = append(opts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	return opts
}

// Push pushes an image or an index (a v1.Image or a v1.ImageIndex) as ref.
func (r Registry) Push(ctx context.Context, ref string, obj any) error {
	tag, err := name.ParseReference(ref)
	if err != nil {
		return fmt.Errorf("image reference %q: %w", ref, err)
	}
	switch o := obj.(type) {
	case v1.ImageIndex:
		err = remote.WriteIndex(tag, o, r.options(ctx)...)
	case v1.Image:
		err = remote.Write(tag, o, r.options(ctx)...)
	default:
		return fmt.Errorf("pushing %s: want a v1.Image or a v1.ImageIndex, not %T", ref, obj)
	}
	if err != nil {
		return fmt.Errorf("pushing %s: %w", ref, err)
	}
	return nil
}

// Pull is the image ref names for platform p: the platform's entry when
// ref is an index, the image itself when it is one image (whose config
// must then be for p).
func (r Registry) Pull(ctx context.Context, ref string, p Platform) (v1.Image, error) {
	nr, err := name.ParseReference(ref)
	if err != nil {
		return nil, fmt.Errorf("image reference %q: %w", ref, err)
	}
	vp := v1.Platform{OS: p.os(), Architecture: p.Architecture, Variant: p.Variant}
	img, err := remote.Image(nr, append(r.options(ctx), remote.WithPlatform(vp))...)
	if err != nil {
		return nil, fmt.Errorf("pulling %s for %s: %w", ref, p, err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("pulling %s: %w", ref, err)
	}
	if cf.Architecture != p.Architecture || cf.OS != p.os() {
		return nil, fmt.Errorf("pulling %s: the image is for %s/%s, not %s", ref, cf.OS, cf.Architecture, p)
	}
	return img, nil
}

// ReadFile is the content of the file at path in img's root filesystem,
// as the layers stack up (a later layer's copy wins; a whiteout deletes).
func ReadFile(img v1.Image, path string) ([]byte, error) {
	want, err := cleanPath(path)
	if err != nil {
		return nil, err
	}
	layers, err := img.Layers()
	if err != nil {
		return nil, err
	}
	for i := len(layers) - 1; i >= 0; i-- {
		b, found, deleted, err := readFromLayer(layers[i], want)
		if err != nil {
			return nil, fmt.Errorf("layer %d: %w", i, err)
		}
		if deleted {
			break
		}
		if found {
			return b, nil
		}
	}
	return nil, fmt.Errorf("%s: %w in the image", path, fs.ErrNotExist)
}

func readFromLayer(l v1.Layer, want string) (data []byte, found, deleted bool, err error) {
	rc, err := l.Uncompressed()
	if err != nil {
		return nil, false, false, err
	}
	defer func() { _ = rc.Close() }()
	tr := tar.NewReader(rc)
	whiteout := filepath.ToSlash(filepath.Join(filepath.Dir(want), ".wh."+filepath.Base(want)))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil, false, false, nil
		}
		if err != nil {
			return nil, false, false, err
		}
		n, _ := cleanPath(h.Name)
		switch {
		case n == whiteout:
			return nil, false, true, nil
		case n == want && h.Typeflag == tar.TypeReg:
			b, err := io.ReadAll(tr)
			return b, true, false, err
		case n == want:
			return nil, false, false, fmt.Errorf("%s is not a regular file in the image", want)
		}
	}
}
