package kvm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/digitalocean/go-libvirt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/netguard"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// resolvedImage is a catalogue entry (or a URL) with the names of its
// volumes.
type resolvedImage struct {
	// Key is the catalogue key, or "url" for an image given as a URL.
	Key      string
	URL      string
	SHA256   string
	Format   string
	Firmware string
	// guard dials the download when the URL is a tenant's (a namespaced
	// config's catalogue or a KVMProxy's image URL); nil for the
	// platform's.
	guard *netguard.Guard
}

// volume is the base volume's name. It holds a digest of the URL, the
// configured sha256 and the format, so that two configs using one key for
// different images, or an edited entry, never share (or overwrite) a base
// file that running overlays back onto; and of whether the tenant guard
// fetched it, so that a tenant never boots from (nor joins the download
// of) a file the platform's unguarded download read from an address the
// tenant's guard refuses.
func (i resolvedImage) volume() string {
	return BaseVolumes(i.Key, i.URL, i.SHA256, i.Format, i.guard != nil)[0]
}

// marker is the sidecar volume holding the digest of the verified upload,
// written last: a base without it is incomplete.
func (i resolvedImage) marker() string {
	return BaseVolumes(i.Key, i.URL, i.SHA256, i.Format, i.guard != nil)[1]
}

// BaseVolumes are the names of the base volume of the catalogue entry key
// (its URL, configured sha256 and format) and of its marker, as a host's
// pool holds them: what a test deletes of its own, and no other. tenant
// is true for an image downloaded through the tenant guard (a namespaced
// config's catalogue, a proxy's image URL on any config).
func BaseVolumes(key, url, sha256Hex, format string, tenant bool) []string {
	id := url + "\n" + strings.ToLower(sha256Hex) + "\n" + format
	if tenant {
		id += "\ntenant"
	}
	h := sha256.Sum256([]byte(id))
	v := fmt.Sprintf("egressproxy-base-%s-%s.%s", key, hex.EncodeToString(h[:])[:12], format)
	return []string{v, v + ".sha256"}
}

// label names the image in progress messages.
func (i resolvedImage) label() string {
	if i.Key == "url" {
		if u, err := url.Parse(i.URL); err == nil {
			return u.Host + u.Path
		}
	}
	return i.Key
}

// imageCache runs one background download per (host, pool, base volume),
// shared by every Create that needs it. The volume's name tells the
// platform's downloads from those through the tenant guard (of which a
// process has one), so a job, its progress and its error are shared only
// by requests through the same guard. A finished download is forgotten
// (the marker on the host is the truth); a failed one is remembered for
// failedTTL so that Creates report its error instead of retrying at once.
// A job downloads under the limits of the config that started it; every
// request that joins it holds it to its own (imageJob.result).
type imageCache struct {
	failedTTL time.Duration

	mu   sync.Mutex
	jobs map[string]*imageJob
}

type imageJob struct {
	image resolvedImage
	// lim are the limits of the config that started the job, which the
	// download stops at.
	lim     limits
	done    chan struct{}
	err     error
	total   atomic.Int64
	written atomic.Int64
	// declared is the size the GET declared, once it answered; 0 while
	// unknown or when it declared none.
	declared atomic.Int64
	// overCap is set when the download stopped at lim.maxBytes.
	overCap atomic.Bool
	// available is what pool had once the size was known; checked is
	// set after both. Each request's own need is held to it.
	available uint64
	pool      string
	checked   atomic.Bool
	ended     time.Time
	// queued is set while the job waits for a download slot on its host.
	queued atomic.Bool
	// span is the download's span (a child of the create that started
	// it), which the creates that join it link to.
	span trace.SpanContext
}

// limits are a config's download limits. The job runs under those of
// the config that started it; every request that joins it is held to
// its own cap and reserve (imageJob.refusal). perHost is not: the job is
// one download on the host, whoever joins it.
type limits struct {
	// maxBytes caps the image's size.
	maxBytes int64
	// perHost is how many downloads may run at once on the host.
	perHost int
	// reserve is what the proxy waiting for the image needs besides it
	// (overlay and seed), for the pool-space check once the size is known.
	reserve uint64
}

// tooLarge is the error of an image above the cap. A tenant's (img.guard
// set) does not say the size its server declared: what a tenant's
// endpoint answers is not quoted back.
func tooLarge(img resolvedImage, size, limit int64) error {
	if img.guard != nil {
		return proxy.Permanentf("image %s is larger than the %d MiB the config allows (kvm.maxImageSizeGiB)", img.label(), limit>>20)
	}
	return proxy.Permanentf("image %s is %d MiB, more than the %d MiB the config allows (kvm.maxImageSizeGiB)", img.label(), size>>20, limit>>20)
}

// poolFull is the error of a pool whose available bytes do not cover
// an image of size and the reserve of the proxy waiting for it. A
// tenant's (img.guard set) does not say the size its server declared.
func poolFull(img resolvedImage, pool, host string, available uint64, size int64, reserve uint64) error {
	if img.guard != nil {
		return &proxy.Error{Class: proxy.ClassQuota, Reason: "PoolFull", Err: proxy.Quotaf(
			"storage pool %s on host %s has %d MiB available, less than image %s and the proxy need", pool, host, available>>20, img.label())}
	}
	return &proxy.Error{Class: proxy.ClassQuota, Reason: "PoolFull", Err: proxy.Quotaf(
		"storage pool %s on host %s has %d MiB available; image %s (%d MiB) and the proxy need %d MiB", pool, host, available>>20, img.label(), size>>20, (uint64(size)+reserve)>>20)}
}

// streamsMore is the error of an image without a declared size that
// streams past the cap.
func streamsMore(img resolvedImage, limit int64) error {
	return proxy.Permanentf("image %s streams more than the %d MiB the config allows (kvm.maxImageSizeGiB)", img.label(), limit>>20)
}

func newImageCache() *imageCache {
	return &imageCache{failedTTL: 30 * time.Second, jobs: map[string]*imageJob{}}
}

// progress is the job's progress for the Ready condition. A tenant's
// (image.guard set) says how far it is, not the size its server
// declared, as its size and pool errors do not: what a tenant's endpoint
// answers the provider is not quoted back.
func (j *imageJob) progress() string {
	if j.queued.Load() {
		return fmt.Sprintf("downloading image %s: waiting for the downloads running on the host to finish", j.image.label())
	}
	total, written := j.total.Load(), j.written.Load()
	switch {
	case total <= 0:
		return fmt.Sprintf("downloading image %s: starting", j.image.label())
	case j.image.guard != nil:
		return fmt.Sprintf("downloading image %s: %d%%", j.image.label(), written*100/total)
	}
	return fmt.Sprintf("downloading image %s: %d%% (%d of %d MiB)", j.image.label(), written*100/total, written>>20, total>>20)
}

// refusal is the error of a request with the limits lim, for a proxy
// on host, as soon as j shows the image is above lim's cap (the size its
// GET declared, or what it streamed without one) or the pool it checked
// lacks room for the image and lim's reserve; nil before: the refusal the
// request would have had downloading the image alone. The job goes on
// for the requests it fits.
func (j *imageJob) refusal(lim limits, host string) error {
	declared := j.declared.Load()
	switch {
	case declared > lim.maxBytes:
		return tooLarge(j.image, declared, lim.maxBytes)
	case declared <= 0 && (j.written.Load() > lim.maxBytes || (j.overCap.Load() && j.lim.maxBytes > lim.maxBytes)):
		return streamsMore(j.image, lim.maxBytes)
	}
	if j.checked.Load() {
		if size := j.total.Load(); j.available < uint64(size)+lim.reserve {
			return poolFull(j.image, j.pool, host, j.available, size, lim.reserve)
		}
	}
	return nil
}

// result is j's outcome for a request with the limits lim, for a proxy
// on host: its refusal, else whether j ended and its error. A job
// stopped at a limit the request's are above is not the request's
// failure: it is Transient, and the request's next Create downloads the
// image again under its own limits (imageCache.start).
func (j *imageJob) result(lim limits, host string) (bool, error) {
	if err := j.refusal(lim, host); err != nil {
		return true, err
	}
	done, err := j.finished()
	if done && err != nil && j.stoppedShortOf(lim) {
		return true, proxy.Transientf("image %s: the download another config started stopped at that config's limits (kvm.maxImageSizeGiB, or the pool space its proxy's disk needs), which this config's are above; this config's own download starts on the next attempt", j.image.label())
	}
	return done, err
}

// stoppedShortOf reports whether j stopped at a limit of the config that
// started it that lim would have let it pass: its smaller cap, or its
// larger reserve on a pool with room for lim's.
func (j *imageJob) stoppedShortOf(lim limits) bool {
	if j.overCap.Load() {
		return j.lim.maxBytes < lim.maxBytes
	}
	if !j.checked.Load() {
		return false
	}
	size := uint64(j.total.Load())
	return j.available < size+j.lim.reserve && j.available >= size+lim.reserve
}

func (j *imageJob) finished() (bool, error) {
	select {
	case <-j.done:
		return true, j.err
	default:
		return false, nil
	}
}

// start returns the job for key, and whether this call started it, which
// it does when there is none (or the last one failed longer than
// failedTTL ago, or stopped short of lim, the caller's): begin, called at
// once, prepares the new job and returns its work, which runs in the
// background under lim.
func (c *imageCache) start(key string, img resolvedImage, lim limits, wg *sync.WaitGroup, begin func(j *imageJob) (run func() error)) (*imageJob, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	// Failures are forgotten after failedTTL, whether or not anyone asks
	// for their image again: tenants choose image URLs, and the cache must
	// not grow with every one that ever failed.
	for k, j := range c.jobs {
		if done, err := j.finished(); done && err != nil && time.Since(j.ended) >= c.failedTTL {
			delete(c.jobs, k)
		}
	}
	if j := c.jobs[key]; j != nil {
		if done, err := j.finished(); !done || (err != nil && time.Since(j.ended) < c.failedTTL && !j.stoppedShortOf(lim)) {
			return j, false
		}
	}
	j := &imageJob{image: img, lim: lim, done: make(chan struct{})}
	c.jobs[key] = j
	run := begin(j)
	wg.Add(1)
	go func() {
		defer wg.Done()
		err := run()
		c.mu.Lock()
		j.err, j.ended = err, time.Now()
		if err == nil && c.jobs[key] == j {
			delete(c.jobs, key)
		}
		c.mu.Unlock()
		close(j.done)
	}()
	return j, true
}

// imageReady reports whether the base volume and a marker matching the
// configured digest are in the pool, and the base volume when they are. A
// marker whose digest differs from the configured sha256 is Permanent:
// replacing the base would corrupt the overlays backed by it.
func imageReady(ctx context.Context, api Libvirt, pool libvirt.StoragePool, img resolvedImage) (libvirt.StorageVol, bool, error) {
	m, err := api.StorageVolLookupByName(ctx, pool, img.marker())
	if isCode(err, libvirt.ErrNoStorageVol) {
		return libvirt.StorageVol{}, false, nil
	}
	if err != nil {
		return libvirt.StorageVol{}, false, err
	}
	var buf bytes.Buffer
	if err := api.StorageVolDownload(ctx, m, &buf, 64); err != nil {
		return libvirt.StorageVol{}, false, err
	}
	got := strings.TrimSpace(buf.String())
	if len(got) != 64 {
		return libvirt.StorageVol{}, false, nil // a marker cut short: redo
	}
	if img.SHA256 != "" && got != img.SHA256 {
		return libvirt.StorageVol{}, false, proxy.Permanentf("base image %s in pool %s holds sha256 %s, but the config says %s; it is not replaced because overlays back onto it: add a new image key",
			img.volume(), pool.Name, got, img.SHA256)
	}
	base, err := api.StorageVolLookupByName(ctx, pool, img.volume())
	if err != nil {
		if isCode(err, libvirt.ErrNoStorageVol) {
			return libvirt.StorageVol{}, false, nil
		}
		return libvirt.StorageVol{}, false, err
	}
	return base, true, nil
}

// baseSize is the size of the image in base, a ready base volume: the
// bytes of its file (libvirt's physical size), which are those the
// download wrote. Not its capacity: once the pool is refreshed, libvirt
// reads a qcow2 file's virtual size there, which may be many times the
// image's. 0 where libvirt reports no physical size (then the base is not
// held to the cap).
func baseSize(ctx context.Context, api Libvirt, img resolvedImage, base libvirt.StorageVol) (int64, error) {
	x, err := api.StorageVolGetXMLDesc(ctx, base)
	if err != nil {
		return 0, err
	}
	desc, err := parseVolDesc(x)
	if err != nil {
		return 0, proxy.Transientf("base image %s: cannot read its size from its volume's XML: %v", img.volume(), err)
	}
	return int64(min(desc.Physical, math.MaxInt64)), nil //nolint:gosec // Capped at MaxInt64 above.
}

// imageSize asks the server for the image's size (HEAD), for the pool
// space precheck; 0 when unknown.
func (b *Backend) imageSize(ctx context.Context, img resolvedImage) int64 {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodHead, img.URL, nil)
	if err != nil {
		return 0
	}
	resp, err := b.client(img.guard).Do(req)
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	if resp.StatusCode/100 != 2 || resp.ContentLength < 0 {
		return 0
	}
	return resp.ContentLength
}

// backgroundFetch prepares j, the download of img that the create of ctx
// starts, and returns its work: fetchImage on a background context of
// ctx (its logger and instance scope), in the span kvm.image.fetch, a
// child of the create's, under which the download's dial, libvirt calls
// and HTTP request are.
func (b *Backend) backgroundFetch(ctx context.Context, t Target, img resolvedImage, j *imageJob) func() error {
	bg, stop := b.background(ctx)
	bg, span := b.tracer.Start(bg, spanFetch, trace.WithAttributes(attribute.String(attrHost, t.Host.Name),
		attribute.String(attrPool, t.Host.pool()), attribute.String(attrVolume, img.volume())))
	j.span = span.SpanContext()
	return func() error {
		defer stop()
		defer span.End()
		t0 := time.Now()
		err := b.fetchImage(bg, t, img, j)
		kv := []any{"image", img.label(), "volume", img.volume(), "bytes", j.written.Load(), "duration", time.Since(t0).Round(time.Millisecond).String()}
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
			kv = append(kv, "error", err.Error())
		}
		b.logger(bg).V(1).Info("kvm image download finished", kv...)
		return err
	}
}

// fetchImage downloads img into the pool on a connection of its own (a
// cancelled reconcile elsewhere cannot cut it off, and it cannot cut off
// anyone's calls), streaming from the URL into StorageVolUpload with a
// running sha256: memory stays constant whatever the image's size. A base
// left without a marker by an earlier attempt is deleted and redone.
func (b *Backend) fetchImage(ctx context.Context, t Target, img resolvedImage, j *imageJob) (err error) {
	lim := j.lim
	// One tenant's images cannot take every download of a host: wait for
	// a slot (outside the upload budget, which starts with the download).
	owner := downloadOwner(ctx, img)
	j.queued.Store(true)
	err = b.downloads.acquire(ctx, t.endpoint(), owner, lim.perHost)
	j.queued.Store(false)
	if err != nil {
		return proxy.Transientf("image %s: %v", img.label(), err)
	}
	defer b.downloads.release(t.endpoint(), owner)
	ctx, cancel := context.WithTimeout(withBudget(ctx, b.budgets.ImageUpload), b.budgets.ImageUpload)
	defer cancel()
	c, err := b.pool.fresh(ctx, t)
	if err != nil {
		return err
	}
	defer c.link.close("image download finished")
	api := c.api
	pool, err := api.StoragePoolLookupByName(ctx, t.Host.pool())
	if err != nil {
		return classify(proxy.OpCreate, err)
	}
	if _, ok, err := imageReady(ctx, api, pool, img); err != nil || ok {
		return err
	}
	for _, name := range []string{img.marker(), img.volume()} {
		if err := deleteVolume(ctx, api, pool, name); err != nil {
			return err
		}
	}

	// Only the download's request is cut off by a silent server: the
	// libvirt calls keep their own budgets.
	wctx, watch := newIdleWatch(ctx, b.budgets.ImageIdle)
	defer watch.stop()
	body, size, err := b.download(wctx, img, j, watch)
	if err != nil {
		return err
	}
	defer func() { _ = body.Close() }()
	j.total.Store(size)
	// The size is known now (the GET's, not what a HEAD claimed): check
	// the pool again before writing anything.
	info, err := api.StoragePoolGetInfo(ctx, pool)
	if err != nil {
		return classify(proxy.OpCreate, err)
	}
	j.available, j.pool = info.Available, pool.Name
	j.checked.Store(true)
	if info.Available < uint64(size)+lim.reserve {
		return poolFull(img, pool.Name, t.Host.Name, info.Available, size, lim.reserve)
	}

	x, err := volumeXML(img.volume(), uint64(size), "raw", "", "")
	if err != nil {
		return err
	}
	vol, err := api.StorageVolCreateXML(ctx, pool, x)
	if err != nil {
		return classify(proxy.OpCreate, err)
	}
	h := sha256.New()
	// Exactly size bytes go up; a body that streams more fails.
	cr := &countingReader{r: io.TeeReader(&exactReader{r: body, left: size, what: img.label()}, h), n: &j.written}
	if err := api.StorageVolUpload(ctx, vol, cr, uint64(size)); err != nil {
		if idle := watch.err(img); idle != nil {
			return idle
		}
		return classify(proxy.OpCreate, err)
	}
	if n := j.written.Load(); n != size {
		if img.guard != nil {
			return proxy.Transientf("image %s: the download ended before the size its server declared", img.label())
		}
		return proxy.Transientf("image %s: got %d of %d bytes", img.label(), n, size)
	}
	digest := hex.EncodeToString(h.Sum(nil))
	if img.SHA256 != "" && digest != img.SHA256 {
		_ = deleteVolume(ctx, api, pool, img.volume())
		if img.guard != nil {
			// Not the digest of what was downloaded: a tenant's URL may
			// name a file it must not learn anything of.
			return proxy.Permanentf("image %s: its sha256 is not the one the config says (%s)", img.label(), img.SHA256)
		}
		return proxy.Permanentf("image %s: sha256 is %s, the config says %s", img.label(), digest, img.SHA256)
	}
	mx, err := volumeXML(img.marker(), 64, "raw", "", "")
	if err != nil {
		return err
	}
	mvol, err := api.StorageVolCreateXML(ctx, pool, mx)
	if err != nil {
		return classify(proxy.OpCreate, err)
	}
	if err := api.StorageVolUpload(ctx, mvol, strings.NewReader(digest), 64); err != nil {
		return classify(proxy.OpCreate, err)
	}
	// Libvirt learns the uploaded file's real format and size.
	return classify(proxy.OpCreate, api.StoragePoolRefresh(ctx, pool))
}

// download opens img's URL. Without a Content-Length (a chunked mirror)
// the body of a platform's image is spooled to a temporary file first,
// since the volume's size must be declared before the upload; memory
// stays constant either way. A tenant's image needs a Content-Length.
func (b *Backend) download(ctx context.Context, img resolvedImage, j *imageJob, watch *idleWatch) (body io.ReadCloser, size int64, err error) {
	u, _ := url.Parse(img.URL)
	host := ""
	if u != nil {
		host = u.Host
	}
	ctx, span := b.tracer.Start(ctx, spanDownload, trace.WithAttributes(
		attribute.String("kvm.url_host", host), attribute.Bool("kvm.sha256_configured", img.SHA256 != "")))
	defer func() {
		if err != nil {
			span.SetStatus(codes.Error, err.Error())
		}
		span.SetAttributes(attribute.Int64("kvm.bytes", size))
		span.End()
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, img.URL, nil)
	if err != nil {
		return nil, 0, proxy.Permanentf("image %s: the URL does not parse", img.label())
	}
	watch.wait()
	resp, err := b.client(img.guard).Do(req)
	watch.got()
	if err != nil {
		if idle := watch.err(img); idle != nil {
			return nil, 0, idle
		}
		if img.guard != nil {
			err = quietDownloadError(err, req.URL)
		} else {
			// Its query (a presigned URL's signature) or user info are
			// credentials: label() names the image instead.
			err = netguard.WithoutURL(err)
		}
		if netguard.IsRefused(err) {
			return nil, 0, proxy.Permanentf("image %s: %w", img.label(), err)
		}
		return nil, 0, proxy.Transientf("image %s: %w", img.label(), err)
	}
	resp.Body = watch.reader(resp.Body)
	status := resp.Status
	if img.guard != nil {
		// The reason phrase is the server's to write.
		status = strconv.Itoa(resp.StatusCode) + " (its status text is not shown to tenants)"
	}
	switch {
	case resp.StatusCode/100 == 2:
	case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode >= 500:
		_ = resp.Body.Close()
		return nil, 0, proxy.Transientf("image %s: the server answered %s", img.label(), status)
	default:
		_ = resp.Body.Close()
		return nil, 0, proxy.Permanentf("image %s: the server answered %s", img.label(), status)
	}
	if resp.ContentLength > 0 {
		j.declared.Store(resp.ContentLength)
	}
	if resp.ContentLength > j.lim.maxBytes {
		_ = resp.Body.Close()
		j.overCap.Store(true)
		return nil, 0, tooLarge(img, resp.ContentLength, j.lim.maxBytes)
	}
	switch {
	case resp.ContentLength > 0:
		return resp.Body, resp.ContentLength, nil
	case resp.ContentLength == 0:
		_ = resp.Body.Close()
		return nil, 0, proxy.Permanentf("image %s: the server sent an empty body", img.label())
	case img.guard != nil:
		// A tenant chooses the server: spooling its image would let it
		// take the provider's disk (and the spool budget every config
		// shares) for as long as its server keeps streaming.
		_ = resp.Body.Close()
		return nil, 0, proxy.Permanentf("image %s: its server sends no Content-Length, and the image of a namespaced ProviderConfig or of a proxy's image URL is downloaded only with one: serve it with a Content-Length", img.label())
	}
	body, size, err = spoolBody(resp.Body, img, j)
	if idle := watch.err(img); err != nil && idle != nil {
		return nil, 0, idle
	}
	return body, size, err
}

// spoolBody copies the body of an image without a Content-Length into an
// unlinked temporary file, within the process's spool budget
// (imageSpool), and returns the file, rewound, and its size.
func spoolBody(body io.ReadCloser, img resolvedImage, j *imageJob) (io.ReadCloser, int64, error) {
	defer func() { _ = body.Close() }()
	f, err := imageSpool.create()
	if err != nil {
		return nil, 0, proxy.Transientf("image %s: spooling: %v", img.label(), err)
	}
	// The spool stops one byte past the cap: disk use is bounded too.
	n, err := io.Copy(f, &countingReader{r: io.LimitReader(body, j.lim.maxBytes+1), n: &j.written})
	if err == nil && n > j.lim.maxBytes {
		_ = f.Close()
		j.overCap.Store(true)
		j.written.Store(0)
		return nil, 0, streamsMore(img, j.lim.maxBytes)
	}
	j.written.Store(0)
	if err != nil {
		_ = f.Close()
		return nil, 0, spoolError(img, err)
	}
	if n == 0 {
		_ = f.Close()
		return nil, 0, proxy.Permanentf("image %s: the server sent an empty body", img.label())
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		_ = f.Close()
		return nil, 0, proxy.Transientf("image %s: spooling: %v", img.label(), err)
	}
	return f, n, nil
}

// spoolError classifies a failed spool copy: the budget's refusals name
// it and what would be accepted.
func spoolError(img resolvedImage, err error) error {
	limit, _ := imageSpool.budget()
	switch {
	case errors.Is(err, errSpoolBusy):
		return &proxy.Error{Class: proxy.ClassQuota, Reason: "SpoolFull", Err: fmt.Errorf(
			"image %s: its server sends no Content-Length, and the provider's spool space for such images (%d MiB, shared by every config and host) is in use by other downloads: retry later, or serve the image with a Content-Length", img.label(), limit>>20)}
	case errors.Is(err, errSpoolTooLarge):
		return proxy.Permanentf("image %s: its server sends no Content-Length, and it is larger than the %d MiB the provider spools for such images: serve it with a Content-Length", img.label(), limit>>20)
	}
	return proxy.Transientf("image %s: spooling: %v", img.label(), err)
}

// client is the HTTP client of downloads through guard: b.http for the
// platform's images, and for a tenant's one that dials through
// guard.ForContent() and checks every redirect with it, kept per guard
// (the config's, so one client serves all its downloads). The image's
// bytes go into a pool the tenant's proxies boot from: the ranges the
// platform team allows for tenants' endpoints do not open a download.
func (b *Backend) client(guard *netguard.Guard) *http.Client {
	if guard == nil {
		return b.http
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if c, ok := b.guarded[guard]; ok {
		return c
	}
	base, _ := b.http.Transport.(*http.Transport) // nil: the default
	content := guard.ForContent()
	c := &http.Client{Transport: content.Transport(base), CheckRedirect: content.CheckRedirect, Timeout: b.http.Timeout}
	if b.guarded == nil {
		b.guarded = map[*netguard.Guard]*http.Client{}
	}
	b.guarded[guard] = c
	return c
}

// countingReader counts the bytes read, for progress.
type countingReader struct {
	r io.Reader
	n *atomic.Int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n.Add(int64(n))
	return n, err
}

// quietDownloadError is the failure err of a tenant's download of asked,
// as netguard.Quiet has it, and, where the server had redirected it, as
// netguard.AfterRedirect has it: nothing of where the redirect led (a
// dial error names its host).
func quietDownloadError(err error, asked *url.URL) error {
	redirected := false
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		// net/http names the URL it last asked: a redirect's target.
		last, perr := url.Parse(ue.URL)
		redirected = perr != nil || last.Host != asked.Host || last.Path != asked.Path || last.RawQuery != asked.RawQuery
	}
	if redirected {
		return netguard.AfterRedirect(err, asked.Host)
	}
	return netguard.Quiet(err, "the image URL")
}

// exactReader passes on exactly left bytes of r and fails when r has
// more: what is uploaded is what the size check and the volume were for.
type exactReader struct {
	r    io.Reader
	left int64
	what string
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.left <= 0 {
		var one [1]byte
		if n, _ := e.r.Read(one[:]); n > 0 {
			return 0, proxy.Permanentf("image %s: the server sent more bytes than it declared", e.what)
		}
		return 0, io.EOF
	}
	if int64(len(p)) > e.left {
		p = p[:e.left]
	}
	n, err := e.r.Read(p)
	e.left -= int64(n)
	if err == io.EOF && e.left > 0 {
		return n, io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		err = nil
	}
	return n, err
}

// deleteVolume deletes name from pool when it is there.
func deleteVolume(ctx context.Context, api Libvirt, pool libvirt.StoragePool, name string) error {
	v, err := api.StorageVolLookupByName(ctx, pool, name)
	if isCode(err, libvirt.ErrNoStorageVol) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := api.StorageVolDelete(ctx, v); err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
		return err
	}
	return nil
}

// running reports whether a download of key (host endpoint, pool,
// volume) is in flight.
func (c *imageCache) running(key string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	j, ok := c.jobs[key]
	if !ok {
		return false
	}
	select {
	case <-j.done:
		return false
	default:
		return true
	}
}
