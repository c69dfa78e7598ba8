package packages_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"golang.org/x/mod/semver"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/controlplane"
)

// TestVersionFromTags runs hack/version.sh on a git repository of its own:
// a tagged commit is its tag; any other is a pre-release of the patch after
// the newest release tag it contains, which semver (and so Crossplane's
// package manager) sorts above that release.
func TestVersionFromTags(t *testing.T) {
	root, err := controlplane.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	repo := t.TempDir()
	git := func(args ...string) {
		t.Helper()
		cmd := exec.Command("git", append([]string{"-c", "user.name=t", "-c", "user.email=t@example.invalid", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false"}, args...)...)
		cmd.Dir = repo
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("git %v: %v\n%s", args, err, out)
		}
	}
	commit := func() { git("commit", "-q", "--allow-empty", "-m", "c") }
	version := func() string {
		t.Helper()
		out, err := exec.Command("bash", filepath.Join(root, "hack", "version.sh"), repo).CombinedOutput()
		if err != nil {
			t.Fatalf("hack/version.sh: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	dev := func(next string) *regexp.Regexp {
		return regexp.MustCompile(`^` + regexp.QuoteMeta(next) + `-dev\.[0-9]{8}\.g?[0-9a-f]{12}$`)
	}
	git("init", "-q")
	commit()
	if v := version(); !dev("v0.2.0").MatchString(v) {
		t.Errorf("no tag: %s; want v0.2.0-dev.<date>.<commit>", v)
	}
	git("tag", "v0.2.0")
	if v := version(); v != "v0.2.0" {
		t.Errorf("at tag v0.2.0: %s", v)
	}
	commit()
	v := version()
	if !dev("v0.2.1").MatchString(v) || semver.Compare(v, "v0.2.0") <= 0 || semver.Compare(v, "v0.2.1") >= 0 {
		t.Errorf("after v0.2.0: %s; want v0.2.1-dev.<date>.<commit>, above v0.2.0 and below v0.2.1", v)
	}
	// A release candidate is its tag where tagged, and no release.
	git("tag", "v0.3.0-rc.1")
	if v := version(); v != "v0.3.0-rc.1" {
		t.Errorf("at tag v0.3.0-rc.1: %s", v)
	}
	commit()
	if v := version(); !dev("v0.2.1").MatchString(v) {
		t.Errorf("after v0.3.0-rc.1: %s; want v0.2.1-dev... (a pre-release is no release)", v)
	}
	// Tags sort as versions, not as strings.
	git("tag", "v0.9.0", "HEAD~1")
	git("tag", "v0.10.0", "HEAD~1")
	if v := version(); !dev("v0.10.1").MatchString(v) {
		t.Errorf("after v0.9.0 and v0.10.0: %s; want v0.10.1-dev...", v)
	}
	// Uncommitted changes are marked.
	if err := os.WriteFile(filepath.Join(repo, "f"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	git("add", "f")
	if v := version(); !strings.HasSuffix(v, ".dirty") {
		t.Errorf("with a change staged: %s; want .dirty", v)
	}
}
