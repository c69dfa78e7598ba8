package ociimage

import (
	"io/fs"
	"syscall"
)

// owner is the numeric owner of a file (root where the platform does not
// say).
func owner(info fs.FileInfo) (uid, gid int) {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return int(st.Uid), int(st.Gid)
	}
	return 0, 0
}
