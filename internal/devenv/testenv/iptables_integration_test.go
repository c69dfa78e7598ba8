package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// A rule a killed test left (its comment names a process that is gone)
// is removed when the next test inserts one; the test's own stays until
// the test ends.
func TestInsertRuleSweepsAKilledTestsRulesIntegration(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: it changes iptables")
	}
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Fatal(err)
	}
	left := []string{"OUTPUT", "-d", "192.0.2.201/32", "-p", "tcp", "--dport", "9", "-m", "comment", "--comment", ruleComment + " " + strconv.Itoa(dead.Process.Pid) + " left", "-j", "REJECT"}
	if out, err := exec.Command("iptables", append([]string{"-w", "-I"}, left...)...).CombinedOutput(); err != nil {
		t.Fatalf("iptables -I: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("iptables", append([]string{"-w", "-D"}, left...)...).Run() })

	t.Run("insert", func(t *testing.T) {
		InsertRule(t, "filter", "mine", "OUTPUT", "-d", "192.0.2.202/32", "-p", "tcp", "--dport", "9", "-j", "REJECT", "--reject-with", "tcp-reset")
		rules := outputRules(t)
		if strings.Contains(rules, "192.0.2.201") {
			t.Errorf("the killed test's rule is still there:\n%s", rules)
		}
		if !strings.Contains(rules, "192.0.2.202") {
			t.Errorf("the test's own rule is not there:\n%s", rules)
		}
	})
	if strings.Contains(outputRules(t), "192.0.2.202") {
		t.Error("the test's rule stayed after it ended")
	}
}

// outputRules are the rules of the filter table's OUTPUT chain.
func outputRules(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("iptables", "-w", "-S", "OUTPUT").Output()
	if err != nil {
		t.Fatal(err)
	}
	return string(out)
}
