// Command squidimage makes the Squid image of hack/squid-image.sh from a
// root filesystem folder (internal/devenv/ociimage): a `docker save`
// tarball that containerd imports, the same image with a squid that only
// prints a message and exits 1 (the crash-loop test's), and an OCI image
// layout holding the image as a one-platform index, whose digest it writes
// to the layout's name with .digest appended. With -push, it pushes such a
// layout's index to a registry instead and prints what it pushed, by
// digest: the reference the provider's build makes its default image.
//
//	squidimage -rootfs DIR [-out FILE -ref NAME] [-crashing-out FILE -crashing-ref NAME] [-oci-out DIR]
//	squidimage -push DIR -ref NAME
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"runtime"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
)

// CrashMessage is what the crashing image's squid prints before it exits 1.
const CrashMessage = "FATAL: squid-crashing: this squid exits at once (a test image)"

func main() {
	rootfs := flag.String("rootfs", "", "root filesystem folder (mmdebstrap's output)")
	out := flag.String("out", "", "image tarball to write")
	ref := flag.String("ref", "", "image name, such as localhost/egressproxy/squid:KEY (with -push: where to push, such as registry.example/org/squid:v1.2.3)")
	badOut := flag.String("crashing-out", "", "tarball of the crashing variant (optional)")
	badRef := flag.String("crashing-ref", "", "name of the crashing variant")
	ociOut := flag.String("oci-out", "", "OCI image layout folder to write (optional)")
	push := flag.String("push", "", "OCI image layout (-oci-out's folder, or it in a tar) to push to -ref")
	flag.Parse()
	var err error
	switch {
	case *push != "" && *ref != "":
		var pushed string
		if pushed, err = (ociimage.Registry{}).PushLayout(context.Background(), *push, *ref); err == nil {
			fmt.Println(pushed)
		}
	case *rootfs != "" && *ref != "" && (*out != "" || *ociOut != ""):
		err = run(*rootfs, *out, *ref, *badOut, *badRef, *ociOut)
	default:
		flag.Usage()
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "squidimage:", err)
		os.Exit(1)
	}
}

func run(rootfs, out, ref, badOut, badRef, ociOut string) error {
	base, err := ociimage.DirLayer(rootfs)
	if err != nil {
		return err
	}
	p := ociimage.Platform{OS: "linux", Architecture: runtime.GOARCH}
	// The user and command the driver's pod spec sets anyway, so the image
	// also runs as it should without them.
	cfg := ociimage.Config{
		User:       fmt.Sprintf("%d:%d", kubernetes.SquidUser, kubernetes.SquidUser),
		Entrypoint: []string{kubernetes.SquidBinary},
		Cmd:        []string{"-N", "-f", kubernetes.ConfigMountPath + "/" + kubernetes.KeySquidConf},
		Labels: map[string]string{
			"org.opencontainers.image.title":       "squid",
			"org.opencontainers.image.description": "Debian bookworm's squid, built by hack/squid-image.sh for the local node's tests",
		},
	}
	img, err := ociimage.Image(p, cfg, base)
	if err != nil {
		return err
	}
	if ociOut != "" {
		if err := writeLayout(ociOut, img); err != nil {
			return err
		}
	}
	if out == "" {
		return nil
	}
	if err := ociimage.WriteTarball(out, ref, img); err != nil {
		return err
	}
	if badOut == "" {
		return nil
	}
	crash, err := ociimage.Layer([]ociimage.File{{
		Path: kubernetes.SquidBinary, Mode: 0o755,
		Data: []byte("#!/bin/sh\necho '" + CrashMessage + "' >&2\nexit 1\n"),
	}})
	if err != nil {
		return err
	}
	bad, err := ociimage.Image(p, cfg, base, crash)
	if err != nil {
		return err
	}
	return ociimage.WriteTarball(badOut, badRef, bad)
}

// writeLayout writes img as a one-platform index into a new OCI image
// layout at dir, and the index's digest to dir.digest. An index, not the
// image alone, so that a reference by digest stays the same kind of object
// when the image gains platforms.
func writeLayout(dir string, img v1.Image) error {
	idx, err := ociimage.Index(img)
	if err != nil {
		return err
	}
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	if err := p.AppendIndex(idx); err != nil {
		return fmt.Errorf("writing the image layout %s: %w", dir, err)
	}
	d, err := idx.Digest()
	if err != nil {
		return err
	}
	return os.WriteFile(dir+".digest", []byte(d.String()+"\n"), 0o644) //nolint:gosec // A digest, read by the build scripts.
}
