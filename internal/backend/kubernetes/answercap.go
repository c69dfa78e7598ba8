package kubernetes

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
)

// maxAnswer bounds the body of one answer of a tenant's kubeconfig's API
// server read into memory. The largest the driver asks for is an
// unpaginated List: its own objects in the config's namespace
// (Deployments, pods, Secrets; some 16 KiB an object, so 4000 proxies
// fit) or the cluster's nodes (some 20 KiB a node: 3000).
const maxAnswer = 64 << 20

// capAnswers wraps rt so that an answer of more than limit bytes fails with
// an error naming limit and server (as the kubeconfig names it), never
// quoting what it answered: a tenant's kubeconfig may name a server that
// answers without end.
func capAnswers(rt http.RoundTripper, limit int64, server string) http.RoundTripper {
	if u, err := url.Parse(server); err == nil && u.User != nil {
		u.User = nil
		server = u.String()
	}
	return &cappedTransport{rt: rt, limit: limit, server: server}
}

type cappedTransport struct {
	rt     http.RoundTripper
	limit  int64
	server string
}

func (t *cappedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.rt.RoundTrip(req)
	if err != nil || resp.Body == nil {
		return resp, err
	}
	if resp.ContentLength > t.limit {
		_ = resp.Body.Close()
		return nil, t.tooLarge()
	}
	resp.Body = &cappedBody{ReadCloser: resp.Body, left: t.limit, t: t}
	return resp, nil
}

func (t *cappedTransport) tooLarge() error {
	return &ownWords{msg: fmt.Sprintf("the answer of the kubeconfig's server %s is larger than %d MiB, the most the provider reads of one answer", t.server, t.limit>>20)}
}

// cappedBody fails a read past left bytes; the byte after the last one
// allowed tells an answer of exactly limit bytes from a longer one.
type cappedBody struct {
	io.ReadCloser
	left int64
	err  error
	t    *cappedTransport
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	if int64(len(p)) > b.left+1 {
		p = p[:b.left+1]
	}
	n, err := b.ReadCloser.Read(p)
	if int64(n) > b.left {
		n, b.left, b.err = int(b.left), 0, b.t.tooLarge()
		return n, b.err
	}
	b.left -= int64(n)
	return n, err
}
