// Command runtimeimage makes the runtime image of the provider or the
// function (the image a Crossplane package embeds and Crossplane runs as
// its container), without docker, on internal/devenv/ociimage:
//
//	go run ./hack/runtimeimage --binary bin/linux_arm64/provider \
//	    --platform linux/arm64 --version v0.2.0 -o provider-arm64.tar
//
// The image holds the static binary as /usr/local/bin/<name>, the
// entrypoint; Debian's CA certificates (the ca-certificates package's
// certificates, concatenated as update-ca-certificates does into
// /etc/ssl/certs/ca-certificates.crt), since the GCP and Proxmox clients
// speak TLS; and a nonroot user (65532, as distroless images run) in
// /etc/passwd and /etc/group. Nothing else: no shell, no libc.
//
// It writes a `docker save` tarball, the format `crossplane xpkg build
// --embed-runtime-image-tarball` reads.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/ociimage"
)

// debianCerts is where Debian's ca-certificates package puts the
// certificates it ships.
const debianCerts = "/usr/share/ca-certificates/mozilla"

func main() {
	binary := flag.String("binary", "", "The static binary to run (its file name becomes /usr/local/bin/<name>).")
	platform := flag.String("platform", "linux/amd64", "The platform the binary is built for, os/arch.")
	version := flag.String("version", "", "The version, for the image's org.opencontainers.image.version label.")
	ref := flag.String("ref", "", "The name the tarball tags the image with (default egressproxy/<name>:<version>).")
	out := flag.String("o", "", "The image tarball to write.")
	flag.Parse()
	if err := run(*binary, *platform, *version, *ref, *out); err != nil {
		fmt.Fprintln(os.Stderr, "runtimeimage:", err)
		os.Exit(1)
	}
}

func run(binary, platform, version, ref, out string) error {
	if binary == "" || out == "" || version == "" {
		return fmt.Errorf("--binary, --version and -o are required")
	}
	p, err := ociimage.ParsePlatform(platform)
	if err != nil {
		return fmt.Errorf("--platform: %w", err)
	}
	bin, err := os.ReadFile(filepath.Clean(binary))
	if err != nil {
		return err
	}
	ca, caVersion, err := debianCABundle()
	if err != nil {
		return err
	}
	name := filepath.Base(binary)
	if ref == "" {
		ref = "egressproxy/" + name + ":" + version
	}
	const bundle = "etc/ssl/certs/ca-certificates.crt"
	layer, err := ociimage.Layer([]ociimage.File{
		{Path: "usr/local/bin/" + name, Mode: 0o755, Data: bin},
		{Path: bundle, Mode: 0o644, Data: ca},
		{Path: "etc/passwd", Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "etc/group", Data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{Path: "home/nonroot", Dir: true, Mode: 0o700, UID: 65532, GID: 65532},
		{Path: "tmp", Dir: true, Mode: 0o777 | os.ModeSticky},
	})
	if err != nil {
		return err
	}
	img, err := ociimage.Image(p, ociimage.Config{
		User:       "65532:65532",
		Entrypoint: []string{"/usr/local/bin/" + name},
		Env:        []string{"SSL_CERT_FILE=/" + bundle},
		WorkingDir: "/home/nonroot",
		Labels: map[string]string{
			"org.opencontainers.image.title":     name,
			"org.opencontainers.image.version":   version,
			"org.opencontainers.image.source":    "https://github.com/egressproxy/provider-egressproxy",
			"org.opencontainers.image.base.name": "debian ca-certificates " + caVersion,
		},
	}, layer)
	if err != nil {
		return err
	}
	return ociimage.WriteTarball(out, ref, img)
}

// debianCABundle is the certificates of Debian's ca-certificates package,
// in one PEM file, and the package's version. The package is installed on
// demand (the bundle is the same for every architecture).
func debianCABundle() ([]byte, string, error) {
	files, _ := filepath.Glob(filepath.Join(debianCerts, "*.crt"))
	if len(files) == 0 {
		return nil, "", fmt.Errorf("no certificates in %s: install Debian's ca-certificates package (apt-get install ca-certificates)", debianCerts)
	}
	sort.Strings(files)
	var b []byte
	for _, f := range files {
		c, err := os.ReadFile(f)
		if err != nil {
			return nil, "", err
		}
		b = append(b, c...)
		if len(c) > 0 && c[len(c)-1] != '\n' {
			b = append(b, '\n')
		}
	}
	v, err := exec.Command("dpkg-query", "-W", "-f=${Version}", "ca-certificates").Output()
	if err != nil {
		return nil, "", fmt.Errorf("dpkg-query ca-certificates: %w", err)
	}
	return b, strings.TrimSpace(string(v)), nil
}
