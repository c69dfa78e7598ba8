package provider

import (
	"flag"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/egressproxy/provider-egressproxy/internal/devenv/testenv"
)

// TestUnknownFlagIsOneLine runs parseFlags in a child process (it exits).
func TestUnknownFlagIsOneLine(t *testing.T) {
	testenv.RunAsChild("PARSE_FLAGS_CHILD", func() int {
		flag.Duration("poll", 0, "")
		os.Args = append([]string{"provider"}, strings.Fields(os.Getenv("PARSE_FLAGS_ARGS"))...)
		parseFlags()
		return 0
	})
	for args, want := range map[string]string{
		"--no-such-flag": "provider-egressproxy: flag provided but not defined: -no-such-flag (see --help for the flags it takes)\n",
		"--poll=soon":    "provider-egressproxy: invalid value \"soon\" for flag -poll: parse error (see --help for the flags it takes)\n",
	} {
		cmd := testenv.ChildCommand("PARSE_FLAGS_CHILD", "^TestUnknownFlagIsOneLine$", "PARSE_FLAGS_ARGS="+args)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errorsAs(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%s: exit %v, want status 2", args, err)
		}
		if string(out) != want {
			t.Errorf("%s: printed %q, want the one line %q", args, out, want)
		}
	}
}

func errorsAs(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError) //nolint:errorlint // exec returns it unwrapped.
	*ee = e
	return ok
}
