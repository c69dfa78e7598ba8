// Command provider runs provider-egressproxy: the Crossplane controllers of
// every proxy kind in both scopes, the ProviderConfig usage and health
// controllers, a Prometheus endpoint and, when OTEL_ environment variables
// ask for it, OpenTelemetry tracing. The program is internal/provider;
// --help lists its flags.
package main

import "github.com/egressproxy/provider-egressproxy/internal/provider"

func main() { provider.Main(provider.Hooks{}) }
