package v1alpha1

// Keys of a proxy's connection Secret, on every kind and through the
// compositions. The upper- and lower-case proxy variables are both
// written so that a Secret mounted with envFrom configures every common
// client: Go and most runtimes read HTTP_PROXY, curl reads only http_proxy
// for http:// URLs (the upper-case name is ignored there since httpoxy),
// wget and Python read either.
const (
	// ConnectionURL is http://[user:password@]host:port, https:// when the
	// proxy listens with TLS.
	ConnectionURL = "url"
	// ConnectionEndpoint is host:port, Crossplane's conventional key.
	ConnectionEndpoint = "endpoint"
	// ConnectionHost is where clients reach the proxy: an IP address, or
	// for a PodProxy behind a ClusterIP Service the Service's DNS name.
	ConnectionHost = "host"
	// ConnectionPort is the proxy's port.
	ConnectionPort = "port"
	// ConnectionUsername and ConnectionPassword are present when auth is on
	// (for an import, only with passwordSecretRef).
	ConnectionUsername = "username"
	ConnectionPassword = "password"
	// ConnectionHTTPProxy and ConnectionHTTPSProxy are the URL, under the
	// names HTTP clients read.
	ConnectionHTTPProxy       = "HTTP_PROXY"
	ConnectionHTTPSProxy      = "HTTPS_PROXY"
	ConnectionHTTPProxyLower  = "http_proxy"
	ConnectionHTTPSProxyLower = "https_proxy"
	// ConnectionNoProxy lists destinations clients reach directly:
	// DefaultNoProxy plus the config's spec.noProxy.
	ConnectionNoProxy      = "NO_PROXY"
	ConnectionNoProxyLower = "no_proxy"
	// ConnectionEgressIP is the address the proxy's traffic leaves from,
	// when the backend knows it (what a vendor's allow-list needs).
	ConnectionEgressIP = "egressIP"
	// ConnectionEgressIPs are every egress address, comma-separated:
	// egressIP alone, or the addresses of all of a PodProxy's replicas
	// when they leave from several (status.atProvider.egressIPs).
	ConnectionEgressIPs = "egressIPs"
	// ConnectionCA is present when the proxy listens with TLS (its URL is
	// then https://): the PEM certificate clients verify the proxy's
	// against, the TLS Secret's ca.crt or else its chain's last
	// certificate.
	ConnectionCA = "ca.crt"
)

// ConnectionKeys are every key a connection Secret may hold.
var ConnectionKeys = []string{
	ConnectionURL, ConnectionEndpoint, ConnectionHost, ConnectionPort, ConnectionUsername, ConnectionPassword,
	ConnectionHTTPProxy, ConnectionHTTPSProxy, ConnectionHTTPProxyLower, ConnectionHTTPSProxyLower,
	ConnectionNoProxy, ConnectionNoProxyLower, ConnectionEgressIP, ConnectionEgressIPs, ConnectionCA,
}

// DefaultNoProxy is what clients reach without the proxy unless a config
// adds more: the client's own host and the cluster's Services (which an
// egress proxy denies anyway). Addresses only, no CIDRs: not every client
// understands them in NO_PROXY.
var DefaultNoProxy = []string{"localhost", "127.0.0.1", "::1", ".svc", ".cluster.local"}
