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
		for name := range envOptions.Aliases {
			flag.String(name, "", "")
		}
		os.Args = append([]string{"provider"}, strings.Fields(os.Getenv("PARSE_FLAGS_ARGS"))...)
		parseFlags()
		return 0
	})
	for args, want := range map[string]string{
		"--no-such-flag": "provider-egressproxy: flag provided but not defined: -no-such-flag (see --help for the flags it takes)\n",
		"--poll=soon":    "provider-egressproxy: invalid value \"soon\" for flag -poll: parse error (see --help for the flags it takes)\n",
		// The prefixed variable sets the flag; the unprefixed POLL, which
		// the child's environment also holds, sets nothing.
		"EGRESSPROXY_POLL=soon": "provider-egressproxy: environment variable EGRESSPROXY_POLL (flag --poll) is \"soon\": parse error (see --help for the flags it takes)\n",
	} {
		env := []string{"POLL=soon"}
		if v, ok := strings.CutPrefix(args, "EGRESSPROXY_POLL="); ok {
			env, args = append(env, "EGRESSPROXY_POLL="+v), ""
		}
		cmd := testenv.ChildCommand("PARSE_FLAGS_CHILD", "^TestUnknownFlagIsOneLine$", append(env, "PARSE_FLAGS_ARGS="+args)...)
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

// TestManagementPoliciesCannotBeTurnedOff: the flag exists for the
// DeploymentRuntimeConfigs written for other providers, and false stops
// the provider with a message naming it rather than being ignored.
func TestManagementPoliciesCannotBeTurnedOff(t *testing.T) {
	if err := checkOptions(runOptions{managementPolicies: true}); err != nil {
		t.Errorf("checkOptions with management policies on: %v", err)
	}
	err := checkOptions(runOptions{managementPolicies: false})
	if err == nil || !strings.Contains(err.Error(), "--enable-management-policies=false is not supported") {
		t.Errorf("checkOptions with management policies off: %v; want a refusal naming the flag", err)
	}
}
