//go:build linux

package controlplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// cgroupFS is where the cgroup hierarchies are mounted.
const cgroupFS = "/sys/fs/cgroup"

// nodeCgroups are the node's cgroup folders (its cgroupRoot), one per
// hierarchy on cgroup v1, one on v2: what holds its pods and containers.
func nodeCgroups() []string {
	var out []string
	dirs, _ := filepath.Glob(filepath.Join(cgroupFS, "*", nodeCgroup))
	dirs = append(dirs, filepath.Join(cgroupFS, nodeCgroup))
	for _, d := range dirs {
		if fi, err := os.Stat(d); err == nil && fi.IsDir() {
			out = append(out, d)
		}
	}
	return out
}

// makeNodeCgroups creates the node's cgroup in every hierarchy: the
// kubelet refuses a cgroupRoot missing from one it uses. On v1 a new
// cpuset has no CPUs or memory nodes until given its parent's.
func makeNodeCgroups() error {
	var roots []string
	if fileExists(filepath.Join(cgroupFS, "cgroup.procs")) {
		roots = append(roots, cgroupFS) // v2, or a v1 named hierarchy mounted there
	}
	ents, _ := os.ReadDir(cgroupFS)
	for _, e := range ents {
		if p := filepath.Join(cgroupFS, e.Name()); fileExists(filepath.Join(p, "cgroup.procs")) {
			roots = append(roots, p)
		}
	}
	if len(roots) == 0 {
		return fmt.Errorf("no cgroup hierarchy mounted under %s", cgroupFS)
	}
	for _, r := range roots {
		d := filepath.Join(r, nodeCgroup)
		if err := os.Mkdir(d, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			return fmt.Errorf("creating the node's cgroup: %w", err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			if b, err := os.ReadFile(filepath.Join(d, f)); err == nil && strings.TrimSpace(string(b)) == "" {
				parent, _ := os.ReadFile(filepath.Join(r, f))
				if err := os.WriteFile(filepath.Join(d, f), parent, 0o644); err != nil {
					return fmt.Errorf("setting %s of the node's cgroup: %w", f, err)
				}
			}
		}
	}
	return nil
}

// nodeCgroupPIDs are the processes in the node's cgroups: its pods'.
func nodeCgroupPIDs() []int {
	seen := map[int]bool{}
	var out []int
	for _, root := range nodeCgroups() {
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
