// Package squidtest runs real Squid processes for the backends' fakes and
// stand-ins (a Proxmox guest's Squid, a pod's), from the configuration the
// provider rendered for them.
package squidtest

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Start runs bin (squid) in the foreground with the configuration at conf,
// in dir, its output appended to dir/squid.log, and waits until addr
// accepts connections (20 s at most). key names its shared memory (squids
// running in parallel must not share it). stop kills it and removes what
// it left in /dev/shm. Squid opens its log by name after dropping
// privileges, so dir must be readable by its user (proxy on Debian).
func Start(ctx context.Context, bin, dir, key, conf, addr string) (stop func(), err error) {
	logPath := filepath.Join(dir, "squid.log")
	if err := os.WriteFile(logPath, nil, 0o666); err != nil {
		return nil, err
	}
	if err := os.Chmod(logPath, 0o666); err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return nil, err
	}
	defer logf.Close()

	sum := sha256.Sum256([]byte(key))
	name := "kt" + hex.EncodeToString(sum[:])[:12] // Squid takes letters and digits
	cmd := exec.Command(bin, "-N", "-n", name, "-f", conf)
	cmd.Dir = dir
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	stop = func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-exited
		shm, _ := filepath.Glob("/dev/shm/" + name + "-*")
		for _, f := range shm {
			_ = os.Remove(f)
		}
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = c.Close()
			return stop, nil
		}
		select {
		case <-exited:
			b, _ := os.ReadFile(logPath)
			stop()
			return nil, fmt.Errorf("squid exited before listening on %s:\n%s", addr, b)
		case <-ctx.Done():
			stop()
			return nil, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			b, _ := os.ReadFile(logPath)
			stop()
			return nil, fmt.Errorf("squid did not listen on %s within 20 s:\n%s", addr, b)
		}
	}
}

// StartGuest runs a VM guest's Squid on this machine: the files as the
// provider's cloud-init installs them on a guest (cloudinit.SquidOptions),
// listening on ip:port instead of every address, with the guest's paths
// (htpasswd, TLS certificate and key, logs, PID file, own addresses)
// moved to a folder of its own, removed by stop.
func StartGuest(bin, ip string, port int, f squid.Files) (stop func(), err error) {
	dir, err := os.MkdirTemp("", "egressproxy-guest-squid-")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	if err := os.Chmod(dir, 0o755); err != nil {
		return nil, err
	}
	portText := strconv.Itoa(port)
	replace := strings.NewReplacer(
		cloudinit.HtpasswdPath, filepath.Join(dir, "htpasswd"),
		cloudinit.TLSCertPath, filepath.Join(dir, "tls.crt"),
		cloudinit.TLSKeyPath, filepath.Join(dir, "tls.key"),
		cloudinit.OwnAddressesPath, filepath.Join(dir, "own-addresses"),
		"/var/log/squid/", dir+"/",
		"pid_filename /run/squid.pid", "pid_filename none",
		"http_port "+portText+"\n", "http_port "+net.JoinHostPort(ip, portText)+"\n",
		"https_port "+portText+" ", "https_port "+net.JoinHostPort(ip, portText)+" ",
		// The instance's loopback listener is the guest's own address here.
		"http_port 127.0.0.1:", "http_port "+net.JoinHostPort(ip, ""),
	)
	for name, content := range map[string]string{
		"squid.conf":    replace.Replace(f.SquidConf),
		"htpasswd":      f.Htpasswd,
		"tls.crt":       f.TLSCert,
		"tls.key":       f.TLSKey,
		"own-addresses": "acl own_dst dst 127.0.0.1\nacl own_dst dst ::1\nacl own_dst dst " + ip + "\n",
		"access.log":    "",
		"cache.log":     "",
	} {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o666); err != nil {
			return nil, err
		}
		if err := os.Chmod(path, 0o666); err != nil {
			return nil, err
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	stopSquid, err := Start(ctx, bin, dir, dir, filepath.Join(dir, "squid.conf"), net.JoinHostPort(ip, portText))
	if err != nil {
		return nil, err
	}
	return func() { stopSquid(); _ = os.RemoveAll(dir) }, nil
}

// RunReport is a guest's own egress check, as its script runs it
// (cloudinit.EgressReport): squid.ReportScript with request against the
// guest's Squid at ip:port, again every second until the echo answers
// 200 or ctx ends. It returns the last line the script printed (without
// its newline).
func RunReport(ctx context.Context, request, ip string, port int) (string, error) {
	dir, err := os.MkdirTemp("", "egressproxy-guest-report-")
	if err != nil {
		return "", err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	file := filepath.Join(dir, "request")
	if err := os.WriteFile(file, []byte(request), 0o600); err != nil {
		return "", err
	}
	var line string
	for {
		out, err := exec.CommandContext(ctx, "bash", "-c", squid.ReportScript, "egress-check", file, strconv.Itoa(port), ip).Output()
		if s := strings.TrimRight(string(out), "\n"); s != "" {
			line = s
		}
		if err == nil {
			return line, nil
		}
		select {
		case <-ctx.Done():
			return line, ctx.Err()
		case <-time.After(time.Second):
		}
	}
}

// ReportPortOf is the port a guest's own egress check connects to in
// squid.conf conf: its loopback listener's (a proxy listening with TLS),
// else proxyPort.
func ReportPortOf(conf string, proxyPort int) int {
	for _, l := range strings.Split(conf, "\n") {
		if p, ok := strings.CutPrefix(l, "http_port 127.0.0.1:"); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(p)); err == nil {
				return n
			}
		}
	}
	return proxyPort
}

// NeverDenies reports whether squid.conf denies a in its never_dst ACL,
// which no allowedDestinationCIDRs opens.
func NeverDenies(conf string, a netip.Addr) bool {
	for _, l := range strings.Split(conf, "\n") {
		rest, ok := strings.CutPrefix(l, "acl never_dst dst ")
		if !ok {
			continue
		}
		for _, f := range strings.Fields(rest) {
			if p, err := netip.ParsePrefix(f); err == nil && p.Contains(a) {
				return true
			}
		}
	}
	return false
}
