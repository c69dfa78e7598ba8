package provider

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/egressproxy/provider-egressproxy/internal/envflag"
)

// envOptions: KUBECONFIG keeps client-go's meaning (a list of files), not
// the --kubeconfig flag's (one file), so that flag has no variable. The
// aliases are the unprefixed names Crossplane's package runtime sets
// (POD_NAMESPACE) and those the Crossplane providers read by an explicit
// Envar (provider-kubernetes, provider-template), so a
// DeploymentRuntimeConfig written for them works here too.
var envOptions = envflag.Options{
	Except: []string{"kubeconfig"},
	Aliases: map[string][]string{
		"namespace":                  {"POD_NAMESPACE"},
		"leader-election":            {"LEADER_ELECTION"},
		"enable-management-policies": {"ENABLE_MANAGEMENT_POLICIES"},
		"enable-changelogs":          {"ENABLE_CHANGE_LOGS"},
		"changelogs-socket-path":     {"CHANGELOGS_SOCKET_PATH"},
		"metrics-bind-address":       {"METRICS_BIND_ADDRESS"},
	},
}

// parseFlags parses the environment and the command line (envflag). A
// flag it does not know, or a bad value, is one line on stderr and exit
// status 2 (a pod's last log line then says exactly what is wrong); -h
// prints the flags.
func parseFlags() {
	fs := flag.CommandLine
	fs.Init(os.Args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	err := envflag.Parse(fs, os.Args[1:], envflag.Lookup, envOptions)
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		envflag.Usage(os.Stderr, fs, envOptions)
		os.Exit(0)
	default:
		fmt.Fprintf(os.Stderr, "provider-egressproxy: %v (see --help for the flags it takes)\n", err)
		os.Exit(2)
	}
}
