package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// sudoUser is the user the tests play sudo's caller with: nobody.
const sudoUser = 65534

// asUser runs argv as the user sudoUser (as root only) and returns its
// output and error.
func asUser(t *testing.T, argv ...string) (string, error) {
	t.Helper()
	c := exec.Command(argv[0], argv[1:]...) //nolint:gosec // the test's commands.
	c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: sudoUser, Gid: sudoUser}}
	c.Dir = "/"
	b, err := c.CombinedOutput()
	return string(b), err
}

// needRoot skips a test run by another user (fails it in CI): it plays
// the root that sudo makes.
func needRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		if testenv.CI() {
			t.Fatal("needs root, to be the root that sudo makes")
		}
		t.Skip("needs root, to be the root that sudo makes")
	}
}

// openToAll lets everyone enter dir and its parent (t.TempDir's, 0700).
func openToAll(t *testing.T, dir string) {
	t.Helper()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o755); err != nil { //nolint:gosec // a test folder, to be entered.
			t.Fatal(err)
		}
	}
}

func owner(t *testing.T, path string) uint32 {
	t.Helper()
	st, err := os.Lstat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Uid //nolint:forcetypeassert // Linux.
}

// TestSudoKubeconfig: under `sudo make run` (SUDO_UID and SUDO_GID set,
// running as root) the kubeconfig and the folders made for it belong to
// the user who ran sudo, who can read it; the folder that was there, and
// the file a symbolic link planted at the kubeconfig's path names, keep
// their owner and content. Without sudo nothing changes owner.
func TestSudoKubeconfig(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	openToAll(t, root) // a repository's folder: readable by its user
	victim := filepath.Join(root, "victim")
	if err := os.WriteFile(victim, []byte("root's"), 0o600); err != nil {
		t.Fatal(err)
	}
	there := filepath.Join(root, "repo")
	if err := os.Mkdir(there, 0o755); err != nil {
		t.Fatal(err)
	}
	kubeconfig := filepath.Join(there, ".cache", "run", "kubeconfig")

	t.Setenv("SUDO_UID", "65534")
	t.Setenv("SUDO_GID", "65534")
	u := sudoInvoker()
	if u == nil || u.uid != sudoUser || u.gid != sudoUser {
		t.Fatalf("sudoInvoker() = %+v; want uid and gid %d", u, sudoUser)
	}
	if err := u.mkdirAll(filepath.Dir(kubeconfig)); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(victim, kubeconfig); err != nil {
		t.Fatal(err)
	}
	if err := u.writeFile(kubeconfig, []byte("apiVersion: v1\nkind: Config\n")); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]uint32{
		kubeconfig:                            sudoUser,
		filepath.Join(there, ".cache", "run"): sudoUser,
		filepath.Join(there, ".cache"):        sudoUser,
		there:                                 0,
		root:                                  0,
		victim:                                0,
	} {
		if got := owner(t, path); got != want {
			t.Errorf("%s belongs to uid %d; want %d", path, got, want)
		}
	}
	if b, _ := os.ReadFile(victim); string(b) != "root's" { //nolint:gosec // the test's file.
		t.Errorf("the file the planted link named holds %q; want it untouched", b)
	}
	if st, _ := os.Lstat(kubeconfig); !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
		t.Errorf("the kubeconfig is %v; want a regular file, 0600", st.Mode())
	}
	if out, err := asUser(t, "cat", kubeconfig); err != nil || !strings.Contains(out, "kind: Config") {
		t.Errorf("the user who ran sudo reads the kubeconfig: %q, %v", out, err)
	}

	t.Run("WithoutSudo", func(t *testing.T) {
		t.Setenv("SUDO_UID", "")
		var u *invoker = sudoInvoker()
		if u != nil {
			t.Fatalf("sudoInvoker() = %+v without SUDO_UID; want nil", u)
		}
		f := filepath.Join(root, "plain", "kubeconfig")
		if err := u.mkdirAll(filepath.Dir(f)); err != nil {
			t.Fatal(err)
		}
		if err := u.writeFile(f, []byte("x")); err != nil {
			t.Fatal(err)
		}
		if owner(t, f) != 0 || owner(t, filepath.Dir(f)) != 0 {
			t.Error("without sudo, the kubeconfig or its folder changed owner")
		}
	})
}

// TestSudoTools: the tools the printed PATH names (kubectl, crossplane)
// live in root's cache, below a folder only root enters; under sudo they
// are placed so that the user who ran sudo runs them, and they keep their
// owner; without sudo they are symbolic links.
func TestSudoTools(t *testing.T) {
	needRoot(t)
	root := t.TempDir()
	openToAll(t, root)
	cache := filepath.Join(root, "root-home", "cache")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(filepath.Dir(cache), 0o700); err != nil { // as /root
		t.Fatal(err)
	}
	tool := filepath.Join(cache, "kubectl")
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho kubectl here\n"), 0o755); err != nil { //nolint:gosec // an executable.
		t.Fatal(err)
	}
	bin := filepath.Join(root, "bin")
	if err := os.Mkdir(bin, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(bin, "kubectl")

	if err := (*invoker)(nil).placeTool(tool, link); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Lstat(link); st.Mode()&os.ModeSymlink == 0 {
		t.Errorf("without sudo the tool is %v; want a symbolic link", st.Mode())
	}
	if out, err := asUser(t, link); err == nil {
		t.Errorf("the user runs the symbolic link into root's home (%q); want it refused, or this test shows nothing", out)
	}

	u := &invoker{uid: sudoUser, gid: sudoUser}
	for range 2 { // the second time finds it in place
		if err := u.placeTool(tool, link); err != nil {
			t.Fatal(err)
		}
		if out, err := asUser(t, link); err != nil || out != "kubectl here\n" {
			t.Errorf("the user who ran sudo runs %s: %q, %v", link, out, err)
		}
	}
	if owner(t, link) != 0 || owner(t, tool) != 0 {
		t.Error("placing the tool changed an owner")
	}
}
