// Package guesttest is a stand-in for a VM's disk: it runs the shell the
// provider has a guest run (the user-data's write_files and runcmd, the
// GCP startup script, a KVM update's guest-agent script) with the guest's
// folders moved under a temporary root, so that a test sees the files a
// guest is left with.
package guesttest

import (
	"encoding/base64"
	"io"
	"io/fs"
	"mime"
	"mime/multipart"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// dirs are the guest folders the provider's scripts write in.
var dirs = []string{"/etc/squid", "/var/lib/egressproxy", "/var/lib/cloud", "/usr/local/lib/egressproxy", "/etc/systemd/system", "/usr/lib/squid",
	"/etc/init.d", "/etc/runlevels/default"}

// hostTools are the commands the scripts use that run as they are (the
// egress check's among them); the rest (install and chown, which set
// owners, systemctl, ip, getent, squid, qemu-ga) are stand-ins, and
// anything else is not found.
var hostTools = []string{"sh", "bash", "rm", "cp", "mv", "chmod", "mkdir", "ln", "dirname", "awk", "sort", "cat", "seq", "sleep",
	"timeout", "head", "tr", "date"}

// Guest is a VM's disk under a temporary root, with Squid, the guest
// agent and Squid's auth helper installed.
type Guest struct {
	t     testing.TB
	root  string
	bin   string
	paths *strings.Replacer
}

// New returns a guest with nothing of the provider's written yet.
func New(t testing.TB) *Guest {
	t.Helper()
	root := t.TempDir()
	g := &Guest{t: t, root: root, bin: filepath.Join(root, ".bin")}
	var pairs []string
	for _, d := range append([]string{"/.bin"}, dirs...) {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
		if d != "/.bin" {
			pairs = append(pairs, d, filepath.Join(root, d))
		}
	}
	g.paths = strings.NewReplacer(pairs...)
	for _, tool := range hostTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatalf("guesttest: %s not found: %v", tool, err)
		}
		if err := os.Symlink(p, filepath.Join(g.bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	g.SquidGroup("proxy")
	// Owners are not kept, as install's are not: it refuses any but root,
	// and a missing path.
	g.Tool("chown", `case "$1" in root|root:root) ;; *) echo "chown: invalid user: '$1'" >&2; exit 1;; esac; shift
for p; do [ -e "$p" ] || { echo "chown: cannot access '$p': No such file or directory" >&2; exit 1; }; done`)
	g.Tool("ip", `case "$*" in *route*) case "$1" in -6) ;; *) echo "default via 10.0.0.1 dev ens4 proto dhcp src 10.0.0.5 metric 100";; esac;; `+
		`*) echo "1: lo    inet 127.0.0.1/8 scope host lo"; echo "2: ens4    inet 10.0.0.5/24 brd 10.0.0.255 scope global ens4";; esac`)
	for _, tool := range []string{"squid", "qemu-ga"} {
		g.Tool(tool, "exit 0")
	}
	// As systemd does, it fails on a unit of the provider's that has no
	// unit file (the distribution's, squid among them, are there).
	g.Tool("systemctl", `for a; do case "$a" in egressproxy-*) [ -f "`+g.Path("/etc/systemd/system")+`/$a" ] || { echo "Unit $a not found." >&2; exit 5; };; esac; done; exit 0`)
	g.WriteFile(squid.DefaultAuthHelperPath, "")
	if err := os.Chmod(g.inside(squid.DefaultAuthHelperPath), 0o755); err != nil {
		t.Fatal(err)
	}
	return g
}

// OpenRC makes the guest an Alpine one: OpenRC rather than systemd
// (rc-update keeps the default runlevel's links as OpenRC does, and both
// commands fail on a service without its script in /etc/init.d), apk, and
// no bash until apk adds it. RCCalls lists what was asked of them.
func (g *Guest) OpenRC() {
	g.t.Helper()
	for _, tool := range []string{"systemctl", "bash"} {
		if err := os.Remove(filepath.Join(g.bin, tool)); err != nil {
			g.t.Fatal(err)
		}
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		g.t.Fatal(err)
	}
	log, initd, runlevel := filepath.Join(g.bin, ".rc-calls"), g.Path("/etc/init.d"), g.Path("/etc/runlevels/default")
	g.Tool("apk", `echo "apk $*" >> `+log+`; for p; do [ "$p" = bash ] && ln -sf `+bash+` `+g.bin+`/bash; done; exit 0`)
	g.Tool("rc-update", `echo "rc-update $*" >> `+log+`; [ -x `+initd+`/"$2" ] || { echo " * rc-update: service '$2' does not exist" >&2; exit 1; }
case "$1" in add) [ -e `+runlevel+`/"$2" ] && { echo " * rc-update: $2 already installed in runlevel 'default'; skipping" >&2; exit 0; }; ln -s `+initd+`/"$2" `+runlevel+`/"$2";;
del) rm `+runlevel+`/"$2";; *) exit 1;; esac`)
	g.Tool("rc-service", `echo "rc-service $*" >> `+log+`; [ -x `+initd+`/"$1" ] || { echo " * rc-service: service '$1' does not exist" >&2; exit 1; }`)
	// As their packages install them.
	for _, svc := range []string{"squid", "qemu-guest-agent"} {
		g.WriteFile("/etc/init.d/"+svc, "#!/sbin/openrc-run\n")
		if err := os.Chmod(g.Path("/etc/init.d/"+svc), 0o755); err != nil {
			g.t.Fatal(err)
		}
	}
}

// RCCalls are the apk, rc-update and rc-service commands an OpenRC guest
// was asked to run, in order.
func (g *Guest) RCCalls() []string {
	g.t.Helper()
	b, err := os.ReadFile(filepath.Join(g.bin, ".rc-calls"))
	if err != nil && !os.IsNotExist(err) {
		g.t.Fatal(err)
	}
	if len(b) == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}

// SquidGroup makes the guest one of a family whose Squid runs in group
// name (Debian's proxy, the default; squid elsewhere): getent knows that
// group and root only, and install refuses any other.
func (g *Guest) SquidGroup(name string) {
	g.t.Helper()
	g.Tool("install", `mode=; while [ $# -gt 2 ]; do case "$1" in -m) mode=$2; shift 2;; -o) shift 2;; `+
		`-g) case "$2" in root|`+name+`) ;; *) echo "install: invalid group '$2'" >&2; exit 1;; esac; shift 2;; *) shift;; esac; done
cp "$1" "$2" && { [ -z "$mode" ] || chmod "$mode" "$2"; }`)
	g.Tool("getent", `[ "$2" = `+name+` ] || [ "$2" = root ]`)
}

// Tool puts a stand-in command in the guest, a sh script of body.
func (g *Guest) Tool(name, body string) {
	g.t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		g.t.Fatal(err)
	}
	p := filepath.Join(g.bin, name)
	_ = os.Remove(p)
	if err := os.WriteFile(p, []byte("#!"+sh+"\n"+body+"\n"), 0o755); err != nil { //nolint:gosec // A stand-in command.
		g.t.Fatal(err)
	}
}

// Path is where guest path p is on this machine.
func (g *Guest) Path(p string) string { return g.paths.Replace(p) }

// inside is Path for a path that must be in one of the guest's folders.
func (g *Guest) inside(p string) string {
	g.t.Helper()
	if q := g.Path(p); q != p {
		return q
	}
	g.t.Fatalf("guest: %s is outside the folders the guest stands in for (%s)", p, strings.Join(dirs, ", "))
	return ""
}

// WriteFile writes guest path p, as an earlier boot or the guest agent
// would have.
func (g *Guest) WriteFile(p, content string) {
	g.t.Helper()
	q := g.inside(p)
	if err := os.MkdirAll(filepath.Dir(q), 0o755); err != nil {
		g.t.Fatal(err)
	}
	if err := os.WriteFile(q, []byte(content), 0o600); err != nil {
		g.t.Fatal(err)
	}
}

// AgentWrite writes guest path p as qemu-guest-agent's guest-file-open
// (mode "w") and guest-file-write do: an existing file is truncated and
// written in place, keeping its mode (a process holding it open reads the
// new content), a new one is created 0666 whatever the umask (qga's
// DEFAULT_NEW_FILE_MODE), and a missing folder fails.
func (g *Guest) AgentWrite(p, content string) {
	g.t.Helper()
	q := g.inside(p)
	_, err := os.Lstat(q)
	created := os.IsNotExist(err)
	f, err := os.OpenFile(q, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o666)
	if err != nil {
		g.t.Fatalf("guest agent: guest-file-open %s: %v", p, err)
	}
	if created {
		if err := f.Chmod(0o666); err != nil { //nolint:gosec // The agent's mode, modelled.
			g.t.Fatal(err)
		}
	}
	if _, err := f.WriteString(content); err != nil {
		g.t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		g.t.Fatal(err)
	}
}

// Mode is the permission bits of guest path p (a file or a folder); ok is
// false when there is no such path.
func (g *Guest) Mode(p string) (mode fs.FileMode, ok bool) {
	g.t.Helper()
	fi, err := os.Stat(g.inside(p))
	if err != nil {
		return 0, false
	}
	return fi.Mode().Perm(), true
}

// ReadFile is the content of guest path p; ok is false when there is no
// such file.
func (g *Guest) ReadFile(p string) (content string, ok bool) {
	g.t.Helper()
	b, err := os.ReadFile(g.inside(p))
	return string(b), err == nil
}

// Files are the guest's files (guest path: content) in the provider's
// folders, the stand-in commands left out.
func (g *Guest) Files() map[string]string {
	g.t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(g.root, func(p string, e fs.DirEntry, err error) error {
		switch {
		case err != nil:
			return err
		case e.IsDir() && p == g.bin:
			return filepath.SkipDir
		case e.IsDir():
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		out[strings.TrimPrefix(p, g.root)] = string(b)
		return nil
	})
	if err != nil {
		g.t.Fatal(err)
	}
	return out
}

// Exec runs argv in the guest, its guest paths moved under the root (the
// command itself is looked up among the guest's commands), and fails the
// test with its output when it fails.
func (g *Guest) Exec(argv ...string) {
	g.t.Helper()
	cmd := g.Command(argv...)
	if out, err := cmd.CombinedOutput(); err != nil {
		g.t.Fatalf("guest: %s failed: %v\n%s", filepath.Base(argv[0]), err, out)
	}
}

// Command is argv to be run in the guest as Exec runs it, for a test
// that starts it and lets it go on (a service).
func (g *Guest) Command(argv ...string) *exec.Cmd {
	args := make([]string, len(argv)-1)
	for i, a := range argv[1:] {
		args[i] = g.Path(a)
	}
	cmd := exec.Command(filepath.Join(g.bin, filepath.Base(argv[0])), args...)
	cmd.Env = []string{"PATH=" + g.bin, "HOME=" + g.root}
	return cmd
}

// Boot runs user-data as cloud-init does when it runs (a first boot, or a
// new instance ID): every cloud-config part's write_files, then their
// runcmd, in order, then notes that it ran. Other parts (a user's script)
// are not run.
func (g *Guest) Boot(userData string) {
	g.t.Helper()
	type file struct{ Path, Permissions, Encoding, Content string }
	var files []file
	var runcmd []any
	for _, part := range cloudConfigs(g.t, userData) {
		var cfg struct {
			WriteFiles []file `json:"write_files"`
			Runcmd     []any  `json:"runcmd"`
		}
		if err := yaml.Unmarshal([]byte(part), &cfg); err != nil {
			g.t.Fatalf("guest: a cloud-config part is not YAML: %v", err)
		}
		files, runcmd = append(files, cfg.WriteFiles...), append(runcmd, cfg.Runcmd...)
	}
	for _, f := range files {
		content := f.Content
		if f.Encoding == "b64" {
			b, err := base64.StdEncoding.DecodeString(f.Content)
			if err != nil {
				g.t.Fatalf("guest: write_files %s: %v", f.Path, err)
			}
			content = string(b)
		}
		g.WriteFile(f.Path, content)
	}
	for _, c := range runcmd {
		switch c := c.(type) {
		case string:
			g.Exec("sh", "-c", c)
		case []any:
			argv := make([]string, len(c))
			for i, a := range c {
				argv[i], _ = a.(string)
			}
			g.Exec(argv...)
		}
	}
	// As cloud-init notes its run (cloudinit.BootFinishedPath).
	g.WriteFile("/var/lib/cloud/instance/boot-finished", "")
}

// cloudConfigs are the text/cloud-config parts of MIME multipart
// user-data.
func cloudConfigs(t testing.TB, userData string) []string {
	t.Helper()
	header, body, _ := strings.Cut(userData, "\n\n")
	_, params, err := mime.ParseMediaType(strings.TrimPrefix(strings.SplitN(header, "\n", 2)[0], "Content-Type: "))
	if err != nil {
		t.Fatalf("guest: user-data is not MIME multipart: %v", err)
	}
	r := multipart.NewReader(strings.NewReader(body), params["boundary"])
	var out []string
	for {
		p, err := r.NextPart()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(p)
		if strings.HasPrefix(p.Header.Get("Content-Type"), "text/cloud-config") {
			out = append(out, string(b))
		}
	}
}
