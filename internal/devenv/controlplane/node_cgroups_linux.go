//go:build linux

package controlplane

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

func kubepodsCgroups() []string {
	var out []string
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/kubepods*")
	out = append(out, dirs...)
	dirs, _ = filepath.Glob("/sys/fs/cgroup/kubepods*")
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

func kubepodsPIDs() []int {
	seen := map[int]bool{}
	var out []int
	for _, root := range kubepodsCgroups() {
		_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
			if err != nil || d.Name() != "cgroup.procs" {
				return nil
			}
			b, _ := os.ReadFile(p)
			for _, f := range strings.Fields(string(b)) {
				if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
					seen[pid] = true
					out = append(out, pid)
				}
			}
			return nil
		})
	}
	return out
}

// removeCgroup removes a cgroup folder tree, deepest first.
func removeCgroup(root string) {
	var dirs []string
	_ = filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			dirs = append(dirs, p)
		}
		return nil
	})
	for i := len(dirs) - 1; i >= 0; i-- {
		_ = syscall.Rmdir(dirs[i])
	}
}
