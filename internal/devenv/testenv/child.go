package testenv

import (
	"os"
	"os/exec"
)

// A test that needs a second process (one that exits, is killed, or is
// the command another program runs) starts its own test binary as a
// child: ChildArgs or ChildCommand start it with the variable env set to
// 1, and RunAsChild, called first in TestMain or in the test, makes that
// run the child's work instead of the tests.

// RunAsChild runs child and exits with the status it returns when the
// test binary was started as the child of env; otherwise it returns at
// once.
func RunAsChild(env string, child func() int) {
	if os.Getenv(env) == "1" {
		os.Exit(child())
	}
}

// ChildArgs are the command line of this test binary as a child that
// runs the tests run selects ("^$": none, only TestMain), and its
// environment: this process's, env=1 and extraEnv.
func ChildArgs(env, run string, extraEnv ...string) (args, environ []string) {
	return []string{os.Args[0], "-test.run=" + run}, append(append(os.Environ(), env+"=1"), extraEnv...)
}

// ChildCommand is the command of ChildArgs.
func ChildCommand(env, run string, extraEnv ...string) *exec.Cmd {
	args, environ := ChildArgs(env, run, extraEnv...)
	cmd := exec.Command(args[0], args[1:]...) //nolint:gosec // this test binary.
	cmd.Env = environ
	return cmd
}
