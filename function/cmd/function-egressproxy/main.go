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
)

func main() {
	address := flag.String("address", ":9443", "Address to listen on for gRPC requests.")
	// The same environment variable Crossplane's function runtime sets
	// for every function it deploys.
	certs := flag.String("tls-certs-dir", os.Getenv("TLS_SERVER_CERTS_DIR"), "Folder holding tls.crt, tls.key and ca.crt for mTLS.")
	insecure := flag.Bool("insecure", false, "Serve without mTLS (local testing only; Crossplane always uses mTLS).")
	debug := flag.Bool("debug", false, "Log every call.")
	flag.Parse()

	log, err := sdk.NewLogger(*debug)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if err := sdk.Serve(function.New(log),
		sdk.Listen("tcp", *address),
		sdk.MTLSCertificates(*certs),
		sdk.Insecure(*insecure),
	); err != nil {
		log.Info("function stopped", "error", err.Error())
		os.Exit(1)
	}
}
