// Command function-egressproxy serves the EgressProxy composition function
// (package function) over gRPC, as Crossplane runs functions: mTLS with the
// certificates in --tls-certs-dir (tls.crt, tls.key and the ca.crt that
// signed Crossplane's client certificate), or --insecure for local
// experiments with `crossplane render`.
package main

import (
	"flag"
	"fmt"
	"os"

	sdk "github.com/crossplane/function-sdk-go"

	"github.com/egressproxy/provider-egressproxy/function"
	"github.com/egressproxy/provider-egressproxy/internal/envflag"
)

func main() {
	network := flag.String("network", "tcp", "Network to listen on for gRPC requests (tcp or unix).")
	address := flag.String("address", ":9443", "Address to listen on for gRPC requests.")
	certs := flag.String("tls-certs-dir", "", "Folder holding tls.crt, tls.key and ca.crt for mTLS; Crossplane sets TLS_SERVER_CERTS_DIR.")
	insecure := flag.Bool("insecure", false, "Serve without mTLS (local testing only; Crossplane always uses mTLS).")
	debug := flag.Bool("debug", false, "Log every call.")
	maxRecv := flag.Int("max-recv-message-size", 4, "Largest request accepted, in MiB (gRPC's default is 4).")
	metrics := flag.String("metrics-address", "", "Address of the Prometheus endpoint (/metrics, gRPC server metrics); empty, the default, turns it off.")
	// Every flag can also be set from its environment variable
	// (EGRESSPROXY_ADDRESS, ...), as the provider's: never from INSECURE or
	// DEBUG, which a platform may inject into every container. The
	// certificates' folder is also read from the variable Crossplane's
	// function runtime sets for every function it deploys.
	o := envflag.Options{Aliases: map[string][]string{"tls-certs-dir": {"TLS_SERVER_CERTS_DIR"}}}
	if err := envflag.Parse(flag.CommandLine, os.Args[1:], envflag.Lookup, o); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}

	log, err := sdk.NewLogger(*debug)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	opts := []sdk.ServeOption{
		sdk.Listen(*network, *address),
		sdk.MTLSCertificates(*certs),
		sdk.Insecure(*insecure),
		sdk.MaxRecvMessageSize(*maxRecv * 1024 * 1024),
		// Always given: the SDK serves its default, :8080 on every
		// address, unless told an address, and "" turns it off.
		sdk.WithMetricsServer(*metrics),
	}
	if err := sdk.Serve(function.New(log), opts...); err != nil {
		log.Info("function stopped", "error", err.Error())
		os.Exit(1)
	}
}
