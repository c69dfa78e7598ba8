package provider

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
			l := NewLogger(tc.v, tc.debug, "json", &out)
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

// TestLoggerFieldsAreWrittenAsGiven: fields added with WithValues (encoded
// only when a line is written, lazyFields) appear in the line, those of
// each level of loggers derived from one another, and a value that
// cannot be encoded as JSON is written as zap writes it.
func TestLoggerFieldsAreWrittenAsGiven(t *testing.T) {
	var out bytes.Buffer
	base := NewLogger(0, false, "json", &out)
	type request struct{ Namespace, Name string }
	l := base.WithValues("controller", "kvmproxy").WithValues("request", request{"team-a", "p1"}, "attempt", 2)
	l.Info("reconciled")
	base.Info("plain")
	l.V(1).Info("not written")
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines written; want 2:\n%s", len(lines), out.String())
	}
	for _, want := range []string{`"controller":"kvmproxy"`, `"request":{"Namespace":"team-a","Name":"p1"}`, `"attempt":2`, `"msg":"reconciled"`} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("line %s lacks %s", lines[0], want)
		}
	}
	if strings.Contains(lines[1], "controller") || !strings.Contains(lines[1], `"msg":"plain"`) {
		t.Errorf("the base logger's line %s should carry none of the derived logger's fields", lines[1])
	}
}
