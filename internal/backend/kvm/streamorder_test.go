package kvm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"

	"github.com/digitalocean/go-libvirt/socket"
	"github.com/google/go-cmp/cmp"
)

// pkt is a libvirt packet for streamOrder's tests: procedure, type,
// serial, status and payload.
type pkt struct {
	proc, typ, serial, status uint32
	payload                   string
}

func (p pkt) bytes() []byte {
	b := make([]byte, packetHeader+len(p.payload))
	binary.BigEndian.PutUint32(b, uint32(len(b))) //nolint:gosec // A test packet's few bytes.
	binary.BigEndian.PutUint32(b[12:], p.proc)
	binary.BigEndian.PutUint32(b[16:], p.typ)
	binary.BigEndian.PutUint32(b[20:], p.serial)
	binary.BigEndian.PutUint32(b[24:], p.status)
	copy(b[packetHeader:], p.payload)
	return b
}

func (p pkt) String() string {
	return fmt.Sprintf("proc=%d type=%d serial=%d status=%d %q", p.proc, p.typ, p.serial, p.status, p.payload)
}

// readConn is a net.Conn that reads from a buffer.
type readConn struct {
	net.Conn
	r io.Reader
}

func (c readConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// TestStreamOrder feeds packets as libvirtd sent them (a download's data
// before its reply was seen on the real libvirtd) and checks what
// go-libvirt reads: the reply first, then the stream, nothing of a stream
// after its end or after a failed reply, other calls untouched.
func TestStreamOrder(t *testing.T) {
	const dl, up, other = procStorageVolDownload, procStorageVolUpload, 84
	reply := func(proc, serial uint32) pkt { return pkt{proc, socket.Reply, serial, socket.StatusOK, ""} }
	data := func(serial uint32, s string) pkt { return pkt{dl, socket.Stream, serial, socket.StatusContinue, s} }
	eof := func(serial uint32) pkt { return pkt{dl, socket.Stream, serial, socket.StatusContinue, ""} }
	failed := pkt{dl, socket.Reply, 9, socket.StatusError, "no such volume"}
	cases := []struct {
		name   string
		in     []pkt
		wantAt []int // indices of in, in the order go-libvirt must read them
	}{
		{"InOrder", []pkt{reply(dl, 1), data(1, "ab"), data(1, "c"), eof(1)}, []int{0, 1, 2, 3}},
		{"DataBeforeTheReply", []pkt{data(2, "ab"), data(2, "c"), reply(dl, 2), eof(2)}, []int{2, 0, 1, 3}},
		{"WholeStreamBeforeTheReply", []pkt{data(3, "ab"), eof(3), reply(dl, 3)}, []int{2, 0, 1}},
		{"OtherCallsInBetweenPass", []pkt{data(4, "ab"), reply(other, 5), reply(dl, 4), eof(4)}, []int{1, 2, 0, 3}},
		{"PacketsAfterTheEndAreDropped", []pkt{reply(dl, 6), eof(6), data(6, "late"), {dl, socket.Stream, 6, socket.StatusError, "aborted"}}, []int{0, 1}},
		{"AFailedReplyDropsItsStream", []pkt{data(9, "ab"), failed, data(9, "c")}, []int{1}},
		{"UploadConfirmationEndsIt", []pkt{reply(up, 7), {up, socket.Stream, 7, socket.StatusOK, ""}, {up, socket.Stream, 7, socket.StatusError, "late"}}, []int{0, 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var in, want bytes.Buffer
			for _, p := range tc.in {
				in.Write(p.bytes())
			}
			for _, i := range tc.wantAt {
				want.Write(tc.in[i].bytes())
			}
			got, err := io.ReadAll(newStreamOrder(readConn{r: &in}))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(parsePkts(t, want.Bytes()), parsePkts(t, got)); diff != "" {
				t.Errorf("go-libvirt reads (-want +got):\n%s", diff)
			}
		})
	}
}

func parsePkts(t *testing.T, b []byte) []string {
	t.Helper()
	var out []string
	for len(b) > 0 {
		if len(b) < packetHeader {
			t.Fatalf("%d bytes left over", len(b))
		}
		n := binary.BigEndian.Uint32(b)
		p := pkt{binary.BigEndian.Uint32(b[12:]), binary.BigEndian.Uint32(b[16:]), binary.BigEndian.Uint32(b[20:]), binary.BigEndian.Uint32(b[24:]), string(b[packetHeader:n])}
		out = append(out, p.String())
		b = b[n:]
	}
	return out
}
