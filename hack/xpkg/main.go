// Command crossplane-xpkg builds Crossplane packages (.xpkg): `crossplane
// xpkg build` of the Crossplane CLI, on the same library the v2 CLI uses
// (crossplane-runtime v2's pkg/xpkg). The v2 CLI module cannot be had from
// the module proxy here, and the v1 CLI (v1.20.1) re-encodes a package
// with v1 types: it refuses apiextensions.crossplane.io/v2 XRDs and drops
// fields v1 does not know, such as a Provider's capabilities (safe-start).
//
//	crossplane-xpkg build --package-root DIR [--examples-root DIR]
//	    [--embed-runtime-image-tarball FILE | --embed-runtime-binary FILE] -o FILE.xpkg
//
// --embed-runtime-binary makes the runtime image itself, without docker: the
// static binary as /usr/local/bin/<name> and the entrypoint, plus this
// machine's CA bundle (the GCP and Proxmox clients speak TLS), on an empty
// base, running as a non-root user. Crossplane runs a package's embedded
// runtime image as the provider's or function's container.
//
// It lives in its own module (hack/xpkg/go.mod) so that the registry and
// signature libraries it needs stay out of the provider's go.mod; hack/
// xpkg.sh builds it into the cache.
package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"

	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser/examples"
	"github.com/crossplane/crossplane-runtime/v2/pkg/xpkg/parser/yaml"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/spf13/afero"
)

func main() {
	if len(os.Args) < 2 || os.Args[1] != "build" {
		fmt.Fprintln(os.Stderr, "usage: crossplane-xpkg build --package-root DIR [--examples-root DIR] [--embed-runtime-image-tarball FILE] -o FILE.xpkg")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("build", flag.ExitOnError)
	root := fs.String("package-root", ".", "The folder holding the package's crossplane.yaml and its other YAML files.")
	ex := fs.String("examples-root", "", "A folder of example YAML files to include in the package.")
	runtimeImage := fs.String("embed-runtime-image-tarball", "", "An OCI image tarball to embed as the package's runtime (Provider and Function packages).")
	runtimeBinary := fs.String("embed-runtime-binary", "", "A static binary to embed, as the entrypoint of a runtime image built here.")
	out := fs.String("o", "", "The package file to write.")
	_ = fs.Parse(os.Args[2:])
	if err := build(*root, *ex, *runtimeImage, *runtimeBinary, *out); err != nil {
		fmt.Fprintln(os.Stderr, "crossplane-xpkg build:", err)
		os.Exit(1)
	}
}

func build(root, ex, runtimeImage, runtimeBinary, out string) error {
	if out == "" {
		return errors.New("-o is required")
	}
	root, err := filepath.Abs(root)
	if err != nil {
		return err
	}
	filters := func() []parser.FilterFn {
		return []parser.FilterFn{parser.SkipDirs(), parser.SkipNotYAML(), parser.SkipEmpty()}
	}
	pkgFilters := filters()
	// Without examples, point the examples backend at a folder that does
	// not exist: the builder then adds no examples layer.
	exDir := filepath.Join(root, ".no-examples")
	if ex != "" {
		if exDir, err = filepath.Abs(ex); err != nil {
			return err
		}
		pkgFilters = append(pkgFilters, xpkg.SkipContains(exDir))
	}
	pp, err := yaml.New()
	if err != nil {
		return err
	}
	fsys := afero.NewOsFs()
	b := xpkg.New(
		parser.NewFsBackend(fsys, parser.FsDir(root), parser.FsFilters(pkgFilters...)),
		parser.NewFsBackend(fsys, parser.FsDir(exDir), parser.FsFilters(filters()...)),
		pp,
		examples.New(),
	)
	var opts []xpkg.BuildOpt
	if runtimeImage != "" {
		img, err := tarball.ImageFromPath(filepath.Clean(runtimeImage), nil)
		if err != nil {
			return fmt.Errorf("loading the runtime image %s: %w", runtimeImage, err)
		}
		opts = append(opts, xpkg.WithBase(img))
	}
	if runtimeBinary != "" {
		img, err := binaryImage(runtimeBinary)
		if err != nil {
			return fmt.Errorf("making a runtime image of %s: %w", runtimeBinary, err)
		}
		opts = append(opts, xpkg.WithBase(img))
	}
	img, _, err := b.Build(context.Background(), opts...)
	if err != nil {
		return err
	}
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if err := tarball.Write(nil, img, f); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// caBundle is where Debian keeps the system's CA certificates.
const caBundle = "/etc/ssl/certs/ca-certificates.crt"

// binaryImage is a runtime image holding one static binary as its
// entrypoint (and the CA bundle, when this machine has one).
func binaryImage(path string) (v1.Image, error) {
	bin, err := os.ReadFile(filepath.Clean(path))
	if err != nil {
		return nil, err
	}
	name := filepath.Base(path)
	files := []tarFile{{name: "usr/local/bin/" + name, mode: 0o755, data: bin}}
	if ca, err := os.ReadFile(caBundle); err == nil {
		files = append(files, tarFile{name: strings.TrimPrefix(caBundle, "/"), mode: 0o644, data: ca})
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		for d := filepath.Dir(f.name); d != "." && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
	}
	sorted := make([]string, 0, len(dirs))
	for d := range dirs {
		sorted = append(sorted, d)
	}
	sort.Strings(sorted)
	for _, d := range sorted {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
			return nil, err
		}
	}
	for _, f := range files {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: f.name, Mode: f.mode, Size: int64(len(f.data))}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(buf.Bytes())), nil
	})
	if err != nil {
		return nil, err
	}
	img, err := mutate.AppendLayers(empty.Image, layer)
	if err != nil {
		return nil, err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Entrypoint = []string{"/usr/local/bin/" + name}
	cf.Config.User = "65532:65532" // nonroot, as distroless images run
	cf.Config.Env = []string{"SSL_CERT_FILE=" + caBundle}
	return mutate.ConfigFile(img, cf)
}

type tarFile struct {
	name string
	mode int64
	data []byte
}
