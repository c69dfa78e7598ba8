package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// invoker is the user who ran `sudo make run`, from sudo's SUDO_UID and
// SUDO_GID: the user whose shell runs the printed commands.
type invoker struct {
	uid, gid int
}

// sudoInvoker is that user, when this process runs as root under sudo
// for someone else (nil otherwise).
func sudoInvoker() *invoker {
	if os.Geteuid() != 0 {
		return nil
	}
	uid, err1 := strconv.Atoi(os.Getenv("SUDO_UID"))
	gid, err2 := strconv.Atoi(os.Getenv("SUDO_GID"))
	if err1 != nil || err2 != nil || uid == 0 {
		return nil
	}
	return &invoker{uid: uid, gid: gid}
}

// mkdirAll creates dir and whichever of its parents are missing, 0755;
// with u, each folder it creates is handed to u, and no other: a folder
// that was there keeps its owner.
func (u *invoker) mkdirAll(dir string) error {
	dir = filepath.Clean(dir)
	var missing []string
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Lstat(d); err == nil {
			break
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		missing = append(missing, d)
		if d == filepath.Dir(d) {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		d := missing[i]
		if err := os.Mkdir(d, 0o755); err != nil {
			if errors.Is(err, os.ErrExist) {
				continue // made meanwhile, by someone else
			}
			return err
		}
		if u != nil {
			if err := os.Lchown(d, u.uid, u.gid); err != nil {
				return err
			}
		}
	}
	return nil
}

// writeFile writes data to a new file at path, 0600, owned by u when
// given. Whatever was at path is removed first, not followed: a symbolic
// link planted there is replaced, and what it named left alone.
func (u *invoker) writeFile(path string, data []byte) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600) //nolint:gosec // the kubeconfig asked for.
	if err != nil {
		return err
	}
	if u != nil {
		if err := f.Chown(u.uid, u.gid); err != nil {
			_ = f.Close()
			return err
		}
	}
	if _, err := f.Write(data); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// placeTool makes link name target for the printed PATH. A symbolic link,
// except for the user who ran sudo: the tools are in root's cache, below a
// home folder that user cannot enter, so link is a hard link to the same
// file (or, across file systems, a copy), readable by all as the tool is.
// Nothing changes owner.
func (u *invoker) placeTool(target, link string) error {
	if u == nil {
		_ = os.Remove(link)
		return os.Symlink(target, link)
	}
	ts, err := os.Stat(target)
	if err != nil {
		return err
	}
	if ls, err := os.Lstat(link); err == nil && (os.SameFile(ts, ls) ||
		ls.Mode().IsRegular() && ls.Size() == ts.Size() && ls.ModTime().Equal(ts.ModTime())) {
		return nil
	}
	_ = os.Remove(link)
	if err := os.Link(target, link); err == nil {
		return nil
	}
	return copyFile(target, link, ts)
}

func copyFile(from, to string, st os.FileInfo) error {
	in, err := os.Open(from) //nolint:gosec // a tool of the cache.
	if err != nil {
		return err
	}
	defer func() { _ = in.Close() }()
	tmp := to + ".tmp"
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, st.Mode().Perm()) //nolint:gosec // an executable.
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		_ = out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	if err := os.Chtimes(tmp, st.ModTime(), st.ModTime()); err != nil {
		return err
	}
	if err := os.Rename(tmp, to); err != nil {
		return fmt.Errorf("placing %s: %w", to, err)
	}
	return nil
}
