package provider

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/egressproxy/provider-egressproxy/internal/envflag"
)

// parseFlags parses the environment and the command line (envflag). A
// flag it does not know, or a bad value, is one line on stderr and exit
// status 2 (a pod's last log line then says exactly what is wrong); -h
// prints the flags.
func parseFlags() {
	fs := flag.CommandLine
	fs.Init(os.Args[0], flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	// KUBECONFIG keeps client-go's meaning (a list of files), not the
	// --kubeconfig flag's (one file).
	err := envflag.Parse(fs, os.Args[1:], envflag.Lookup, "kubeconfig")
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp):
		envflag.Usage(os.Stderr, fs, "kubeconfig")
		os.Exit(0)
	default:
		fmt.Fprintf(os.Stderr, "provider-egressproxy: %v (see --help for the flags it takes)\n", err)
		os.Exit(2)
	}
}
