// Command benchimage measures the KVM backend's image download into a
// storage pool: the real driver (internal/backend/kvm, as the provider
// runs it) fetches an image of -size bytes from an HTTP server on
// loopback and streams it over SSH into libvirtd's storage pool, on the
// real libvirt host of hack/libvirt-up.sh (internal/backend/kvm/kvmtest).
// The image is generated as it is served (a pseudo-random MiB, each copy
// stamped with its index), by a child process of this program, so it is
// on disk once: in the pool.
//
// It prints the RSS growth of this process, which runs the driver and
// nothing else, over its RSS just before the Create (peak of samples
// every 20 ms, anonymous and file-backed; target under 16 MiB for 1 GiB),
// and the throughput from the Create until the driver reports the image
// downloaded and verified (its sha256 is in the config).
//
// The driver works in a storage pool of its own ("benchimage", transient,
// removed with its volumes at the end), so that other users of the host
// are not disturbed. The Create is deleted once the image is in (the
// domain, if the background finisher defined one, goes with it).
//
// Run it through hack/bench-image.sh (make bench-image), as root. It
// prints figures; it asserts nothing.
package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/egressproxy/provider-egressproxy/hack/benchutil"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm"
	"github.com/egressproxy/provider-egressproxy/internal/backend/kvm/kvmtest"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

const (
	pool = "benchimage"
	mib  = 1 << 20
)

func main() {
	size := flag.Int64("size-mib", 1024, "Image size in MiB.")
	serve := flag.Bool("serve", false, "Internal: serve the image on loopback (the child process).")
	timeout := flag.Duration("timeout", 15*time.Minute, "Give up waiting for the download after this long.")
	flag.Parse()
	if *serve {
		benchutil.Main("benchimage -serve", func(ctx context.Context) error { return serveImage(ctx, *size*mib) })
		return
	}
	benchutil.Main("benchimage", func(ctx context.Context) error { return run(ctx, *size*mib, *timeout) })
}

// image is the generated content: a pseudo-random MiB repeated, each copy
// with its index in its first 8 bytes.
type image struct {
	size  int64
	block []byte
}

func newImage(size int64) *image {
	r := rand.New(rand.NewChaCha8([32]byte{'b', 'e', 'n', 'c', 'h'}))
	b := make([]byte, mib)
	for i := 0; i < len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], r.Uint64())
	}
	return &image{size: size, block: b}
}

// ReadAt implements io.ReaderAt.
func (im *image) ReadAt(p []byte, off int64) (int, error) {
	n := 0
	for n < len(p) && off < im.size {
		i, o := off/mib, off%mib
		chunk := im.block[o:]
		var stamp [8]byte
		binary.LittleEndian.PutUint64(stamp[:], uint64(i)) //nolint:gosec // A non-negative index.
		c := copy(p[n:], chunk[:min(int64(len(chunk)), im.size-off)])
		// The stamp covers the block's first 8 bytes.
		if o < 8 {
			copy(p[n:n+min(c, int(8-o))], stamp[o:])
		}
		n += c
		off += int64(c)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// serveImage computes the image's sha256, prints "ADDRESS SHA256" and
// serves the image at /image.raw on a loopback port until ctx ends or
// stdin closes (the parent is gone).
func serveImage(ctx context.Context, size int64) error {
	im := newImage(size)
	h := sha256.New()
	if _, err := io.Copy(h, io.NewSectionReader(im, 0, size)); err != nil {
		return err
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/image.raw" {
			http.NotFound(w, r)
			return
		}
		http.ServeContent(w, r, "image.raw", time.Time{}, io.NewSectionReader(im, 0, size))
	})}
	fmt.Printf("%s %s\n", l.Addr(), hex.EncodeToString(h.Sum(nil)))
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); _ = srv.Close() }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// startServer runs this program with -serve and returns the image's URL
// and sha256.
func startServer(ctx context.Context, size int64) (url, sum string, stop func(), err error) {
	self, err := os.Executable()
	if err != nil {
		return "", "", nil, err
	}
	cmd := exec.CommandContext(ctx, self, "-serve", "-size-mib", fmt.Sprint(size/mib))
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", "", nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", "", nil, err
	}
	stop = func() { _ = stdin.Close(); _ = cmd.Wait() }
	line, err := bufio.NewReader(stdout).ReadString('\n')
	f := strings.Fields(line)
	if err != nil || len(f) != 2 {
		stop()
		return "", "", nil, fmt.Errorf("the image server printed %q: %w", line, err)
	}
	return "http://" + f[0] + "/image.raw", f[1], stop, nil
}

// virsh runs virsh on the host's libvirtd.
func virsh(args ...string) (string, error) {
	out, err := exec.Command("virsh", append([]string{"-c", "qemu:///system"}, args...)...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("virsh %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// startPool creates the transient directory pool this benchmark writes
// to, and returns what removes it with its volumes.
func startPool(h *kvmtest.Host) (func(), error) {
	// Next to the shared pool's folder, on the same disk.
	dir := filepath.Join(filepath.Dir(h.Values["POOL_DIR"]), "benchimage-pool")
	remove := func() {
		if out, err := virsh("vol-list", "--pool", pool); err == nil {
			for _, l := range strings.Split(out, "\n")[2:] {
				if f := strings.Fields(l); len(f) > 0 {
					_, _ = virsh("vol-delete", "--pool", pool, f[0])
				}
			}
		}
		_, _ = virsh("pool-destroy", pool)
		_ = os.RemoveAll(dir)
	}
	remove() // a run killed before its cleanup
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	if _, err := virsh("pool-create-as", pool, "dir", "--target", dir); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return remove, nil
}

// rssPeak samples this process's resident set every 20 ms until stopped.
type rssPeak struct {
	anon, file atomic.Int64 // KiB, the peaks
	stop       chan struct{}
	done       sync.WaitGroup
}

func sampleRSS() *rssPeak {
	r := &rssPeak{stop: make(chan struct{})}
	pid := os.Getpid()
	r.done.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if a, f, err := benchutil.RSSNow(pid); err == nil {
				if int64(a) > r.anon.Load() {
					r.anon.Store(int64(a))
				}
				if int64(f) > r.file.Load() {
					r.file.Store(int64(f))
				}
			}
			select {
			case <-r.stop:
				return
			case <-t.C:
			}
		}
	})
	return r
}

func (r *rssPeak) end() (anon, file int64) {
	close(r.stop)
	r.done.Wait()
	return r.anon.Load(), r.file.Load()
}

func run(ctx context.Context, size int64, timeout time.Duration) error {
	benchutil.Logf("bringing up the libvirt host (hack/libvirt-up.sh)")
	h, err := kvmtest.Start()
	if err != nil {
		return err
	}
	defer kvmtest.Down()
	removePool, err := startPool(h)
	if err != nil {
		return err
	}
	defer removePool()

	benchutil.Logf("generating the %d MiB image and its sha256 (in a child process)", size/mib)
	url, sum, stopServer, err := startServer(ctx, size)
	if err != nil {
		return err
	}
	defer stopServer()

	host := h.KVMHost("local")
	host.Pool = pool
	b := kvm.NewBackend(kvm.Options{})
	defer b.Close()
	d := b.Driver(kvm.Config{
		Name:         "benchimage",
		Credentials:  h.Credentials(),
		DiskSizeGB:   1,
		Images:       map[string]kvm.Image{"bench": {URL: url, SHA256: sum, Format: "raw", Firmware: "bios"}},
		MachineTypes: map[string]kvm.MachineType{"tiny": {VCPUs: 1, MemoryMiB: 128}},
		Hosts:        []kvm.Host{host},
	})
	req := proxy.Request{
		Name:      "benchimage-0",
		Mark:      proxy.Mark{UID: "0c8f6a1e-0000-4e2a-9c3f-0000000be0c4", InstallationID: "benchimage"},
		Placement: proxy.Placement{Location: "local", MachineType: "tiny", Image: "bench"},
		Proxy:     proxy.Settings{Port: 3128, AllowedClientCIDRs: []string{"192.168.213.0/24"}, AllowedPorts: []int32{443}},
	}
	// The driver's own connection to the host is made before the
	// baseline: what grows is the download's.
	if _, err := d.List(ctx, "benchimage"); err != nil {
		return fmt.Errorf("listing on the host: %w", err)
	}
	anon0, file0, err := benchutil.RSSNow(os.Getpid())
	if err != nil {
		return err
	}
	load0 := benchutil.Load()
	peak := sampleRSS()
	benchutil.Logf("creating: the driver downloads %s into pool %s over SSH", url, pool)
	t0 := time.Now()
	inst, err := d.Create(ctx, req)
	if err != nil {
		peak.end()
		return fmt.Errorf("create: %w", err)
	}
	ref := proxy.Ref{ID: inst.ID, Name: inst.Name, Mark: inst.Mark, Placement: inst.Placement}
	defer func() {
		if err := d.Delete(context.WithoutCancel(ctx), ref); err != nil {
			benchutil.Logf("delete: %v", err)
		}
		h.Purge(req.Name)
	}()
	var took time.Duration
	last := time.Now()
	deadline := time.Now().Add(timeout)
	for {
		inst, err = d.Get(ctx, ref)
		if err != nil && !proxy.IsNotFound(err) {
			peak.end()
			return fmt.Errorf("get: %w", err)
		}
		if err != nil || !strings.HasPrefix(inst.Progress, "downloading image") {
			took = time.Since(t0)
			break
		}
		if time.Since(last) > 5*time.Second {
			benchutil.Logf("%s (load %s)", inst.Progress, benchutil.Load())
			last = time.Now()
		}
		if time.Now().After(deadline) {
			peak.end()
			return fmt.Errorf("the download did not finish within %v: %s", timeout, inst.Progress)
		}
		if err := benchutil.Sleep(ctx, 20*time.Millisecond); err != nil {
			peak.end()
			return err
		}
	}
	anon1, file1 := peak.end()
	anonEnd, fileEnd, _ := benchutil.RSSNow(os.Getpid())
	state := inst.Progress
	if state == "" {
		state = string(inst.State)
	}
	vols, _ := virsh("vol-list", "--pool", pool, "--details")

	fmt.Printf("\nImage streaming benchmark: %d MiB, HTTP on loopback -> kvm driver -> SSH -> libvirtd storage pool %s (%s)\n", size/mib, pool, host.Address)
	fmt.Printf("machine: %d CPUs; the image server, sshd, libvirtd and this program share them; load before %s, after %s\n", benchutil.NumCPU(), load0, benchutil.Load())
	fmt.Printf("download into the pool, verified (sha256): %.1f s, %.1f MiB/s (%s)\n", took.Seconds(), float64(size)/mib/took.Seconds(), state)
	fmt.Printf("RSS of the process running the driver: before %.1f MiB anon + %.1f MiB file\n", float64(anon0)/1024, float64(file0)/1024)
	fmt.Printf("RSS growth, peak during the download:  anon %+.1f MiB, file %+.1f MiB, total %+.1f MiB (target under 16 MiB)\n",
		float64(anon1-int64(anon0))/1024, float64(file1-int64(file0))/1024, float64(anon1+file1-int64(anon0+file0))/1024)
	fmt.Printf("RSS after it:                          anon %.1f MiB, file %.1f MiB\n", float64(anonEnd)/1024, float64(fileEnd)/1024)
	fmt.Printf("\npool %s after the download:\n%s", pool, vols)
	return nil
}
