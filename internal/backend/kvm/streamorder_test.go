package kvm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"github.com/digitalocean/go-libvirt/socket"
	"github.com/digitalocean/go-libvirt/socket/dialers"
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

// Write takes what go-libvirt sends.
func (c readConn) Write(p []byte) (int, error) { return len(p), nil }

// called has s note the volume stream calls of the serials of in's
// stream packets as sent, as go-libvirt sends them: a byte at a time
// tests Write's parse as well as any split.
func called(t *testing.T, s *streamOrder, in []pkt) {
	t.Helper()
	for _, p := range in {
		if p.typ != socket.Stream {
			continue
		}
		for _, b := range (pkt{p.proc, socket.Call, p.serial, socket.StatusOK, "args"}).bytes() {
			if _, err := s.Write([]byte{b}); err != nil {
				t.Fatal(err)
			}
		}
	}
}

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
			s := newStreamOrder(readConn{r: &in})
			called(t, s, tc.in)
			got, err := io.ReadAll(s)
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

// hostileStream is a libvirt "host" that sends n stream packets of a
// volume download, size bytes each, for serials from first on (one
// each, or all first's when same), then one ordinary reply: what a
// tenant's host (a namespaced config's kvm.hosts) can send on the
// connection the provider dials it.
type hostileStream struct {
	n, size int
	first   uint32
	same    bool
	sent    int
	cur     []byte
}

func (h *hostileStream) Read(p []byte) (int, error) {
	for len(h.cur) == 0 {
		serial := h.first
		if !h.same {
			serial += uint32(h.sent) //nolint:gosec // A test's count.
		}
		switch {
		case h.sent < h.n:
			h.cur = pkt{procStorageVolDownload, socket.Stream, serial, socket.StatusContinue, string(make([]byte, h.size))}.bytes()
		case h.sent == h.n:
			h.cur = pkt{84, socket.Reply, 1, socket.StatusOK, ""}.bytes()
		default:
			return 0, io.EOF
		}
		h.sent++
	}
	n := copy(p, h.cur)
	h.cur = h.cur[n:]
	return n, nil
}

// TestHostStreamDataIsBounded: a host sends stream packets the provider
// holds for later (a stream's data before its call's reply): for calls
// it never made, or more than maxHeld for one it made. The connection
// fails saying so, holding little; its calls then fail with "libvirt
// connection closed" and that reason.
func TestHostStreamDataIsBounded(t *testing.T) {
	for name, tc := range map[string]struct {
		host *hostileStream
		call bool
		want string
	}{
		"ForCallsNotMade": {
			host: &hostileStream{n: 100, size: 1 << 20, first: 1000},
			want: "libvirt sent stream data for a call the provider did not make",
		},
		"BeyondWhatIsHeld": {
			host: &hostileStream{n: 100, size: 1 << 20, first: 1000, same: true},
			call: true,
			want: "libvirt sent more than 16 MiB of stream data before its reply",
		},
	} {
		t.Run(name, func(t *testing.T) {
			s := newStreamOrder(readConn{r: tc.host})
			if tc.call {
				called(t, s, []pkt{{procStorageVolDownload, socket.Stream, tc.host.first, 0, ""}})
			}
			_, err := s.Read(make([]byte, 1))
			if err == nil || err.Error() != tc.want {
				t.Errorf("Read = %v; want %q", err, tc.want)
			}
			if _, again := s.Read(make([]byte, 1)); !errors.Is(again, err) {
				t.Errorf("a second Read = %v; want the connection failed (%v)", again, err)
			}
			held := 0
			for _, ps := range s.held {
				for _, p := range ps {
					held += len(p)
				}
			}
			if held > maxHeld {
				t.Errorf("%d MiB held; want at most %d", held>>20, maxHeld>>20)
			}
			if err := s.failure(); err == nil {
				t.Error("the failure is not kept for the link's reason")
			}
		})
	}
}

// downloadCall is a StorageVolDownload call's packet asking for length
// bytes of volume default/name.
func downloadCall(serial uint32, name string, length uint64) []byte {
	var args []byte
	for _, s := range []string{"default", name, "/var/lib/libvirt/images/" + name} {
		args = binary.BigEndian.AppendUint32(args, uint32(len(s))) //nolint:gosec // A test's few bytes.
		args = append(args, s...)
		args = append(args, make([]byte, (4-len(s)%4)%4)...)
	}
	args = binary.BigEndian.AppendUint64(args, 0)
	args = binary.BigEndian.AppendUint64(args, length)
	args = binary.BigEndian.AppendUint32(args, 0)
	return pkt{procStorageVolDownload, socket.Call, serial, socket.StatusOK, string(args)}.bytes()
}

// TestHostDownloadIsBoundedByItsLength: a download passes the bytes its
// call asked for, before its reply or after; one more fails the
// connection.
func TestHostDownloadIsBoundedByItsLength(t *testing.T) {
	reply := pkt{procStorageVolDownload, socket.Reply, 5, socket.StatusOK, ""}
	data := func(s string) pkt { return pkt{procStorageVolDownload, socket.Stream, 5, socket.StatusContinue, s} }
	eof := pkt{procStorageVolDownload, socket.Stream, 5, socket.StatusContinue, ""}
	for name, tc := range map[string]struct {
		in      []pkt
		wantErr bool
	}{
		"AsAskedBeforeTheReply": {in: []pkt{data("abcdefgh"), reply, data("ij"), eof}},
		"AsAskedAfterTheReply":  {in: []pkt{reply, data("abcdefgh"), data("ij"), eof}},
		"MoreBeforeTheReply":    {in: []pkt{data("abcdefgh"), data("ijk"), reply}, wantErr: true},
		"MoreAfterTheReply":     {in: []pkt{reply, data("abcdefgh"), data("ijk"), eof}, wantErr: true},
	} {
		t.Run(name, func(t *testing.T) {
			var in bytes.Buffer
			for _, p := range tc.in {
				in.Write(p.bytes())
			}
			s := newStreamOrder(readConn{r: &in})
			if _, err := s.Write(downloadCall(5, "seed-1.iso", 10)); err != nil {
				t.Fatal(err)
			}
			_, err := io.ReadAll(s)
			const want = "libvirt sent more of a volume download than the bytes asked for"
			if tc.wantErr && (err == nil || err.Error() != want) {
				t.Errorf("reading = %v; want %q", err, want)
			}
			if !tc.wantErr && err != nil {
				t.Errorf("reading = %v; want the download", err)
			}
		})
	}
}

// TestGoLibvirtDownloadIsBoundedByItsLength drives go-libvirt itself over
// streamOrder against a host that answers every call and sends size
// bytes for a download of 10: what go-libvirt writes is what Write
// parses.
func TestGoLibvirtDownloadIsBoundedByItsLength(t *testing.T) {
	for name, size := range map[string]int{"AsAsked": 10, "More": 11} {
		t.Run(name, func(t *testing.T) {
			client, host := net.Pipe()
			defer func() { _ = host.Close() }()
			go func() {
				for {
					var n [4]byte
					if _, err := io.ReadFull(host, n[:]); err != nil {
						return
					}
					b := make([]byte, binary.BigEndian.Uint32(n[:])-4)
					if _, err := io.ReadFull(host, b); err != nil {
						return
					}
					proc, serial := binary.BigEndian.Uint32(b[8:]), binary.BigEndian.Uint32(b[16:])
					// Zeros: an empty list of auth types, a false.
					reply := pkt{proc, socket.Reply, serial, socket.StatusOK, "\x00\x00\x00\x00"}.bytes()
					binary.BigEndian.PutUint32(reply[4:], binary.BigEndian.Uint32(b))     // program
					binary.BigEndian.PutUint32(reply[8:], binary.BigEndian.Uint32(b[4:])) // version
					out := [][]byte{reply}
					if proc == procStorageVolDownload {
						for _, p := range []pkt{{proc, socket.Stream, serial, socket.StatusContinue, strings.Repeat("x", size)}, {proc, socket.Stream, serial, socket.StatusOK, ""}} {
							b := p.bytes()
							copy(b[4:12], reply[4:12])
							out = append(out, b)
						}
					}
					for _, o := range out {
						if _, err := host.Write(o); err != nil {
							return
						}
					}
				}
			}()
			s := newStreamOrder(client)
			l := libvirt.NewWithDialer(dialers.NewAlreadyConnected(s))
			if err := l.ConnectToURI(libvirt.QEMUSystem); err != nil {
				t.Fatal(err)
			}
			var got bytes.Buffer
			err := l.StorageVolDownload(libvirt.StorageVol{Pool: "default", Name: "seed.iso", Key: "/var/lib/libvirt/images/seed.iso"}, &got, 0, 10, 0)
			if size == 10 && (err != nil || got.Len() != 10) {
				t.Errorf("download = %d bytes, %v; want 10", got.Len(), err)
			}
			if size > 10 && (err == nil || s.failure() == nil) {
				t.Errorf("download = %d bytes, %v, connection failed: %v; want it failed", got.Len(), err, s.failure())
			}
		})
	}
}
