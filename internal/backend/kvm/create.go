package kvm

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"time"

	"github.com/digitalocean/go-libvirt"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/egressproxy/provider-egressproxy/internal/cloudinit"
	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// seedReserve is what the precheck reserves for a seed ISO.
const seedReserve = 16 << 20

// plan is a validated Create request with everything resolved.
type plan struct {
	req       proxy.Request
	host      Host
	machine   MachineType
	image     resolvedImage
	userData  string // secret: never logged
	metaData  string
	createdAt time.Time
}

func (p *plan) key() string { return Target{Host: p.host}.endpoint() + "/" + p.req.Name }

// plan checks the request against the config before any backend call.
func (d *Driver) plan(ctx context.Context, req proxy.Request) (*plan, error) {
	if !validName.MatchString(req.Name) {
		return nil, proxy.Permanentf("instance name %q is not a valid domain name (lowercase letters, digits, dashes, at most 63)", req.Name)
	}
	if req.Mark.UID == "" || req.Mark.InstallationID == "" {
		return nil, proxy.Permanentf("request for %q carries no complete ownership mark", req.Name)
	}
	if strings.HasPrefix(req.Name, basePrefix) {
		return nil, proxy.Permanentf("instance name %q starts with %q, which names the shared base images' volumes: choose another external name", req.Name, basePrefix)
	}
	h, err := d.host(req.Placement.Location)
	if err != nil {
		return nil, err
	}
	mt, ok := d.cfg.MachineTypes[req.Placement.MachineType]
	if !ok {
		return nil, proxy.Permanentf("placement: machine type %q is not in the config's kvm.machineTypes", req.Placement.MachineType)
	}
	img, err := d.image(req.Placement.Image)
	if err != nil {
		return nil, err
	}
	hv, err := d.hypervisors(ctx)
	if err != nil {
		return nil, err
	}
	files, err := squid.Render(req.Proxy, cloudinit.SquidOptions(req.Mark.UID, hv...))
	if err != nil {
		return nil, err
	}
	ud, err := cloudinit.UserData(cloudinit.Options{Squid: files, InstallGuestAgent: d.cfg.InstallGuestAgent, UserData: req.CloudInit, Hostname: req.Name,
		EgressReport: cloudinit.ReportOf(req.Proxy, false)})
	if err != nil {
		return nil, err
	}
	return &plan{req: req, host: h, machine: mt, image: img, userData: ud, metaData: cloudinit.MetaData(req.Name, req.Name) + seedMarkLines(req.Mark),
		createdAt: time.Now().UTC().Truncate(time.Second)}, nil
}

// image resolves a catalogue key or an http(s) URL.
func (d *Driver) image(key string) (resolvedImage, error) {
	if strings.HasPrefix(key, "http://") || strings.HasPrefix(key, "https://") {
		g := d.cfg.URLGuard
		if g == nil {
			g = d.cfg.Guard
		}
		return resolvedImage{Key: "url", URL: key, Format: "qcow2", Firmware: "bios", guard: g}, nil
	}
	im, ok := d.cfg.Images[key]
	if !ok {
		return resolvedImage{}, proxy.Permanentf("placement: image %q is neither a key of the config's kvm.images nor an http(s) URL", key)
	}
	return resolvedImage{Key: key, URL: im.URL, SHA256: strings.ToLower(im.SHA256), Format: orDefault(im.Format, "qcow2"), Firmware: orDefault(im.Firmware, "bios"), guard: d.cfg.Guard}, nil
}

// Create implements proxy.Driver. It never waits for a boot or a download:
// with the base image cached it creates the overlay and seed, defines and
// starts the domain and returns; otherwise it starts (or joins) the
// image's background download and returns, and the rest follows in the
// background once the image is there. Every step resumes after a crash.
func (d *Driver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpCreate, d.wrap, func(ctx context.Context) (proxy.Instance, error) {
		inst, err := d.create(ctx, req)
		if err != nil {
			d.log(ctx).V(1).Info("kvm create failed", "name", req.Name, "error", err.Error())
		}
		return inst, err
	})
}

func (d *Driver) create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	p, err := d.plan(ctx, req)
	if err != nil {
		return proxy.Instance{}, err
	}
	ctx = d.withInstance(ctx, p.host.Name, req.Name)
	log := d.log(ctx)
	log.V(telemetry.VDetail).Info("kvm create", "machineType", req.Placement.MachineType, "vcpus", p.machine.VCPUs, "memoryMiB", p.machine.MemoryMiB,
		"diskSizeGB", d.cfg.DiskSizeGB, "image", p.image.Key, "imageSource", p.image.label(), "imageFormat", p.image.Format, "firmware", p.image.Firmware,
		"sha256Configured", p.image.SHA256 != "", "pool", p.host.pool(), "bridge", p.host.Bridge, "network", p.host.Network, "domainType", orDefault(p.host.DomainType, "kvm"),
		"port", req.Proxy.Port, "allowedClientCIDRs", req.Proxy.AllowedClientCIDRs, "allowedPorts", req.Proxy.AllowedPorts, "auth", req.Proxy.Auth.Username != "",
		"cloudInitBytes", len(req.CloudInit), "userDataBytes", len(p.userData), "vendorDataBytes", len(d.cfg.VendorData))
	unlock, err := d.b.names.lock(ctx, p.key())
	if err != nil {
		return proxy.Instance{}, err
	}
	defer unlock()
	api, err := d.conn(ctx, p.host)
	if err != nil {
		return proxy.Instance{}, err
	}
	dom, err := api.DomainLookupByName(ctx, req.Name)
	if err == nil {
		return d.adopt(ctx, api, p, dom)
	}
	if !isCode(err, libvirt.ErrNoDomain) {
		return proxy.Instance{}, err
	}
	if pe := d.b.pendingFor(p.key()); pe != nil && pe.failure() != nil {
		d.b.removePending(pe) // failed in the background: start over
	} else if pe != nil {
		if pe.plan.req.Mark != req.Mark {
			return proxy.Instance{}, proxy.Permanentf("instance %s is being created for another resource (UID %s, installation %q); refusing to adopt it",
				req.Name, pe.plan.req.Mark.UID, pe.plan.req.Mark.InstallationID)
		}
		return pe.view(), nil
	}

	pool, err := api.StoragePoolLookupByName(ctx, p.host.pool())
	if err != nil {
		return proxy.Instance{}, err
	}
	info, err := api.StoragePoolGetInfo(ctx, pool)
	if err != nil {
		return proxy.Instance{}, err
	}
	if info.State != libvirt.StoragePoolRunning {
		return proxy.Instance{}, proxy.Permanentf("storage pool %s on host %s is not active", pool.Name, p.host.Name)
	}
	need := uint64(d.cfg.DiskSizeGB)<<30 + seedReserve
	base, ready, err := imageReady(ctx, api, pool, p.image)
	if err != nil {
		return proxy.Instance{}, err
	}
	limit := d.cfg.maxImageBytes()
	if ready {
		// The cap is the largest image the config's proxies boot from,
		// whichever config's download put it in the pool.
		size, err := baseSize(ctx, api, p.image, base)
		if err != nil {
			return proxy.Instance{}, err
		}
		if size > limit {
			return proxy.Instance{}, tooLarge(p.image, size, limit)
		}
	} else {
		size := max(d.b.imageSize(ctx, p.image), 0)
		if size > limit {
			return proxy.Instance{}, tooLarge(p.image, size, limit)
		}
		need += uint64(size)
	}
	if info.Available < need {
		// libvirt's figures of a directory pool are those of its last
		// refresh: space freed on the host since is seen only after one.
		if err := api.StoragePoolRefresh(ctx, pool); err != nil {
			return proxy.Instance{}, err
		}
		if info, err = api.StoragePoolGetInfo(ctx, pool); err != nil {
			return proxy.Instance{}, err
		}
	}
	if info.Available < need {
		if p.image.guard != nil {
			// The need holds the size the tenant's image server gave:
			// what it answered is not quoted.
			return proxy.Instance{}, &proxy.Error{Class: proxy.ClassQuota, Reason: "PoolFull", Err: proxy.Quotaf(
				"storage pool %s on host %s has %d MiB available, less than the image and the proxy's %d GB disk need", pool.Name, p.host.Name, info.Available>>20, d.cfg.DiskSizeGB)}
		}
		return proxy.Instance{}, &proxy.Error{Class: proxy.ClassQuota, Reason: "PoolFull", Err: proxy.Quotaf(
			"storage pool %s on host %s has %d MiB available; this proxy needs %d MiB", pool.Name, p.host.Name, info.Available>>20, need>>20)}
	}
	if mem, err := api.NodeGetMemoryStats(ctx); err != nil {
		// A host that does not report memory is not refused for it.
		log.V(1).Info("kvm create: cannot read the host's memory; not checking it", "error", err.Error())
	} else if want := uint64(p.machine.MemoryMiB) << 20; mem.Available() < want { //nolint:gosec // A positive MiB count.
		return proxy.Instance{}, &proxy.Error{Class: proxy.ClassQuota, Reason: "HostMemory", Err: proxy.Quotaf(
			"host %s has %d MiB of memory available; machine type %s needs %d MiB", p.host.Name, mem.Available()>>20, p.req.Placement.MachineType, want>>20)}
	}
	if !ready {
		lim := d.limits()
		job, started := d.b.images.start(Target{Host: p.host}.endpoint()+"/"+pool.Name+"/"+p.image.volume(), p.image, lim, &d.b.wg, func(j *imageJob) func() error {
			return d.b.backgroundFetch(ctx, d.target(p.host), p.image, j)
		})
		if !started {
			// Another create's download: this create's span leads to it.
			trace.SpanFromContext(ctx).AddLink(trace.Link{SpanContext: job.span})
		}
		done, jerr := job.result(lim, p.host.Name)
		switch {
		case done && jerr != nil:
			return proxy.Instance{}, jerr
		case !done:
			pe := d.b.addPending(ctx, d, p, job)
			log.V(1).Info("kvm create waits for the base image", "image", p.image.Key)
			return pe.view(), nil
		}
	}
	if err := d.finish(ctx, api, pool, p); err != nil {
		return proxy.Instance{}, err
	}
	log.V(1).Info("kvm domain defined and started")
	return d.provisioning(p, ""), nil
}

// limits are the config's download limits, for a proxy's image.
func (d *Driver) limits() limits {
	return limits{maxBytes: d.cfg.maxImageBytes(), perHost: d.cfg.maxDownloadsPerHost(), reserve: uint64(d.cfg.DiskSizeGB)<<30 + seedReserve}
}

// provisioning is the view of an instance Create just started.
func (d *Driver) provisioning(p *plan, progress string) proxy.Instance {
	return proxy.Instance{
		ID:        formatID(p.host.Name, p.req.Name),
		Name:      p.req.Name,
		Mark:      p.req.Mark,
		State:     proxy.StateProvisioning,
		Placement: p.req.Placement,
		CreatedAt: p.createdAt,
		Progress:  progress,
		SpecHash:  proxy.Hash(p.req),
	}
}

// adopt handles a domain that already has the name: ours (same mark) is
// started when it was defined but never started (a crash between define
// and start); anyone else's is never touched.
func (d *Driver) adopt(ctx context.Context, api Libvirt, p *plan, dom libvirt.Domain) (proxy.Instance, error) {
	meta, err := readMeta(ctx, api, dom)
	if err != nil {
		return proxy.Instance{}, err
	}
	switch m := meta.mark(); {
	case m == (proxy.Mark{}):
		return proxy.Instance{}, proxy.Permanentf("domain %s exists on host %s and was not created by provider-egressproxy (no ownership mark); refusing to adopt it",
			p.req.Name, p.host.Name)
	case m != p.req.Mark:
		return proxy.Instance{}, proxy.Permanentf("domain %s on host %s belongs to another resource (UID %s, installation %q), not UID %s of installation %q; refusing to adopt it",
			p.req.Name, p.host.Name, m.UID, m.InstallationID, p.req.Mark.UID, p.req.Mark.InstallationID)
	}
	state, _, err := api.DomainGetState(ctx, dom)
	if err != nil {
		return proxy.Instance{}, err
	}
	switch state {
	case libvirt.DomainPaused, libvirt.DomainPmsuspended:
		return proxy.Instance{}, proxy.Permanentf("domain %s on host %s is paused or suspended and cannot be started by the provider; resume or destroy it on the host", p.req.Name, p.host.Name)
	case libvirt.DomainShutoff, libvirt.DomainCrashed:
		if err := startDomain(ctx, api, dom); err != nil {
			return proxy.Instance{}, err
		}
	}
	return d.read(ctx, api, p.host, dom, meta, p.req.Proxy.ProxyCA(), p.req.TenantGuest)
}

// finish creates the overlay (reused when complete and right), the seed
// (always rebuilt: an upload cut off by a crash must not be trusted),
// defines the domain with its mark and starts it.
func (d *Driver) finish(ctx context.Context, api Libvirt, pool libvirt.StoragePool, p *plan) error {
	base, err := api.StorageVolLookupByName(ctx, pool, p.image.volume())
	if err != nil {
		return err
	}
	basePath, err := api.StorageVolGetPath(ctx, base)
	if err != nil {
		return err
	}
	// The seed is checked before the overlay is touched: a seed with
	// another resource's mark makes both volumes that resource's.
	old, err := d.claimSeed(ctx, api, pool, p)
	if err != nil {
		return err
	}
	overlay, err := d.ensureOverlay(ctx, api, pool, p, basePath)
	if err != nil {
		return err
	}
	seed, err := d.writeSeed(ctx, api, pool, p, old)
	if err != nil {
		return err
	}
	overlayPath, err := api.StorageVolGetPath(ctx, overlay)
	if err != nil {
		return err
	}
	seedPath, err := api.StorageVolGetPath(ctx, seed)
	if err != nil {
		return err
	}
	meta := instanceMeta{Managed: true, UID: p.req.Mark.UID, InstallationID: p.req.Mark.InstallationID, CreatedAt: p.createdAt.Format(time.RFC3339),
		SpecHash: proxy.Hash(p.req), Port: p.req.Proxy.Port, MachineType: p.req.Placement.MachineType, Image: p.image.Key}
	x, err := domainXML(domainSpec{Name: p.req.Name, Type: p.host.DomainType, VCPUs: p.machine.VCPUs, MemoryMiB: p.machine.MemoryMiB,
		Firmware: p.image.Firmware, Overlay: overlayPath, Seed: seedPath, Bridge: p.host.Bridge, Network: p.host.Network, Meta: meta})
	if err != nil {
		return err
	}
	d.logAbout(ctx, p.host.Name, p.req.Name).V(telemetry.VDetail).Info("kvm domain XML", "xml", x)
	dom, err := api.DomainDefineXML(ctx, x)
	if err != nil {
		return err
	}
	return startDomain(ctx, api, dom)
}

func overlayName(name string) string { return name + ".qcow2" }
func seedName(name string) string    { return name + "-seed.iso" }

// ensureOverlay creates the overlay, or reuses one a crashed attempt left
// when it backs onto this base with this capacity (creation is atomic, so
// an existing overlay is complete); another overlay of the provider's
// that no domain uses is replaced. A volume of the name that another
// domain uses, or that is not an overlay of a base image, is refused.
func (d *Driver) ensureOverlay(ctx context.Context, api Libvirt, pool libvirt.StoragePool, p *plan, basePath string) (libvirt.StorageVol, error) {
	name := overlayName(p.req.Name)
	capacity := uint64(d.cfg.DiskSizeGB) << 30
	v, err := api.StorageVolLookupByName(ctx, pool, name)
	if err == nil {
		if _, err := claimable(ctx, api, pool, v, p.req.Name, p.host.Name); err != nil {
			return libvirt.StorageVol{}, err
		}
		desc, own, err := isOverlay(ctx, api, v)
		if err != nil {
			return libvirt.StorageVol{}, err
		}
		if !own {
			return libvirt.StorageVol{}, proxy.Permanentf("volume %s in pool %s on host %s exists and is not an overlay the provider created; it is left as it is: choose another external name, or remove it",
				name, pool.Name, p.host.Name)
		}
		if desc.BackingStore.Path == basePath && desc.Capacity == capacity {
			return v, nil
		}
		d.logAbout(ctx, p.host.Name, p.req.Name).V(1).Info("replacing an overlay that does not match")
		if err := api.StorageVolDelete(ctx, v); err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
			return libvirt.StorageVol{}, err
		}
	} else if !isCode(err, libvirt.ErrNoStorageVol) {
		return libvirt.StorageVol{}, err
	}
	x, err := volumeXML(name, capacity, "qcow2", basePath, p.image.Format)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	d.logAbout(ctx, p.host.Name, p.req.Name).V(telemetry.VDetail).Info("kvm volume XML", "xml", x)
	v, err = api.StorageVolCreateXML(ctx, pool, x)
	if isCode(err, libvirt.ErrStorageVolExist) {
		return api.StorageVolLookupByName(ctx, pool, name)
	}
	return v, err
}

// claimSeed returns the existing volume of the seed's name, or nil. It
// may be replaced only when it is this instance's seed (by its name, or
// cut off), carries no mark of another resource and no other domain uses
// it; else Create is refused and neither volume is touched.
func (d *Driver) claimSeed(ctx context.Context, api Libvirt, pool libvirt.StoragePool, p *plan) (*libvirt.StorageVol, error) {
	name := seedName(p.req.Name)
	old, err := api.StorageVolLookupByName(ctx, pool, name)
	if isCode(err, libvirt.ErrNoStorageVol) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if _, err := claimable(ctx, api, pool, old, p.req.Name, p.host.Name); err != nil {
		return nil, err
	}
	si, err := readSeed(ctx, api, old)
	if err != nil {
		return nil, err
	}
	if !si.of(p.req.Name) {
		return nil, proxy.Permanentf("volume %s in pool %s on host %s exists and is not a seed the provider created for %s; it is left as it is: choose another external name, or remove it",
			name, pool.Name, p.host.Name, p.req.Name)
	}
	if si.foreign(p.req.Mark) {
		return nil, proxy.Permanentf("volumes %s and %s in pool %s on host %s belong to another resource (UID %s, installation %q), not UID %s of installation %q; refusing to take them over: choose another external name, or delete that resource (its deletion removes them)",
			overlayName(p.req.Name), name, pool.Name, p.host.Name, si.mark.UID, si.mark.InstallationID, p.req.Mark.UID, p.req.Mark.InstallationID)
	}
	return &old, nil
}

// writeSeed rebuilds the NoCloud seed and uploads it, in place of old
// (claimSeed) when there is one.
func (d *Driver) writeSeed(ctx context.Context, api Libvirt, pool libvirt.StoragePool, p *plan, old *libvirt.StorageVol) (libvirt.StorageVol, error) {
	iso, err := cloudinit.SeedISO(p.userData, p.metaData, d.cfg.VendorData)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	name := seedName(p.req.Name)
	if old != nil {
		if err := api.StorageVolDelete(ctx, *old); err != nil && !isCode(err, libvirt.ErrNoStorageVol) {
			return libvirt.StorageVol{}, err
		}
	}
	x, err := volumeXML(name, uint64(len(iso)), "raw", "", "")
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	d.logAbout(ctx, p.host.Name, p.req.Name).V(telemetry.VDetail).Info("kvm volume XML", "xml", x, "seedBytes", len(iso))
	v, err := api.StorageVolCreateXML(ctx, pool, x)
	if err != nil {
		return libvirt.StorageVol{}, err
	}
	if err := api.StorageVolUpload(withBudget(ctx, d.b.budgets.SeedUpload), v, bytes.NewReader(iso), uint64(len(iso))); err != nil {
		return libvirt.StorageVol{}, err
	}
	return v, nil
}

// startDomain starts dom; already running is success.
func startDomain(ctx context.Context, api Libvirt, dom libvirt.Domain) error {
	if err := api.DomainCreate(ctx, dom); err != nil && !isCode(err, libvirt.ErrOperationInvalid) {
		return err
	}
	return nil
}

// pending is a Create waiting for its base image in this process. Get and
// List report it (Provisioning, with the download's progress); once the
// image is there it finishes in the background. After a restart it is
// gone and the next Create starts over, which every step allows.
type pending struct {
	plan   *plan
	job    *imageJob
	d      *Driver
	cancel context.CancelFunc
	done   chan struct{}

	mu  sync.Mutex
	err error
}

func (pe *pending) view() proxy.Instance {
	progress := pe.job.progress()
	if done, err := pe.job.finished(); done && err == nil {
		progress = "image " + pe.job.image.label() + " downloaded; creating the domain"
	}
	return pe.d.provisioning(pe.plan, progress)
}

// failure is the error of pe's background work, or its config's refusal
// as soon as the download it waits for shows the image is above that
// config's limits: pe then stops waiting, and the download goes on for
// the others.
func (pe *pending) failure() error {
	pe.mu.Lock()
	defer pe.mu.Unlock()
	if pe.err == nil {
		if err := pe.job.refusal(pe.d.limits(), pe.plan.host.Name); err != nil {
			pe.err = pe.d.wrap(err, proxy.OpCreate)
			pe.cancel()
		}
	}
	return pe.err
}

func (b *Backend) pendingFor(key string) *pending {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.pending[key]
}

// pendingOn returns the pending creates on endpoint's host.
func (b *Backend) pendingOn(endpoint string) []*pending {
	b.mu.Lock()
	defer b.mu.Unlock()
	var out []*pending
	for k, pe := range b.pending {
		if strings.HasPrefix(k, endpoint+"/") {
			out = append(out, pe)
		}
	}
	return out
}

// addPending records p, the create of ctx, as waiting for job and starts
// its finisher on a background context of ctx: its lines carry the
// create's logger and instance scope, and its span kvm.create.finish is a
// child of the create's (linked to the download's when another create
// started that).
func (b *Backend) addPending(ctx context.Context, d *Driver, p *plan, job *imageJob) *pending {
	ctx, cancel := b.background(ctx)
	var links []trace.Link
	if job.span.IsValid() && job.span.TraceID() != trace.SpanContextFromContext(ctx).TraceID() {
		links = append(links, trace.Link{SpanContext: job.span})
	}
	pe := &pending{plan: p, job: job, d: d, cancel: cancel, done: make(chan struct{})}
	b.mu.Lock()
	b.pending[p.key()] = pe
	b.mu.Unlock()
	b.wg.Add(1)
	go func() {
		defer b.wg.Done()
		defer close(pe.done)
		defer cancel()
		select {
		case <-job.done:
		case <-ctx.Done():
			b.removePending(pe)
			return
		}
		fctx, span := b.tracer.Start(ctx, spanFinish, trace.WithLinks(links...),
			trace.WithAttributes(attribute.String(attrHost, p.host.Name), attribute.String(attrDomain, p.req.Name)))
		defer span.End()
		_, err := job.result(d.limits(), p.host.Name)
		if err == nil {
			err = d.finishPending(fctx, pe)
		}
		if ctx.Err() != nil {
			d.logAbout(fctx, p.host.Name, p.req.Name).V(1).Info("kvm background create stopped: the proxy is being deleted, or the provider is stopping")
			b.removePending(pe)
			return
		}
		if err != nil {
			pe.mu.Lock()
			pe.err = d.wrap(err, proxy.OpCreate)
			pe.mu.Unlock()
			span.SetStatus(codes.Error, telemetry.ErrorClass(pe.err))
			d.logAbout(fctx, p.host.Name, p.req.Name).Info("kvm background create failed", "error", err.Error())
			return // Get reports the error once, then forgets the pending create
		}
		b.removePending(pe)
	}()
	return pe
}

func (b *Backend) removePending(pe *pending) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.pending[pe.plan.key()] == pe {
		delete(b.pending, pe.plan.key())
	}
}

// finishPending is the rest of Create once the image is there, under the
// name's lock like any Create.
func (d *Driver) finishPending(ctx context.Context, pe *pending) error {
	p := pe.plan
	unlock, err := d.b.names.lock(ctx, p.key())
	if err != nil {
		return err
	}
	defer unlock()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	api, err := d.conn(ctx, p.host)
	if err != nil {
		return err
	}
	if _, err := api.DomainLookupByName(ctx, p.req.Name); err == nil {
		return nil // another Create finished it
	} else if !isCode(err, libvirt.ErrNoDomain) {
		return err
	}
	pool, err := api.StoragePoolLookupByName(ctx, p.host.pool())
	if err != nil {
		return err
	}
	if err := d.finish(ctx, api, pool, p); err != nil {
		return err
	}
	d.logAbout(ctx, p.host.Name, p.req.Name).V(1).Info("kvm domain defined and started")
	return nil
}
