package testenv

import (
	"os"
	"strconv"
	"testing"
)

func TestOwnerGone(t *testing.T) {
	const self = 100
	// Processes 200 (started at tick 5000) and 300 (a zombie or gone) as
	// /proc would tell.
	start := func(pid int) (string, bool) {
		if pid == 200 {
			return "5000", true
		}
		return "", false
	}
	cases := map[string]struct {
		owner string
		want  bool
	}{
		"Running":              {owner: "200:5000"},
		"PIDReusedSince":       {owner: "200:4000", want: true},
		"Gone":                 {owner: "300:4000", want: true},
		"Self":                 {owner: "100:1"},
		"OlderCommentRunning":  {owner: "200"},
		"OlderCommentGone":     {owner: "300", want: true},
		"NotAPID":              {owner: "web"},
		"NotAPIDWithStart":     {owner: "x:5000"},
		"NoPID":                {owner: ":5000"},
		"EmptyStartOfARunning": {owner: "200:", want: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := ownerGone(tc.owner, self, start); got != tc.want {
				t.Errorf("ownerGone(%q) = %v, want %v", tc.owner, got, tc.want)
			}
		})
	}
}

func TestRuleOwnerNamesThisProcess(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc")
	}
	owner := ruleOwner(os.Getpid())
	if ownerGone(owner, -1, processStart) {
		t.Errorf("ownerGone(%q) of this process, which runs = true", owner)
	}
	if want := strconv.Itoa(os.Getpid()) + ":"; len(owner) <= len(want) || owner[:len(want)] != want {
		t.Errorf("ruleOwner = %q, want %q and a start time", owner, want)
	}
}
