package testenv

import (
	"archive/tar"
	"errors"
	"io"
	"testing"
)

// EachTarEntry calls f with the header and the content of each entry of
// the tar stream r, in order, and fails t if the stream does not read.
func EachTarEntry(t testing.TB, r io.Reader, f func(h *tar.Header, content io.Reader)) {
	t.Helper()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		f(h, tr)
	}
}
