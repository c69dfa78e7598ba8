//go:build linux

// Package forwarding shares net.ipv4.ip_forward among the parts of the
// project that need it on at the same time on one machine: a node's pods
// reaching a test host through this machine, a test's libvirt NAT
// network. The first to take it records the machine's value; only the
// last to let go puts that back, so that no part turns forwarding off
// under another (each restoring the value it found would). A hold is a
// file naming its process: one whose process is gone (a killed test) is
// dropped by the next Take, Release or Sweep.
package forwarding

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/procid"
)

// Dir holds the lock, the machine's value (before) and the holds
// (holders/); hack/libvirt-down.sh reads the holds too. /run is a tmpfs:
// the records go with a reboot, as the setting does.
var Dir = "/run/egressproxy-forwarding"

// sysctl is the setting (a test's stand-in replaces it).
var sysctl = "/proc/sys/net/ipv4/ip_forward"

var seq atomic.Int64

// Hold is one part's need of forwarding, until Release.
type Hold struct {
	file string
}

// Take records that this process needs forwarding for purpose (a word
// naming the part, such as node) and turns it on; the first hold records
// the machine's value first.
func Take(purpose string) (*Hold, error) {
	unlock, err := lock()
	if err != nil {
		return nil, err
	}
	defer unlock()
	sweep()
	cur, err := read(sysctl)
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(filepath.Join(Dir, "before")); errors.Is(err, os.ErrNotExist) {
		if err := writeFile(filepath.Join(Dir, "before"), cur); err != nil {
			return nil, err
		}
	}
	id, err := procid.Self()
	if err != nil {
		return nil, err
	}
	h := &Hold{file: filepath.Join(Dir, "holders", fmt.Sprintf("%s-%d-%d", purpose, os.Getpid(), seq.Add(1)))}
	if err := writeFile(h.file, id); err != nil {
		return nil, err
	}
	if cur != "1" {
		if err := os.WriteFile(sysctl, []byte("1\n"), 0o644); err != nil { //nolint:gosec // a kernel setting.
			_ = os.Remove(h.file)
			return nil, fmt.Errorf("turning on net.ipv4.ip_forward: %w", err)
		}
	}
	return h, nil
}

// Release drops the hold. When it was the last one, the machine's value
// goes back, unless someone turned forwarding off since. leaveOn says
// that something outside the project (a libvirt network of the
// machine's) needs forwarding now: the value to put back becomes on, for
// whichever hold is the last.
func (h *Hold) Release(leaveOn bool) error {
	if h == nil {
		return nil
	}
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(h.file); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	if leaveOn {
		if err := writeFile(filepath.Join(Dir, "before"), "1"); err != nil {
			return err
		}
	}
	if sweep() > 0 {
		return nil
	}
	return restore()
}

// Sweep drops the holds of processes that are gone and, when none is
// left, puts back the machine's value a killed holder recorded.
func Sweep() error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	if sweep() > 0 {
		return nil
	}
	return restore()
}

// Held reports whether a running process holds forwarding.
func Held() bool {
	_, _, held, err := State()
	return err == nil && held
}

// State reads, at one moment, forwarding now, the machine's own value
// (the one the holds will put back while any is held; now otherwise), and
// whether a running process holds it.
func State() (now, machine string, held bool, err error) {
	unlock, err := lock()
	if err != nil {
		return "", "", false, err
	}
	defer unlock()
	held = sweep() > 0
	if now, err = read(sysctl); err != nil {
		return "", "", false, err
	}
	machine = now
	if held {
		if b, err := read(filepath.Join(Dir, "before")); err == nil {
			machine = b
		}
	}
	return now, machine, held, nil
}

// PutBack puts back value, the machine's own as something outside the
// holds recorded it (an earlier version's record): over forwarding still
// on when nothing holds it; while something does, as the value the last
// hold puts back.
func PutBack(value string) error {
	unlock, err := lock()
	if err != nil {
		return err
	}
	defer unlock()
	if sweep() > 0 {
		return writeFile(filepath.Join(Dir, "before"), value)
	}
	cur, err := read(sysctl)
	if err != nil {
		return err
	}
	if value == "0" && cur == "1" {
		if err := os.WriteFile(sysctl, []byte("0\n"), 0o644); err != nil { //nolint:gosec // a kernel setting, as it was.
			return fmt.Errorf("putting back net.ipv4.ip_forward = 0: %w", err)
		}
	}
	return nil
}

// lock takes the machine-wide lock of Dir; the returned func lets go.
func lock() (func(), error) {
	if err := os.MkdirAll(filepath.Join(Dir, "holders"), 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(Dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("locking %s: %w", f.Name(), err)
	}
	return func() { _ = f.Close() }, nil
}

// sweep removes the holds whose process is gone and counts the others.
// A hold being written (empty) is the taker's, who holds the lock: none
// is seen here.
func sweep() int {
	ents, _ := os.ReadDir(filepath.Join(Dir, "holders"))
	live := 0
	for _, e := range ents {
		p := filepath.Join(Dir, "holders", e.Name())
		rec, err := os.ReadFile(p) //nolint:gosec // the project's own record.
		if err != nil {
			continue
		}
		if procid.Running(string(rec)) {
			live++
			continue
		}
		_ = os.Remove(p)
	}
	return live
}

// restore puts the recorded value back over forwarding still on, and
// removes the record.
func restore() error {
	rec := filepath.Join(Dir, "before")
	before, err := read(rec)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	cur, err := read(sysctl)
	if err != nil {
		return err
	}
	if before == "0" && cur == "1" {
		if err := os.WriteFile(sysctl, []byte(before+"\n"), 0o644); err != nil { //nolint:gosec // a kernel setting, as it was.
			return fmt.Errorf("putting back net.ipv4.ip_forward = %s: %w", before, err)
		}
	}
	return os.Remove(rec)
}

func read(path string) (string, error) {
	b, err := os.ReadFile(path) //nolint:gosec // the setting, or the project's record of it.
	return strings.TrimSpace(string(b)), err
}

// writeFile writes s to path in one rename: a kill leaves no half record.
func writeFile(path, s string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(s+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
