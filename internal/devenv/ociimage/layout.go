package ociimage

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// PushLayout pushes the one index in the OCI image layout at path (a
// folder, or that folder in a tar: hack/xpkg.sh's
// squid-egressproxy-VERSION.oci.tar) to ref, and returns ref's repository
// @ the index's digest, the reference that names exactly what was pushed.
func (r Registry) PushLayout(ctx context.Context, path, ref string) (string, error) {
	dir := path
	if fi, err := os.Stat(path); err != nil {
		return "", err
	} else if !fi.IsDir() {
		if dir, err = os.MkdirTemp("", "squidimage-"); err != nil {
			return "", err
		}
		defer func() { _ = os.RemoveAll(dir) }()
		if err := untar(path, dir); err != nil {
			return "", err
		}
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return "", err
	}
	top, err := p.ImageIndex()
	if err != nil {
		return "", err
	}
	m, err := top.IndexManifest()
	if err != nil {
		return "", err
	}
	if len(m.Manifests) != 1 {
		return "", fmt.Errorf("%s: want an image layout holding one index, not %d", path, len(m.Manifests))
	}
	idx, err := top.ImageIndex(m.Manifests[0].Digest)
	if err != nil {
		return "", err
	}
	tag, err := name.ParseReference(ref)
	if err != nil {
		return "", fmt.Errorf("image reference %q: %w", ref, err)
	}
	if err := r.Push(ctx, ref, idx); err != nil {
		return "", err
	}
	return tag.Context().Name() + "@" + m.Manifests[0].Digest.String(), nil
}

// untar extracts the regular files and folders of the tar at file into
// dir, refusing any other entry and any path that leaves dir.
func untar(file, dir string) error {
	f, err := os.Open(file) //nolint:gosec // The archive the caller named.
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: %w", file, err)
		}
		p := filepath.Join(dir, filepath.FromSlash(h.Name))
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(filepath.Separator)) && p != filepath.Clean(dir) {
			return fmt.Errorf("%s: entry %q leaves the archive's folder", file, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755) //nolint:gosec // An image layout's folders.
		case tar.TypeReg:
			err = writeFrom(p, tr)
		default:
			err = fmt.Errorf("%s: entry %q is neither a file nor a folder", file, h.Name)
		}
		if err != nil {
			return err
		}
	}
}

func writeFrom(p string, r io.Reader) error {
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil { //nolint:gosec // An image layout's folders.
		return err
	}
	w, err := os.Create(p) //nolint:gosec // Below the folder untar made.
	if err != nil {
		return err
	}
	if _, err := io.Copy(w, r); err != nil { //nolint:gosec // An image layout the project's build wrote; its blobs are digested on read.
		_ = w.Close()
		return err
	}
	return w.Close()
}
