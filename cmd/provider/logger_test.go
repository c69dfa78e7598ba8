package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestVerbosity: --verbosity 2 makes the backends' V(2) lines reachable,
// --debug is V(1), and by default only info lines are written.
func TestVerbosity(t *testing.T) {
	for _, tc := range []struct {
		name      string
		v         int
		debug     bool
		wantLines []string
	}{
		{"default", 0, false, []string{"v0"}},
		{"debug", 0, true, []string{"v0", "v1"}},
		{"verbosity 1", 1, false, []string{"v0", "v1"}},
		{"verbosity 2", 2, false, []string{"v0", "v1", "v2"}},
		{"debug and verbosity 2", 2, true, []string{"v0", "v1", "v2"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			l := newZapLogger(tc.v, tc.debug, "json", &out)
			for i, msg := range []string{"v0", "v1", "v2", "v3"} {
				l.V(i).Info(msg)
			}
			var got []string
			for _, line := range strings.Split(strings.TrimSpace(out.String()), "\n") {
				for _, msg := range []string{"v0", "v1", "v2", "v3"} {
					if strings.Contains(line, `"msg":"`+msg+`"`) {
						got = append(got, msg)
					}
				}
			}
			if strings.Join(got, ",") != strings.Join(tc.wantLines, ",") {
				t.Errorf("lines written %v; want %v\n%s", got, tc.wantLines, out.String())
			}
		})
	}
}
