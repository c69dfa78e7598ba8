package kvm

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"

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

func newStreamOrder(c net.Conn) *streamOrder {
	return &streamOrder{Conn: c, held: map[uint32][][]byte{}, open: map[uint32]bool{}, ended: map[uint32]bool{}}
}

// Read returns the packets in go-libvirt's order. go-libvirt's reader is
// its single listening goroutine, so Read needs no lock.
func (s *streamOrder) Read(p []byte) (int, error) {
	for len(s.out) == 0 {
		pkt, err := s.next()
		if err != nil {
			return 0, err
		}
		s.route(pkt)
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

func (s *streamOrder) route(pkt []byte) {
	proc := binary.BigEndian.Uint32(pkt[12:])
	typ := binary.BigEndian.Uint32(pkt[16:])
	serial := binary.BigEndian.Uint32(pkt[20:])
	status := binary.BigEndian.Uint32(pkt[24:])
	if proc != procStorageVolUpload && proc != procStorageVolDownload {
		s.out = append(s.out, pkt...)
		return
	}
	switch typ {
	case socket.Reply, socket.ReplyWithFDs:
		s.out = append(s.out, pkt...)
		held := s.held[serial]
		delete(s.held, serial)
		if status != socket.StatusOK {
			s.end(serial) // the call failed: nobody reads its stream
			return
		}
		s.open[serial] = true
		for _, h := range held {
			s.stream(serial, h)
		}
	case socket.Stream:
		switch {
		case s.ended[serial]:
		case s.open[serial]:
			s.stream(serial, pkt)
		default:
			s.held[serial] = append(s.held[serial], pkt)
		}
	default:
		s.out = append(s.out, pkt...)
	}
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
