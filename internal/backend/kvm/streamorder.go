package kvm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/digitalocean/go-libvirt/socket"
)

// streamOrder sits between go-libvirt and the connection to libvirtd and
// puts a volume stream's packets in the order go-libvirt reads them in.
//
// libvirtd may send the first data packets of a StorageVolDownload before
// the reply to the call that opened the stream (its event loop and the
// worker replying to the call race). go-libvirt takes the first packet of
// a serial as the reply, so it then drops a data packet, takes the real
// reply (status OK) for the end of the stream and returns with part of
// the data, or none, and no error. Its router then blocks for good
// delivering the next data packet to a caller that no longer reads,
// holding the lock every other call needs: the connection stops
// answering, and every later call runs out of its budget ("did not
// answer within 30s"). This holds a stream's packets back until its reply
// has passed, and drops those that come after the stream ended or after
// a failed reply, so go-libvirt never waits on them.
//
// What it holds is bounded: a host (a tenant's, for a namespaced config)
// may send stream packets of its choosing. Only the serials of volume
// stream calls this connection sent are held, at most maxHeld bytes in
// all, and a download passes no more than the length its call asked for;
// past either the connection fails (err).
type streamOrder struct {
	net.Conn

	// out is what Read hands go-libvirt next.
	out []byte
	// held are stream packets that came before their call's reply.
	held map[uint32][][]byte
	// open are the volume streams whose reply passed and that have not
	// ended.
	open map[uint32]bool
	// ended are recent volume streams that ended or failed: packets of
	// theirs are dropped.
	ended map[uint32]bool
	// heldBytes is the size of held.
	heldBytes int
	// left is what an open or called download may still send (its
	// call's length); absent, no bound but maxHeld.
	left map[uint32]uint64

	// mu guards called and err: Write (go-libvirt's senders) notes the
	// calls, Read (its listener) takes them.
	mu sync.Mutex
	// called are the volume stream calls sent whose reply has not come,
	// with a download's length (0: not known).
	called map[uint32]uint64
	// err, once set, is what every Read returns: the connection failed.
	err error
	// w is the packet being written (Write's parse of go-libvirt's bytes).
	w struct {
		head [packetHeader]byte
		n    int // bytes of head filled
		rest uint32
		call []byte // a download call's payload, kept to read its length
		keep bool
	}
}

// Volume stream procedures (REMOTE_PROC_STORAGE_VOL_UPLOAD and _DOWNLOAD,
// go-libvirt's internal constants).
const (
	procStorageVolUpload   = 208
	procStorageVolDownload = 209
)

// packetHeader is a libvirt RPC packet's length word and header.
const packetHeader = 4 + 24

// maxPacket bounds a packet's length (libvirt's own limit is 32 MiB).
const maxPacket = 64 << 20

// endedKept is how many ended streams are remembered.
const endedKept = 64

// maxHeld bounds the stream packets held before their reply: libvirtd
// sends a few before it, and the driver downloads seeds of a few MiB.
const maxHeld = 16 << 20

func newStreamOrder(c net.Conn) *streamOrder {
	return &streamOrder{Conn: c, held: map[uint32][][]byte{}, open: map[uint32]bool{}, ended: map[uint32]bool{},
		left: map[uint32]uint64{}, called: map[uint32]uint64{}}
}

// Read returns the packets in go-libvirt's order. go-libvirt's reader is
// its single listening goroutine, so Read needs no lock but for what
// Write shares.
func (s *streamOrder) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		if err := s.failure(); err != nil {
			return 0, err
		}
		pkt, err := s.next()
		if err != nil {
			return 0, err
		}
		if err := s.route(pkt); err != nil {
			s.mu.Lock()
			s.err = err
			s.mu.Unlock()
			return 0, err
		}
	}
	n := copy(p, s.out)
	s.out = s.out[n:]
	return n, nil
}

// next reads one whole packet.
func (s *streamOrder) next() ([]byte, error) {
	var lenWord [4]byte
	if _, err := io.ReadFull(s.Conn, lenWord[:]); err != nil {
		return nil, err
	}
	n := binary.BigEndian.Uint32(lenWord[:])
	if n < packetHeader || n > maxPacket {
		return nil, fmt.Errorf("libvirt sent a packet of %d bytes", n)
	}
	pkt := make([]byte, n)
	copy(pkt, lenWord[:])
	if _, err := io.ReadFull(s.Conn, pkt[4:]); err != nil {
		return nil, err
	}
	return pkt, nil
}

// failure is the error the connection failed with, if it did.
func (s *streamOrder) failure() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *streamOrder) route(pkt []byte) error {
	proc := binary.BigEndian.Uint32(pkt[12:])
	typ := binary.BigEndian.Uint32(pkt[16:])
	serial := binary.BigEndian.Uint32(pkt[20:])
	status := binary.BigEndian.Uint32(pkt[24:])
	if proc != procStorageVolUpload && proc != procStorageVolDownload {
		s.out = append(s.out, pkt...)
		return nil
	}
	switch typ {
	case socket.Reply, socket.ReplyWithFDs:
		s.out = append(s.out, pkt...)
		s.mu.Lock()
		length := s.called[serial]
		delete(s.called, serial)
		s.mu.Unlock()
		if _, ok := s.left[serial]; !ok && length > 0 {
			s.left[serial] = length
		}
		held := s.held[serial]
		delete(s.held, serial)
		for _, h := range held {
			s.heldBytes -= len(h)
		}
		if status != socket.StatusOK {
			s.end(serial) // the call failed: nobody reads its stream
			return nil
		}
		s.open[serial] = true
		for _, h := range held {
			s.stream(serial, h)
		}
	case socket.Stream:
		switch {
		case s.ended[serial]:
		case s.open[serial]:
			if err := s.count(serial, pkt); err != nil {
				return err
			}
			s.stream(serial, pkt)
		default:
			s.mu.Lock()
			length, called := s.called[serial]
			s.mu.Unlock()
			if !called {
				return errors.New("libvirt sent stream data for a call the provider did not make")
			}
			if _, ok := s.left[serial]; !ok && length > 0 {
				s.left[serial] = length
			}
			if err := s.count(serial, pkt); err != nil {
				return err
			}
			if s.heldBytes+len(pkt) > maxHeld {
				return fmt.Errorf("libvirt sent more than %d MiB of stream data before its reply", maxHeld>>20)
			}
			s.held[serial] = append(s.held[serial], pkt)
			s.heldBytes += len(pkt)
		}
	default:
		s.out = append(s.out, pkt...)
	}
	return nil
}

// count takes pkt's data from what a download may still send.
func (s *streamOrder) count(serial uint32, pkt []byte) error {
	left, ok := s.left[serial]
	if !ok {
		return nil
	}
	n := uint64(len(pkt) - packetHeader)
	if n > left {
		return errors.New("libvirt sent more of a volume download than the bytes asked for")
	}
	s.left[serial] = left - n
	return nil
}

// Write notes the volume stream calls go-libvirt sends (their serials,
// a download's length) before passing its bytes on. go-libvirt writes a
// packet under its lock, in as many writes as its buffer takes.
func (s *streamOrder) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.note(p)
	s.mu.Unlock()
	return s.Conn.Write(p)
}

// note parses p, the next bytes written; s.mu held.
func (s *streamOrder) note(p []byte) {
	w := &s.w
	for len(p) > 0 {
		if w.rest > 0 {
			k := min(len(p), int(w.rest))
			if w.keep {
				w.call = append(w.call, p[:k]...)
			}
			p, w.rest = p[k:], w.rest-uint32(k) //nolint:gosec // k is at most w.rest.
			if w.rest == 0 && w.keep {
				s.called[binary.BigEndian.Uint32(w.head[20:])] = downloadLength(w.call)
				w.call, w.keep = w.call[:0], false
			}
			continue
		}
		k := copy(w.head[w.n:], p)
		p, w.n = p[k:], w.n+k
		if w.n < packetHeader {
			return
		}
		w.n = 0
		n := binary.BigEndian.Uint32(w.head[:])
		proc := binary.BigEndian.Uint32(w.head[12:])
		typ := binary.BigEndian.Uint32(w.head[16:])
		serial := binary.BigEndian.Uint32(w.head[20:])
		if n > packetHeader {
			w.rest = n - packetHeader
		}
		if typ != socket.Call || (proc != procStorageVolUpload && proc != procStorageVolDownload) {
			continue
		}
		if proc == procStorageVolDownload && w.rest > 0 && w.rest <= maxCall {
			w.keep = true
			continue
		}
		s.called[serial] = 0
	}
}

// maxCall bounds a download call's payload kept to read its length: a
// volume's pool, name and key, and three numbers.
const maxCall = 64 << 10

// downloadLength is the length a StorageVolDownload call's payload asks
// for (remote_storage_vol_download_args: the volume's pool, name and key
// as XDR strings, then offset, length and flags); 0 when it cannot tell.
func downloadLength(b []byte) uint64 {
	for range 3 {
		if len(b) < 4 {
			return 0
		}
		n := uint64(binary.BigEndian.Uint32(b))
		padded := 4 + (n+3)/4*4
		if uint64(len(b)) < padded {
			return 0
		}
		b = b[padded:]
	}
	if len(b) < 16 {
		return 0
	}
	return binary.BigEndian.Uint64(b[8:])
}

// stream passes a packet of an open stream, and notes the stream's end:
// an empty data packet (end of a download), or a status other than
// continue (the server's confirmation of an upload, or an abort).
func (s *streamOrder) stream(serial uint32, pkt []byte) {
	if !s.open[serial] {
		return // ended by an earlier held packet
	}
	s.out = append(s.out, pkt...)
	if status := binary.BigEndian.Uint32(pkt[24:]); status != socket.StatusContinue || len(pkt) == packetHeader {
		s.end(serial)
	}
}

func (s *streamOrder) end(serial uint32) {
	delete(s.open, serial)
	delete(s.left, serial)
	s.ended[serial] = true
	if len(s.ended) > endedKept {
		// Serials grow: forget the oldest.
		oldest := serial
		for k := range s.ended {
			oldest = min(oldest, k)
		}
		delete(s.ended, oldest)
	}
}
