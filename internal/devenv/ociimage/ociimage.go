// Package ociimage builds OCI container images without docker, on
// go-containerregistry: a root filesystem (files given in memory, or a
// directory on disk) and a config (user, entrypoint, env, labels) become a
// v1.Image for one platform; images for several platforms become a
// multi-arch index; either is written as a tarball or pushed to a
// registry.
//
// The provider's and the function's runtime images (embedded in their
// Crossplane packages) and the Squid image the node tests load into
// containerd are made with it.
package ociimage

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one entry of an image's root filesystem.
type File struct {
	// Path inside the image, relative or absolute ("usr/local/bin/x").
	Path string
	// Mode holds the permission bits (0o755, 0o644). Zero means 0o644 for
	// a file and 0o755 for a directory.
	Mode fs.FileMode
	// Data is a regular file's content.
	Data []byte
	// Dir makes the entry a directory (Data ignored).
	Dir bool
	// Symlink makes the entry a symbolic link to this target (Data ignored).
	Symlink string
	// UID and GID own the entry (0, root, by default).
	UID, GID int
}

// Config is what the image runs and how: the parts of an OCI image config
// a runtime image needs.
type Config struct {
	// User to run as, "uid:gid" or a name in the image's /etc/passwd.
	User string
	// Entrypoint and Cmd, as in a Dockerfile's exec form.
	Entrypoint []string
	Cmd        []string
	// Env holds KEY=value pairs.
	Env []string
	// WorkingDir is the directory the process starts in.
	WorkingDir string
	// Labels are the image's labels (org.opencontainers.image.*).
	Labels map[string]string
}

// Platform is the OS and architecture an image runs on; OS defaults to
// linux.
type Platform struct {
	OS, Architecture, Variant string
}

// String is os/arch[/variant].
func (p Platform) String() string {
	s := p.os() + "/" + p.Architecture
	if p.Variant != "" {
		s += "/" + p.Variant
	}
	return s
}

func (p Platform) os() string {
	if p.OS == "" {
		return "linux"
	}
	return p.OS
}

// ParsePlatform reads "linux/amd64" or "linux/arm64/v8".
func ParsePlatform(s string) (Platform, error) {
	parts := strings.Split(s, "/")
	if len(parts) < 2 || len(parts) > 3 || parts[0] == "" || parts[1] == "" {
		return Platform{}, fmt.Errorf("platform %q: want os/arch or os/arch/variant, such as linux/amd64", s)
	}
	p := Platform{OS: parts[0], Architecture: parts[1]}
	if len(parts) == 3 {
		p.Variant = parts[2]
	}
	return p, nil
}

// epoch is the modification time of every entry: the same inputs make the
// same layer digest, whenever and wherever they are built.
var epoch = time.Unix(0, 0).UTC()

// Layer is an uncompressed-tar layer holding files; directories leading to
// them are added (root-owned, 0755) when not listed. Entries are sorted by
// path and timestamped at the epoch, so the digest depends only on the
// content.
func Layer(files []File) (v1.Layer, error) {
	entries := map[string]File{}
	for _, f := range files {
		p, err := cleanPath(f.Path)
		if err != nil {
			return nil, err
		}
		if _, dup := entries[p]; dup {
			return nil, fmt.Errorf("file %q: listed twice", f.Path)
		}
		f.Path = p
		entries[p] = f
	}
	// Parent directories not listed are root-owned 0755, as a runtime
	// expects them to exist.
	for p := range entries {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := entries[d]; !ok {
				entries[d] = File{Path: d, Dir: true}
			}
		}
	}
	paths := make([]string, 0, len(entries))
	for p := range entries {
		paths = append(paths, p)
	}
	sort.Strings(paths)

	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, p := range paths {
		if err := writeEntry(tw, entries[p]); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return layerFromBytes(buf.Bytes())
}

func writeEntry(tw *tar.Writer, f File) error {
	h := &tar.Header{Name: f.Path, Uid: f.UID, Gid: f.GID, ModTime: epoch, Format: tar.FormatPAX}
	mode := f.Mode.Perm() | f.Mode&(fs.ModeSetuid|fs.ModeSetgid|fs.ModeSticky)
	switch {
	case f.Dir:
		h.Typeflag, h.Name = tar.TypeDir, f.Path+"/"
		if mode == 0 {
			mode = 0o755
		}
	case f.Symlink != "":
		h.Typeflag, h.Linkname = tar.TypeSymlink, f.Symlink
		mode = 0o777
	default:
		h.Typeflag, h.Size = tar.TypeReg, int64(len(f.Data))
		if mode == 0 {
			mode = 0o644
		}
	}
	h.Mode = tarMode(mode)
	if err := tw.WriteHeader(h); err != nil {
		return fmt.Errorf("file %q: %w", f.Path, err)
	}
	if h.Typeflag == tar.TypeReg {
		if _, err := tw.Write(f.Data); err != nil {
			return fmt.Errorf("file %q: %w", f.Path, err)
		}
	}
	return nil
}

// tarMode is an fs.FileMode as tar's (Unix) mode bits.
func tarMode(m fs.FileMode) int64 {
	v := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		v |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		v |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		v |= 0o1000
	}
	return v
}

// cleanPath is p relative to the image root, refusing paths that leave it.
func cleanPath(p string) (string, error) {
	c := path.Clean("/" + p)
	if c == "/" || strings.Contains(p, "\x00") {
		return "", fmt.Errorf("file %q: want a path below the image root, such as usr/local/bin/provider", p)
	}
	return strings.TrimPrefix(c, "/"), nil
}

// DirLayer is a layer holding the directory tree at dir as the image's
// root filesystem: regular files, directories and symlinks keep their mode
// and ownership (hard links become copies; devices, sockets and pipes are
// refused, as no root filesystem built for an image should hold them).
// Timestamps are set to the epoch.
func DirLayer(dir string) (v1.Layer, error) {
	var files []File
	err := walkBelow(dir, func(p, rel string, _ fs.DirEntry) error {
		info, err := os.Lstat(p)
		if err != nil {
			return err
		}
		f := File{Path: rel, Mode: info.Mode()}
		f.UID, f.GID = owner(info)
		switch t := info.Mode().Type(); {
		case t == 0:
			if f.Data, err = os.ReadFile(p); err != nil { //nolint:gosec // The folder the caller builds an image from.
				return err
			}
		case t == fs.ModeDir:
			f.Dir = true
		case t == fs.ModeSymlink:
			if f.Symlink, err = os.Readlink(p); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: a %s cannot go into an image layer", p, t)
		}
		files = append(files, f)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("reading the root filesystem %s: %w", dir, err)
	}
	return Layer(files)
}

// walkBelow calls fn for every file and folder below dir (dir itself
// left out), in lexical order, with its path and its path relative to dir
// in slash form.
func walkBelow(dir string, fn func(p, rel string, d fs.DirEntry) error) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		return fn(p, filepath.ToSlash(rel), d)
	})
}

func layerFromBytes(b []byte) (v1.Layer, error) {
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(b)), nil
	}, tarball.WithMediaType(types.OCILayer))
}

// Image is an OCI image for platform p with the layers (lowest first) and
// config.
func Image(p Platform, cfg Config, layers ...v1.Layer) (v1.Image, error) {
	if p.Architecture == "" {
		return nil, errors.New("platform: architecture is required, such as amd64 or arm64")
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layers...)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Variant = p.os(), p.Architecture, p.Variant
	cf.Created = v1.Time{Time: epoch}
	cf.Config.User = cfg.User
	cf.Config.Entrypoint = cfg.Entrypoint
	cf.Config.Cmd = cfg.Cmd
	cf.Config.Env = cfg.Env
	cf.Config.WorkingDir = cfg.WorkingDir
	cf.Config.Labels = cfg.Labels
	return mutate.ConfigFile(img, cf)
}

// Index is a multi-arch OCI image index of the images, each entry carrying
// the platform in the image's config. Two images for the same platform are
// refused.
func Index(images ...v1.Image) (v1.ImageIndex, error) {
	if len(images) == 0 {
		return nil, errors.New("an index needs at least one image")
	}
	idx := mutate.IndexMediaType(empty.Index, types.OCIImageIndex)
	seen := map[string]bool{}
	var adds []mutate.IndexAddendum
	for i, img := range images {
		cf, err := img.ConfigFile()
		if err != nil {
			return nil, fmt.Errorf("image %d: %w", i, err)
		}
		p := v1.Platform{OS: cf.OS, Architecture: cf.Architecture, Variant: cf.Variant}
		if p.Architecture == "" {
			return nil, fmt.Errorf("image %d: its config names no architecture", i)
		}
		if seen[p.String()] {
			return nil, fmt.Errorf("image %d: a second image for %s", i, p.String())
		}
		seen[p.String()] = true
		mt, err := img.MediaType()
		if err != nil {
			return nil, err
		}
		adds = append(adds, mutate.IndexAddendum{Add: img, Descriptor: v1.Descriptor{MediaType: mt, Platform: &p}})
	}
	return mutate.AppendManifests(idx, adds...), nil
}

// ForPlatform is the image in idx for platform p.
func ForPlatform(idx v1.ImageIndex, p Platform) (v1.Image, error) {
	m, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	for _, d := range m.Manifests {
		if d.Platform != nil && d.Platform.OS == p.os() && d.Platform.Architecture == p.Architecture &&
			(p.Variant == "" || d.Platform.Variant == p.Variant) {
			return idx.Image(d.Digest)
		}
	}
	return nil, fmt.Errorf("the index has no image for %s", p)
}
