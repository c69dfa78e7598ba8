package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/procid"
)

// ruleComment starts the comment of every iptables rule a test inserts,
// followed by the inserting process's PID and start time ("PID:START",
// START as field 22 of /proc/PID/stat): a rule of a process that is gone
// (a test killed before its clean-up) is swept by the next, also when
// another process has the PID since.
const ruleComment = "egressproxy-test"

// InsertRule inserts an iptables rule of the test's into table (filter,
// nat) of this machine, first in its chain, marked with a comment naming
// the test's process and what (say "snat web"); it is removed when the
// test ends. Rules a killed test left in that table are removed first.
// rule is the chain and the match and target arguments.
func InsertRule(t testing.TB, table, what string, rule ...string) {
	t.Helper()
	sweepRules(table)
	rule = append([]string{rule[0], "-m", "comment", "--comment", ruleComment + " " + ruleOwner(os.Getpid()) + " " + what}, rule[1:]...)
	if out, err := exec.Command("iptables", append([]string{"-w", "-t", table, "-I"}, rule...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables -t %s -I %v: %v: %s", table, rule, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("iptables", append([]string{"-w", "-t", table, "-D"}, rule...)...).Run() })
}

// sweepRules removes the rules of table whose comment names a test's
// process that no longer runs (ownerGone).
func sweepRules(table string) {
	out, err := exec.Command("iptables", "-w", "-t", table, "-S").Output()
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(out), "\n") {
		i := strings.Index(l, `--comment "`+ruleComment+" ")
		if !strings.HasPrefix(l, "-A ") || i < 0 {
			continue
		}
		f := strings.Fields(l[i+len(`--comment "`+ruleComment+" "):])
		if len(f) == 0 {
			continue
		}
		if !ownerGone(f[0], os.Getpid(), processStart) {
			continue
		}
		// -S prints the rule as -A would take it; -D takes the same.
		args, ok := splitRule(strings.TrimPrefix(l, "-A "))
		if ok {
			_ = exec.Command("iptables", append([]string{"-w", "-t", table, "-D"}, args...)...).Run()
		}
	}
}

// ruleOwner names the process pid in a rule's comment: "PID:START".
func ruleOwner(pid int) string {
	start, _ := processStart(pid)
	return strconv.Itoa(pid) + ":" + start
}

// ownerGone says whether the process a rule's comment names (owner,
// "PID:START", or "PID" alone as older tests wrote it) no longer runs:
// its PID is free, or held by a process started at another time. self is
// this process's PID (its rules are its own to remove); start reads a
// running process's start time.
func ownerGone(owner string, self int, start func(pid int) (string, bool)) bool {
	p, st, withStart := strings.Cut(owner, ":")
	pid, err := strconv.Atoi(p)
	if err != nil || pid <= 0 || pid == self {
		return false
	}
	running, ok := start(pid)
	if !ok {
		return true
	}
	return withStart && running != st
}

// processStart is the start time of a running process, as
// internal/devenv/netnshost records its namespaces' owners (procid).
func processStart(pid int) (string, bool) { return procid.StartTime(pid) }

// splitRule splits a rule as iptables -S prints it into arguments, a
// quoted comment as one.
func splitRule(s string) ([]string, bool) {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			j := strings.IndexByte(s[1:], '"')
			if j < 0 {
				return nil, false
			}
			out = append(out, s[1:1+j])
			s = s[2+j:]
			continue
		}
		j := strings.IndexByte(s, ' ')
		if j < 0 {
			j = len(s)
		}
		out = append(out, s[:j])
		s = s[j:]
	}
	return out, true
}
