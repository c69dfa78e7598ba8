//go:build linux

package controlplane

import (
	"errors"
	"fmt"
	"os/exec"
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

// nodeChain is a chain the kubelet, kube-proxy or the CNI plugins make.
func nodeChain(c string) bool { return strings.HasPrefix(c, "KUBE-") || strings.HasPrefix(c, "CNI-") }

// nodeRules lists the TABLE/CHAIN chains and TABLE rules of iptables-save
// that a node makes.
func nodeRules(ipt string) []string {
	var out []string
	for _, t := range nodeTables {
		b, err := exec.Command(ipt+"-save", "-t", t).Output()
		if err != nil {
			continue
		}
		for _, l := range strings.Split(string(b), "\n") {
			switch {
			case strings.HasPrefix(l, ":"):
				if c := strings.Fields(l[1:]); len(c) > 0 && nodeChain(c[0]) {
					out = append(out, t+"/"+c[0])
				}
			case strings.HasPrefix(l, "-A "):
				if f := strings.Fields(l); len(f) > 1 && (nodeChain(f[1]) || jumpsToNodeChain(f) || strings.Contains(l, bridgePrefix)) {
					out = append(out, t+": "+l)
				}
			}
		}
	}
	return out
}

func jumpsToNodeChain(f []string) bool {
	for i := 0; i+1 < len(f); i++ {
		if (f[i] == "-j" || f[i] == "-g") && nodeChain(f[i+1]) {
			return true
		}
	}
	return false
}

// sweepChains deletes the rules of built-in chains that jump to a node's
// chains, then flushes and deletes those chains.
func sweepChains(ipt string) error {
	var errs []error
	for _, t := range nodeTables {
		b, err := exec.Command(ipt+"-save", "-t", t).Output()
		if err != nil {
			continue
		}
		var chains []string
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			switch {
			case strings.HasPrefix(l, ":") && len(f) > 0 && nodeChain(f[0][1:]):
				chains = append(chains, f[0][1:])
			case len(f) > 1 && f[0] == "-A" && !nodeChain(f[1]) && (jumpsToNodeChain(f) || strings.Contains(l, bridgePrefix)):
				// iptables-save quotes comments; iptables -D wants them
				// unquoted, one argument each.
				args := append([]string{"-t", t, "-D"}, splitRule(l[len("-A "):])...)
				if out, err := exec.Command(ipt, args...).CombinedOutput(); err != nil {
					errs = append(errs, fmt.Errorf("%s %s: %w: %s", ipt, strings.Join(args, " "), err, out))
				}
			}
		}
		for _, c := range chains {
			_ = exec.Command(ipt, "-t", t, "-F", c).Run()
		}
		for _, c := range chains {
			if out, err := exec.Command(ipt, "-t", t, "-X", c).CombinedOutput(); err != nil {
				errs = append(errs, fmt.Errorf("%s -t %s -X %s: %w: %s", ipt, t, c, err, out))
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
