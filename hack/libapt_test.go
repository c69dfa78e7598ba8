package hack_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
)

// aptEnv runs script in bash with hack/lib-apt.sh sourced, its
// policy-rc.d and lock moved into dir; it returns the combined output and
// the exit status.
func aptEnv(t *testing.T, dir, script string) (string, int) {
	t.Helper()
	lib, err := filepath.Abs("lib-apt.sh")
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("bash", "-c", "set -euo pipefail\nsource \"$LIB\"\n"+script)
	cmd.Env = append(os.Environ(),
		"LIB="+lib,
		"EGRESSPROXY_APT_POLICY="+filepath.Join(dir, "policy-rc.d"),
		"EGRESSPROXY_APT_LOCK="+filepath.Join(dir, "apt.lock"),
		"P="+filepath.Join(dir, "policy-rc.d"),
		"D="+dir,
	)
	out, err := cmd.CombinedOutput()
	code := 0
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return string(out), code
}

// The project's policy-rc.d keeps packages from starting services while
// one of its scripts installs them, and is gone after, however the
// install ends; the machine's own is never touched.
func TestAptNoStart(t *testing.T) {
	if _, err := exec.LookPath("flock"); err != nil {
		t.Fatalf("lib-apt.sh needs flock (util-linux): %v", err)
	}

	t.Run("InPlaceDuringTheInstallGoneAfter", func(t *testing.T) {
		dir := t.TempDir()
		out, code := aptEnv(t, dir, `
install() { "$P" start squid; }
rc=0; apt_no_start install || rc=$?
echo "rc=$rc"
[ ! -e "$P" ] && echo gone`)
		if code != 0 || !strings.Contains(out, "rc=101") || !strings.Contains(out, "gone") {
			t.Errorf("want the policy to refuse starts (exit 101) during the install and be removed after; got status %d:\n%s", code, out)
		}
	})

	t.Run("TheMachinesOwnIsKept", func(t *testing.T) {
		dir := t.TempDir()
		own := "#!/bin/sh\n# the machine's own\nexit 0\n"
		p := filepath.Join(dir, "policy-rc.d")
		if err := os.WriteFile(p, []byte(own), 0o755); err != nil { //nolint:gosec // A test's script.
			t.Fatal(err)
		}
		out, code := aptEnv(t, dir, `apt_no_start "$P" start squid && echo used`)
		if code != 0 || !strings.Contains(out, "used") {
			t.Errorf("want the machine's policy-rc.d used as it is; got status %d:\n%s", code, out)
		}
		if b, err := os.ReadFile(p); err != nil || string(b) != own {
			t.Errorf("the machine's policy-rc.d changed: %q, %v", b, err)
		}
	})

	t.Run("AFailedInstallRemovesIt", func(t *testing.T) {
		dir := t.TempDir()
		out, code := aptEnv(t, dir, `
rc=0; apt_no_start false || rc=$?
echo "rc=$rc"
[ ! -e "$P" ] && echo gone`)
		if code != 0 || !strings.Contains(out, "rc=1") || !strings.Contains(out, "gone") {
			t.Errorf("want the install's status returned and the policy removed; got status %d:\n%s", code, out)
		}
	})

	t.Run("AnExitInsideRemovesItAndRunsTheCallersTrap", func(t *testing.T) {
		dir := t.TempDir()
		_, code := aptEnv(t, dir, `
trap 'touch "$D/caller-trap"' EXIT
die() { exit 3; }
apt_no_start die`)
		if code != 3 {
			t.Errorf("exit status %d, want 3", code)
		}
		if _, err := os.Stat(filepath.Join(dir, "policy-rc.d")); !os.IsNotExist(err) {
			t.Errorf("policy-rc.d left after an exit inside the install: %v", err)
		}
		if _, err := os.Stat(filepath.Join(dir, "caller-trap")); err != nil {
			t.Errorf("the caller's EXIT trap did not run: %v", err)
		}
	})

	t.Run("AKilledRunsFileIsRemovedByTheNext", func(t *testing.T) {
		dir := t.TempDir()
		// A marked file whose process is gone: pid 1's start time is
		// never 1 tick after boot for another process.
		_, code := aptEnv(t, dir, `
printf '#!/bin/sh\n# egressproxy policy-rc.d pid=1 start=999999999\nexit 101\n' > "$P"; chmod 755 "$P"`)
		if code != 0 {
			t.Fatal("cannot write the stale file")
		}
		out, code := aptEnv(t, dir, `
mine() { grep -q "pid=$$ " "$P"; }
apt_no_start mine && echo fresh
[ ! -e "$P" ] && echo gone`)
		if code != 0 || !strings.Contains(out, "removed") || !strings.Contains(out, "fresh") || !strings.Contains(out, "gone") {
			t.Errorf("want the stale file removed, one of this run's in its place, and none after; got status %d:\n%s", code, out)
		}
	})

	t.Run("OneInstallAtATime", func(t *testing.T) {
		dir := t.TempDir()
		// Each install notes its start and end; with the lock no install
		// starts while another runs, and neither loses its policy-rc.d.
		var wg sync.WaitGroup
		outs := make([]string, 3)
		for i := range outs {
			wg.Go(func() {
				outs[i], _ = aptEnv(t, dir, `
install() {
  echo "start $$" >> "$D/log"
  grep -q "pid=$$ " "$P" || echo "missing $$" >> "$D/log"
  sleep 0.3
  grep -q "pid=$$ " "$P" || echo "lost $$" >> "$D/log"
  echo "end $$" >> "$D/log"
}
apt_no_start install`)
			})
		}
		wg.Wait()
		b, err := os.ReadFile(filepath.Join(dir, "log"))
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Fields(strings.ReplaceAll(string(b), "\n", " "))
		var running string
		starts := 0
		for i := 0; i+1 < len(lines); i += 2 {
			switch lines[i] {
			case "start":
				if running != "" {
					t.Errorf("install %s started while %s ran:\n%s", lines[i+1], running, b)
				}
				running = lines[i+1]
				starts++
			case "end":
				running = ""
			default:
				t.Errorf("%s %s:\n%s", lines[i], lines[i+1], b)
			}
		}
		if starts != len(outs) {
			t.Errorf("%d installs ran, want %d:\n%s\n%s", starts, len(outs), b, strings.Join(outs, "\n"))
		}
		if _, err := os.Stat(filepath.Join(dir, "policy-rc.d")); !os.IsNotExist(err) {
			t.Errorf("policy-rc.d left after the installs: %v", err)
		}
	})
}

// Every script that installs Debian packages does it through lib-apt.sh
// and waits for dpkg's lock: on a fresh machine the test packages run
// their installs at the same time.
func TestEveryAptGetWaitsItsTurn(t *testing.T) {
	scripts, err := filepath.Glob("*.sh")
	if err != nil || len(scripts) == 0 {
		t.Fatalf("no scripts: %v", err)
	}
	found := 0
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for n, line := range strings.Split(string(b), "\n") {
			code, _, _ := strings.Cut(strings.TrimSpace(line), "#")
			if !aptGetCall.MatchString(code) {
				continue
			}
			found++
			if !strings.Contains(code, "-o DPkg::Lock::Timeout=") {
				t.Errorf("%s:%d: apt-get without -o DPkg::Lock::Timeout=...: %s", s, n+1, strings.TrimSpace(line))
			}
			if s != "lib-apt.sh" && !strings.Contains(string(b), "apt_no_start ") {
				t.Errorf("%s:%d: apt-get outside apt_no_start (hack/lib-apt.sh)", s, n+1)
			}
		}
	}
	if found == 0 {
		t.Fatal("no apt-get call found: the pattern no longer matches the scripts")
	}
}

// aptGetCall is apt-get run as a command (not named in a message).
var aptGetCall = regexp.MustCompile(`(^|[;&|(]\s*|DEBIAN_FRONTEND=\S+\s+)apt-get\s`)
