package squid

import (
	"bytes"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// The egress check from inside an instance (egressIPSource Reported), for
// proxies the provider cannot reach: the instance sends the check's request
// to its own Squid on loopback and reports the answer as one line through
// a channel of the backend (a pod's log, a guest attribute, a file the
// guest agent reads). What comes back is the tenant's instance's word:
// read strictly (ParseReport), capped, never quoted.

// ReportMarker begins every line ReportScript prints.
const ReportMarker = "egressproxy-egress-check"

// MaxReport is the most of a report (or of a pod log's tail) a driver
// reads.
const MaxReport = 4096

// ReportScript is a bash script (bash, coreutils: what every Squid image
// and guest has) that sends the request in the file $1 (ReportRequest) to
// Squid on $3 (default 127.0.0.1) port $2 and prints one line:
//
//	egressproxy-egress-check <unix time> <HTTP status, 000 without answer> <the answer's body on one line, at most 512 bytes>
//
// It exits 0 when the echo answered 200. Run it as bash -c ReportScript
// egress-check FILE PORT [HOST]; ReportLoop repeats it.
const ReportScript = `set -u
req=$1 port=$2 host=${3:-127.0.0.1}
ans=$(timeout 15 bash -c 'exec 3<>"/dev/tcp/$1/$2" || exit 1; cat "$3" >&3 || exit 1; head -c 4096 <&3' check "$host" "$port" "$req" 2>/dev/null | tr -d '\r\000')
status=000
case $ans in
HTTP/1.?" "[0-9][0-9][0-9]*) status=${ans:9:3} ;;
esac
body=
case $ans in
*$'\n\n'*) body=${ans#*$'\n\n'} ;;
esac
body=$(printf '%s' "$body" | tr -c '[:print:]' ' ' | head -c 512)
echo "` + ReportMarker + ` $(date +%s) $status $body"
[ "$status" = 200 ]
`

// ReportLoop is a bash script that runs ReportScript with the request file
// $1 and Squid's port $2 on loopback until the echo answers, every 10 s,
// and then again every $3 seconds: a pod's sidecar.
const ReportLoop = `check() {
` + ReportScript + `}
while :; do
  if check "$1" "$2" 127.0.0.1; then sleep "$3"; else sleep 10; fi
done
`

// ReportRequest is the request the instance sends its own Squid for the
// check c: a GET of the echo URL with the check's credential. Only plain
// http echo URLs: the instance's tools (bash) speak no TLS.
func ReportRequest(c proxy.EgressCheck) (string, error) {
	u, msg := parseCheckURL(c.URL)
	if msg != "" {
		return "", fmt.Errorf("egress check URL %s", msg)
	}
	if u.https {
		return "", errors.New("an https echo URL cannot be checked from inside the instance (its tools speak no TLS): name an http echo URL")
	}
	host := u.host
	if strings.Contains(host, ":") {
		host = "[" + host + "]"
	}
	if u.port != "80" {
		host += ":" + u.port
	}
	auth := base64.StdEncoding.EncodeToString([]byte(c.Username + ":" + c.Password))
	return "GET http://" + host + u.path + " HTTP/1.1\r\n" +
		"Host: " + host + "\r\n" +
		"Proxy-Authorization: Basic " + auth + "\r\n" +
		"User-Agent: egressproxy-egress-check\r\n" +
		"Connection: close\r\n\r\n", nil
}

// Report is what an instance reported of its egress check.
type Report struct {
	// IP the echo saw; empty when the check failed.
	IP string
	// At is when the instance says it checked.
	At time.Time
	// Status is the HTTP status the instance's own Squid answered the
	// check with, 0 when it did not answer.
	Status int
	// Failure says, in the provider's words, why the check failed.
	Failure string
}

// ParseReport reads one report line (ReportScript's), strictly: the
// marker, a time, a status and an answer that is one address. Nothing of
// it is quoted in an error.
func ParseReport(line []byte) (Report, error) {
	if len(line) > MaxReport {
		return Report{}, fmt.Errorf("the report from inside the instance is %d bytes; at most %d are read", len(line), MaxReport)
	}
	f := strings.SplitN(strings.TrimRight(string(line), "\r\n"), " ", 4)
	if len(f) < 3 || f[0] != ReportMarker {
		return Report{}, errors.New("the report from inside the instance is not an egress check line")
	}
	sec, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || sec <= 0 || len(f[2]) != 3 {
		return Report{}, errors.New("the report from inside the instance has no valid time or status")
	}
	status, err := strconv.Atoi(f[2])
	if err != nil || (status != 0 && (status < 100 || status > 599)) {
		return Report{}, errors.New("the report from inside the instance has no valid status")
	}
	r := Report{At: time.Unix(sec, 0), Status: status}
	body := ""
	if len(f) == 4 {
		body = f[3]
	}
	switch {
	case status == 0:
		r.Failure = "the instance's own Squid did not answer the check"
	case status != 200:
		r.Failure = fmt.Sprintf("the check through the instance's own Squid was answered %d", status)
	default:
		ip, err := ParseEcho([]byte(body))
		if err != nil {
			return Report{}, err
		}
		r.IP = ip
	}
	return r, nil
}

// LastReport is the latest report in the tail of a log (a pod's, read with
// timestamps: each line "<RFC 3339 time> <line>"): its time is the log's
// (the kubelet's), not the instance's own word. ok is false when the tail
// holds none.
func LastReport(log []byte) (r Report, ok bool, err error) {
	if len(log) > MaxReport {
		log = log[len(log)-MaxReport:]
	}
	lines := bytes.Split(log, []byte("\n"))
	for i := len(lines) - 1; i >= 0; i-- {
		ts, line, found := bytes.Cut(lines[i], []byte(" "))
		if !found || !bytes.HasPrefix(line, []byte(ReportMarker+" ")) {
			continue
		}
		at, terr := time.Parse(time.RFC3339Nano, string(ts))
		if terr != nil {
			continue
		}
		r, err := ParseReport(line)
		if err != nil {
			return Report{}, true, err
		}
		r.At = at
		return r, true, nil
	}
	return Report{}, false, nil
}

// ReportedAt bounds the time an instance claims for its report by the
// provider's clock: never later than now.
func ReportedAt(at, now time.Time) time.Time {
	if at.After(now) {
		return now
	}
	return at
}

// GuestReport reads a guest's report line (a file or attribute its own
// check wrote), its time bounded by now. ok says the line is valid, not
// older than created (a minute's slack for the guest's clock and its
// whole seconds) and answered by the guest's own Squid with an HTTP
// status, the echo's 200 or not: Squid answered inside the guest. r then
// holds the address, or why the check failed. err says why a line was not
// valid (nothing of it quoted).
func GuestReport(line []byte, created, now time.Time) (r Report, ok bool, err error) {
	r, err = ParseReport(bytes.TrimRight(line, "\n"))
	if err != nil {
		return Report{}, false, err
	}
	r.At = ReportedAt(r.At, now)
	if r.Status == 0 || (!created.IsZero() && r.At.Before(created.Add(-time.Minute))) {
		return Report{}, false, nil
	}
	return r, true, nil
}

// Publish puts r, an instance's report of its own check (its time
// bounded), on inst: the address it saw, Reported, or why the check
// failed (EgressFailure), leaving the backend's figure as it is.
func (r Report) Publish(inst *proxy.Instance) {
	inst.EgressCheckedAt = r.At
	if r.IP == "" {
		inst.EgressFailure = r.Failure
		return
	}
	inst.EgressIP, inst.EgressSource, inst.EgressFailure = r.IP, proxy.EgressReported, ""
}
