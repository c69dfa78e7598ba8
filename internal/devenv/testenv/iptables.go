package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// ruleComment starts the comment of every iptables rule a test inserts,
// followed by the inserting process's PID: a rule of a process that is
// gone (a test killed before its clean-up) is swept by the next.
const ruleComment = "egressproxy-test"

// InsertRule inserts an iptables rule of the test's into table (filter,
// nat) of this machine, first in its chain, marked with a comment naming
// the test's process and what (say "snat web"); it is removed when the
// test ends. Rules a killed test left in that table are removed first.
// rule is the chain and the match and target arguments.
func InsertRule(t testing.TB, table, what string, rule ...string) {
	t.Helper()
	sweepRules(table)
	rule = append([]string{rule[0], "-m", "comment", "--comment", ruleComment + " " + strconv.Itoa(os.Getpid()) + " " + what}, rule[1:]...)
	if out, err := exec.Command("iptables", append([]string{"-w", "-t", table, "-I"}, rule...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables -t %s -I %v: %v: %s", table, rule, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("iptables", append([]string{"-w", "-t", table, "-D"}, rule...)...).Run() })
}

// sweepRules removes the rules of table whose comment names a test's
// process that no longer runs.
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
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		// -S prints the rule as -A would take it; -D takes the same.
		args, ok := splitRule(strings.TrimPrefix(l, "-A "))
		if ok {
			_ = exec.Command("iptables", append([]string{"-w", "-t", table, "-D"}, args...)...).Run()
		}
	}
}

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
