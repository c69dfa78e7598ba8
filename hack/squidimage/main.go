// Command squidimage makes the Squid image of hack/squid-image.sh from a
// root filesystem folder (internal/devenv/ociimage), as a `docker save` tarball
// that containerd imports, and the same image with a squid that only
// prints a message and exits 1 (the crash-loop test's).
//
//	squidimage -rootfs DIR -out FILE -ref NAME -crashing-out FILE -crashing-ref NAME
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"

	"github.com/egressproxy/provider-egressproxy/internal/backend/kubernetes"
	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
)

// CrashMessage is what the crashing image's squid prints before it exits 1.
const CrashMessage = "FATAL: squid-crashing: this squid exits at once (a test image)"

func main() {
	rootfs := flag.String("rootfs", "", "root filesystem folder (mmdebstrap's output)")
	out := flag.String("out", "", "image tarball to write")
	ref := flag.String("ref", "", "image name, such as localhost/egressproxy/squid:KEY")
	badOut := flag.String("crashing-out", "", "tarball of the crashing variant (optional)")
	badRef := flag.String("crashing-ref", "", "name of the crashing variant")
	flag.Parse()
	if *rootfs == "" || *out == "" || *ref == "" {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*rootfs, *out, *ref, *badOut, *badRef); err != nil {
		fmt.Fprintln(os.Stderr, "squidimage:", err)
		os.Exit(1)
	}
}

func run(rootfs, out, ref, badOut, badRef string) error {
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
