//go:build linux

package controlplane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
)

var nodeTables = []string{"filter", "nat", "mangle"}

// iptablesCommands are the iptables variants here (nft, and legacy when
// installed: the kubelet and kube-proxy pick one themselves).
func iptablesCommands() []string {
	var out []string
	for _, c := range []string{"iptables", "ip6tables", "iptables-legacy", "ip6tables-legacy"} {
		if _, err := exec.LookPath(c + "-save"); err == nil {
			out = append(out, c)
		}
	}
	return out
}

// kube-proxy's chains in iptables mode: fixed names and the prefixes of
// its per-Service chains. kube-proxy offers no knob to rename them, and at
// start and on --cleanup it removes those of another kube-proxy (and that
// one's nftables table), so they are the node's only because prepareNode
// refuses to start a node beside another kube-proxy (foreignKubernetes).
var (
	proxyChains        = []string{"KUBE-SERVICES", "KUBE-EXTERNAL-SERVICES", "KUBE-NODEPORTS", "KUBE-POSTROUTING", "KUBE-MARK-MASQ", "KUBE-FORWARD", "KUBE-PROXY-FIREWALL", "KUBE-PROXY-CANARY"}
	proxyChainPrefixes = []string{"KUBE-SVC-", "KUBE-SVL-", "KUBE-SEP-", "KUBE-FW-", "KUBE-EXT-"}
)

// kubeletChains are the kubelet's chains (the node's kubelet makes none:
// makeIPTablesUtilChains is off) of which kube-proxy ensures KUBE-FIREWALL
// too, with INPUT and OUTPUT jumping to it. A kubelet of another
// Kubernetes here makes them as well, so they are the node's only when
// they were not there before the node started (nodeKeepFile).
var kubeletChains = []string{"KUBE-FIREWALL", "KUBE-IPTABLES-HINT", "KUBE-KUBELET-CANARY"}

// nodeKeepFile lists the kubelet's chains ("IPTABLES TABLE CHAIN") and
// the rules jumping to them ("IPTABLES TABLE -A ...") that were there
// before the last node started: another component's, which no sweep
// removes.
const nodeKeepFile = "/run/egressproxy-node.keep"

func proxyChain(c string) bool {
	return slices.Contains(proxyChains, c) || slices.ContainsFunc(proxyChainPrefixes, func(p string) bool { return strings.HasPrefix(c, p) })
}

// ownChains says which chains of one iptables variant a node makes:
// kube-proxy's, and the kubelet's unless they were kept.
type ownChains struct {
	ipt  string
	kept map[string]bool
}

func (o ownChains) has(table, chain string) bool {
	if slices.Contains(kubeletChains, chain) {
		return !o.kept[o.ipt+" "+table+" "+chain]
	}
	return proxyChain(chain)
}

// jumpsTo says whether a rule (iptables-save's line l, split in f) is a
// jump the node made: to one of its chains, or a new one to a kept chain
// (kube-proxy adds OUTPUT's to another kubelet's KUBE-FIREWALL).
func (o ownChains) jumpsTo(table, l string, f []string) bool {
	for i := 0; i+1 < len(f); i++ {
		if f[i] != "-j" && f[i] != "-g" {
			continue
		}
		if o.has(table, f[i+1]) || slices.Contains(kubeletChains, f[i+1]) && !o.kept[o.ipt+" "+table+" "+l] {
			return true
		}
	}
	return false
}

// keptChains reads nodeKeepFile.
func keptChains() map[string]bool {
	m := map[string]bool{}
	b, _ := os.ReadFile(nodeKeepFile)
	for _, l := range strings.Split(string(b), "\n") {
		if l != "" {
			m[l] = true
		}
	}
	return m
}

// recordKeptChains writes nodeKeepFile before a node's kube-proxy starts.
func recordKeptChains() error {
	var b strings.Builder
	for _, ipt := range iptablesCommands() {
		for _, t := range nodeTables {
			lines := iptablesSave(ipt, t)
			for _, c := range chainsOf(lines) {
				if slices.Contains(kubeletChains, c) {
					fmt.Fprintf(&b, "%s %s %s\n", ipt, t, c)
				}
			}
			for _, l := range lines {
				if f := strings.Fields(l); len(f) > 1 && f[0] == "-A" && slices.ContainsFunc(kubeletChains, func(c string) bool { return slices.Contains(f, c) }) {
					fmt.Fprintf(&b, "%s %s %s\n", ipt, t, l)
				}
			}
		}
	}
	return os.WriteFile(nodeKeepFile, []byte(b.String()), 0o600)
}

// foreignProxyChains names a kube-proxy chain of any iptables variant, or
// is "".
func foreignProxyChains() string {
	for _, ipt := range iptablesCommands() {
		for _, t := range nodeTables {
			for _, c := range chainsOf(iptablesSave(ipt, t)) {
				if proxyChain(c) {
					return fmt.Sprintf("%s chain %s in table %s", ipt, c, t)
				}
			}
		}
	}
	return ""
}

// kubeProxyHosts are the names of the processes that run a kube-proxy
// (and so own kube-proxy's fixed chains): kube-proxy itself (kubeadm,
// kind, k0s and rke2 run it as such), and the distributions that run it
// inside one binary of theirs: k3s (whose server and agent name
// themselves k3s-server and k3s-agent), microk8s (kubelite), rke2 and k0s.
var kubeProxyHosts = []string{"kube-proxy", "k3s", "k3s-server", "k3s-agent", "kubelite", "rke2", "k0s"}

// kubeProxyProcess says whether a process whose comm is comm and whose
// first argument is argv0 runs a kube-proxy of another Kubernetes (the
// node's own is never running when this is asked: a killed node's died
// with it, and stop asks once its own has exited).
func kubeProxyProcess(comm, argv0 string) bool {
	// k3s rewrites its command line ("/usr/local/bin/k3s server"): the
	// first word's base name counts.
	first, _, _ := strings.Cut(argv0, " ")
	return slices.Contains(kubeProxyHosts, strings.TrimSpace(comm)) ||
		first != "" && slices.Contains(kubeProxyHosts, filepath.Base(first))
}

// runningKubeProxy names a kube-proxy that runs on this machine (its
// nftables table, its process or a process of a distribution running one
// inside, see kubeProxyHosts), or is "": a killed node's kube-proxy died
// with it, so one running is another Kubernetes', whose chains carry the
// names a killed node's would.
func runningKubeProxy() string {
	if _, err := exec.LookPath("nft"); err == nil {
		for _, family := range []string{"ip", "ip6"} {
			if exec.Command("nft", "list", "table", family, "kube-proxy").Run() == nil {
				return fmt.Sprintf("nftables table %s kube-proxy", family)
			}
		}
	}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		if _, err := strconv.Atoi(e.Name()); err != nil {
			continue
		}
		comm, err := os.ReadFile("/proc/" + e.Name() + "/comm")
		if err != nil {
			continue
		}
		cmdline, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		argv0, _, _ := strings.Cut(string(cmdline), "\x00")
		if kubeProxyProcess(string(comm), argv0) {
			return fmt.Sprintf("a %s process (pid %s)", strings.TrimSpace(string(comm)), e.Name())
		}
	}
	return ""
}

// iptablesSave is the lines of iptables-save for one table (none when the
// table or the variant is not there).
func iptablesSave(ipt, table string) []string {
	b, err := exec.Command(ipt+"-save", "-t", table).Output()
	if err != nil {
		return nil
	}
	return strings.Split(string(b), "\n")
}

// chainsOf lists the chains an iptables-save table declares.
func chainsOf(lines []string) []string {
	var out []string
	for _, l := range lines {
		if strings.HasPrefix(l, ":") {
			if f := strings.Fields(l[1:]); len(f) > 0 {
				out = append(out, f[0])
			}
		}
	}
	return out
}

// nodeRules lists the TABLE/CHAIN chains and TABLE rules of iptables-save
// that a node makes: kube-proxy's chains and the rules jumping to them,
// and rules naming a pod bridge.
func nodeRules(ipt string, kept map[string]bool) []string {
	own := ownChains{ipt, kept}
	var out []string
	for _, t := range nodeTables {
		for _, l := range iptablesSave(ipt, t) {
			f := strings.Fields(l)
			switch {
			case strings.HasPrefix(l, ":") && len(f) > 0 && own.has(t, f[0][1:]):
				out = append(out, t+"/"+f[0][1:])
			case len(f) > 1 && f[0] == "-A" && (own.has(t, f[1]) || own.jumpsTo(t, l, f) || strings.Contains(l, bridgePrefix)):
				out = append(out, t+": "+l)
			}
		}
	}
	return out
}

// sweepChains deletes the rules of other chains that jump to the node's
// chains or name a pod bridge, then flushes and deletes the node's chains.
func sweepChains(ipt string, kept map[string]bool) error {
	own := ownChains{ipt, kept}
	var errs []error
	for _, t := range nodeTables {
		var chains []string
		for _, l := range iptablesSave(ipt, t) {
			f := strings.Fields(l)
			switch {
			case strings.HasPrefix(l, ":") && len(f) > 0 && own.has(t, f[0][1:]):
				chains = append(chains, f[0][1:])
			case len(f) > 1 && f[0] == "-A" && !own.has(t, f[1]) && (own.jumpsTo(t, l, f) || strings.Contains(l, bridgePrefix)):
				// iptables-save quotes comments; iptables -D wants them
				// unquoted, one argument each.
				// -w: wait for the xtables lock (iptables-legacy) that
				// another process here (libvirtd, a test) may hold.
				args := append([]string{"-w", "-t", t, "-D"}, splitRule(l[len("-A "):])...)
				if out, err := exec.Command(ipt, args...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w: %s", ipt, strings.Join(args, " "), err, out))
				}
			}
		}
		for _, c := range chains {
			_ = exec.Command(ipt, "-w", "-t", t, "-F", c).Run()
		}
		for _, c := range chains {
			if out, err := exec.Command(ipt, "-w", "-t", t, "-X", c).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -w -t %s -X %s: %w: %s", ipt, t, c, err, out))
			}
		}
	}
	return errors.Join(errs...)
}

// splitRule splits an iptables-save rule into arguments, honouring double
// quotes.
func splitRule(s string) []string {
	var out []string
	var cur strings.Builder
	inQ, has := false, false
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '\\' && inQ && i+1 < len(s):
			i++
			cur.WriteByte(s[i])
		case ch == '"':
			inQ, has = !inQ, true
		case ch == ' ' && !inQ:
			if cur.Len() > 0 || has {
				out = append(out, cur.String())
				cur.Reset()
				has = false
			}
		default:
			cur.WriteByte(ch)
		}
	}
	if cur.Len() > 0 || has {
		out = append(out, cur.String())
	}
	return out
}
