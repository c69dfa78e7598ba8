package kubernetes

import (
	"cmp"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// RESTConfigFromKubeconfig parses a kubeconfig for a remote cluster. It
// refuses what would make the provider run a program (exec and
// auth-provider plugins) or read its own files (paths to tokens, keys,
// certificates: a kubeconfig naming the provider's own service-account
// token would send it to whichever server the kubeconfig names), and a
// server URL carrying credentials (they would be shown wherever the
// server is). Its errors never quote the kubeconfig's content: a parser
// quotes what it fails on, and that may be a token or a password.
// Requests time out after 30 s.
func RESTConfigFromKubeconfig(kubeconfig []byte) (*rest.Config, error) {
	cc, err := clientcmd.Load(kubeconfig)
	if err != nil {
		return nil, proxy.Permanentf("cannot parse the kubeconfig: %s", parseFailure(err))
	}
	for name, ai := range cc.AuthInfos {
		switch {
		case ai.Exec != nil || ai.AuthProvider != nil:
			return nil, proxy.Permanentf("kubeconfig user %q uses a credential plugin, which the provider does not run: use a token or a client certificate", name)
		case ai.TokenFile != "" || ai.ClientCertificate != "" || ai.ClientKey != "":
			return nil, proxy.Permanentf("kubeconfig user %q refers to files; the provider accepts only inline credentials (token, client-certificate-data, client-key-data)", name)
		}
	}
	for name, c := range cc.Clusters {
		if c.CertificateAuthority != "" {
			return nil, proxy.Permanentf("kubeconfig cluster %q refers to a CA file; use certificate-authority-data", name)
		}
		if u, err := url.Parse(c.Server); err != nil {
			return nil, proxy.Permanentf("kubeconfig cluster %q: server is not a URL", name)
		} else if u.User != nil {
			return nil, proxy.Permanentf("kubeconfig cluster %q: server carries a user name or password; put the credentials in the kubeconfig's user (token or client certificate)", name)
		}
		if c.ProxyURL == "" {
			continue
		}
		if u, err := url.Parse(c.ProxyURL); err != nil || u.Host == "" || !slices.Contains([]string{"http", "https", "socks5"}, u.Scheme) {
			return nil, proxy.Permanentf("kubeconfig cluster %q: proxy-url is not an http, https or socks5 URL with a host", name)
		}
	}
	cfg, err := clientcmd.NewDefaultClientConfig(*cc, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err != nil {
		return nil, proxy.Permanentf("cannot use the kubeconfig: %s", redacted(kubeconfig, err))
	}
	cfg.Timeout = 30 * time.Second
	cfg.QPS, cfg.Burst = 50, 100
	cfg.UserAgent = "provider-egressproxy"
	return cfg, nil
}

var (
	yamlLine    = regexp.MustCompile(`\bline (\d+)\b`)
	structField = regexp.MustCompile(`Go struct field ([A-Za-z0-9_.]+) of type`)
)

// parseFailure says where a kubeconfig failed to parse, without the
// parser's words: YAML and JSON errors quote the text they stopped at.
func parseFailure(err error) string {
	if m := structField.FindStringSubmatch(err.Error()); m != nil {
		return "a value of the wrong type at " + m[1]
	}
	if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
		return "not valid YAML at line " + m[1]
	}
	return "not a kubeconfig in YAML or JSON"
}

// redacted is err's text without the credentials kubeconfig holds
// (tokens, passwords, client keys, proxy URLs with their user info).
func redacted(kubeconfig []byte, err error) string {
	msg := err.Error()
	cc, perr := clientcmd.Load(kubeconfig)
	if perr != nil {
		return "the kubeconfig is not usable"
	}
	var secrets []string
	add := func(s string) {
		if s != "" {
			secrets = append(secrets, s)
		}
	}
	for _, ai := range cc.AuthInfos {
		add(ai.Token)
		add(ai.Password)
		add(string(ai.ClientKeyData))
	}
	for _, c := range cc.Clusters {
		add(c.ProxyURL)
		if u, err := url.Parse(c.ProxyURL); err == nil && u.User != nil {
			p, _ := u.User.Password()
			add(p)
			add(u.User.String())
		}
	}
	// The longest first, so that no part of one is left behind.
	slices.SortFunc(secrets, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, s := range secrets {
		msg = strings.ReplaceAll(msg, s, "(redacted)")
	}
	return msg
}
