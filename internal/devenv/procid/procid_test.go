package procid

import (
	"fmt"
	"os"
	"strings"
	"testing"
)

// TestRunning: this process's record names it; the same pid with another
// start time (a later process reusing the pid), a pid no process has and
// a record that is not one do not.
func TestRunning(t *testing.T) {
	self, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(self, fmt.Sprint(os.Getpid())+" ") || !Running(self+"\n") {
		t.Fatalf("Self() = %q, Running %v; want this pid and running", self, Running(self))
	}
	for _, rec := range []string{fmt.Sprintf("%d 1", os.Getpid()), "2147483646 1", "", "not a record"} {
		if Running(rec) {
			t.Errorf("Running(%q) = true; want false", rec)
		}
	}
}
