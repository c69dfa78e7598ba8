package kvm

import (
	"errors"
	"os"
	"sync"
)

// DefaultMaxSpoolBytes is how many bytes the images served without a
// Content-Length may hold at once in the provider's temporary directory,
// across every config, host and Backend of the process, unless
// SetMaxSpoolBytes says otherwise.
const DefaultMaxSpoolBytes = 4 << 30

// imageSpool is the process's spool budget: the disk it guards is the
// pod's, however many Backends share it.
var imageSpool = &spool{limit: DefaultMaxSpoolBytes}

// SetMaxSpoolBytes sets how many bytes the images served without a
// Content-Length may hold at once in the provider's temporary directory
// (the provider's main sets it from a flag): 0 restores
// DefaultMaxSpoolBytes, a negative value spools nothing, so that every
// image needs a Content-Length. Bytes already spooled stay charged until
// their files are closed.
func SetMaxSpoolBytes(n int64) {
	switch {
	case n == 0:
		n = DefaultMaxSpoolBytes
	case n < 0:
		n = 0
	}
	imageSpool.mu.Lock()
	defer imageSpool.mu.Unlock()
	imageSpool.limit = n
}

// Why a spool write was refused.
var (
	// errSpoolBusy: the bytes would fit the budget, were it not for the
	// other spool files open now.
	errSpoolBusy = errors.New("the spool budget is in use")
	// errSpoolTooLarge: the file alone would exceed the whole budget.
	errSpoolTooLarge = errors.New("larger than the spool budget")
)

// spool bounds the bytes of every open spool file together. A file is
// charged as it is written, before the bytes reach the disk, and released
// when it is closed (the files are unlinked at once, so closing one frees
// its disk space).
type spool struct {
	mu    sync.Mutex
	limit int64
	used  int64
	// dir holds the spool files; "" is os.TempDir() (tests set their own).
	dir string
}

// create opens an unlinked spool file charged to s.
func (s *spool) create() (*spoolFile, error) {
	s.mu.Lock()
	dir := s.dir
	s.mu.Unlock()
	f, err := os.CreateTemp(dir, "kvm-image-*")
	if err != nil {
		return nil, err
	}
	_ = os.Remove(f.Name()) // unlinked: gone when closed, whatever happens
	return &spoolFile{f: f, s: s}, nil
}

// take charges n more bytes to a file already holding charged, or says
// why not.
func (s *spool) take(charged, n int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case charged+n > s.limit:
		return errSpoolTooLarge
	case s.used+n > s.limit:
		return errSpoolBusy
	}
	s.used += n
	return nil
}

func (s *spool) release(n int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.used -= n
}

// budget returns the limit and what open spool files hold now.
func (s *spool) budget() (limit, used int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.limit, s.used
}

// spoolFile is a spool file whose writes are charged to its spool. It
// has no ReadFrom, so io.Copy goes through Write.
type spoolFile struct {
	f       *os.File
	s       *spool
	charged int64
}

func (w *spoolFile) Write(p []byte) (int, error) {
	if err := w.s.take(w.charged, int64(len(p))); err != nil {
		return 0, err
	}
	w.charged += int64(len(p))
	return w.f.Write(p)
}

func (w *spoolFile) Read(p []byte) (int, error) { return w.f.Read(p) }

func (w *spoolFile) Seek(offset int64, whence int) (int64, error) {
	return w.f.Seek(offset, whence)
}

// Close closes the file, which frees its disk space, and releases its
// charge; a second Close releases nothing.
func (w *spoolFile) Close() error {
	err := w.f.Close()
	w.s.release(w.charged)
	w.charged = 0
	return err
}
