// Package kubernetes is the PodProxy backend: Squid as a Deployment of one
// replica in a Kubernetes cluster (the provider's own, or another one
// reached with a kubeconfig).
//
// Objects per proxy, all named after the instance, in the config's
// namespace, all labelled with the ownership mark (see Label*):
//
//	Deployment  the root: one replica of Squid, non-root, read-only root
//	            filesystem, no capabilities, RuntimeDefault seccomp
//	Secret      squid.conf and htpasswd, mounted into the pod;
//	            ownerReference to the Deployment
//	Service     optional (ClusterIP or LoadBalancer); ownerReference to the
//	            Deployment
//
// A Secret or Service of the name that is not this proxy's (no mark,
// another mark, another controller) is never written, owned or deleted:
// Create checks before the Deployment exists and fails naming it, and every
// later write refuses it the same way (writeChild).
//
// Deleting the Deployment in the foreground deletes the rest (the garbage
// collector follows the ownerReferences, blockOwnerDeletion on each), and
// the Deployment itself goes only once they are gone: Get never reports
// NotFound while anything of the proxy remains.
//
// The seam is controller-runtime's client.Client. For the provider's own
// cluster, reads go through the manager's cache (see CacheByObject), so
// Get costs no API request; a remote cluster is read directly.
package kubernetes

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// FieldOwner is the field manager of everything the driver writes.
const FieldOwner = "provider-egressproxy"

// secretCheckAfter is how long after its creation a Deployment without a
// serving pod has its Secret checked for.
const secretCheckAfter = 30 * time.Second

// childrenMissing is the SpecHash Get reports for a proxy missing its
// Secret or Service: it matches no request's hash.
const childrenMissing = "children-missing"

// Driver operations, as they appear in (*proxy.Error).Op.
const (
	opCreate = "create"
	opGet    = "get"
	opUpdate = "update"
	opDelete = "delete"
	opList   = "list"
)

// Options configure a Driver.
type Options struct {
	// Provider is the configured name of the backend (the ProviderConfig's,
	// such as "ClusterProviderConfig pods"); every error carries it.
	Provider string
	// Config is the kubernetes block of the ProviderConfig.
	Config Config
	// Client reads and writes. Its reads may be served by a cache that holds
	// the labelled objects (CacheByObject).
	Client client.Client
	// Live, when set, reads from the API server directly. Set it when
	// Client's reads are cached: Get falls back to it when the cache has no
	// Deployment (one just created, or one a human made without the
	// labels), and Create reads through it what it collides with.
	Live client.Reader
	// Version returns the API server's version, for Check.
	Version func(ctx context.Context) (string, error)
	// Host is the API server's address, for Check.
	Host string
	// Prober checks that the proxy answers; nil uses a Prober of its own.
	Prober *Prober
	// DialPods says the provider can reach pod addresses (it runs in the
	// target cluster): the proxy is checked at its pod's address. Otherwise
	// (a remote cluster) a LoadBalancer Service's address is checked, and
	// without one the pod's readiness probe, a TCP connect to the proxy
	// port from its node, stands for the check.
	DialPods bool
	// Log, when set, receives the driver's log lines; otherwise they go to
	// the logger in the call's context (controller-runtime puts the
	// reconcile's there).
	Log *logr.Logger
	// Now is the clock; default time.Now.
	Now func() time.Time
}

// Driver is the kubernetes proxy.Driver.
type Driver struct {
	provider string
	cfg      Config
	client   client.Client
	live     client.Reader
	version  func(ctx context.Context) (string, error)
	host     string
	prober   *Prober
	dialPods bool
	log      *logr.Logger
	now      func() time.Time
}

var _ proxy.Driver = (*Driver)(nil)

// New returns a driver for o.
func New(o Options) *Driver {
	d := &Driver{
		provider: o.Provider,
		cfg:      o.Config.withDefaults(),
		client:   o.Client,
		live:     o.Live,
		version:  o.Version,
		host:     o.Host,
		prober:   o.Prober,
		dialPods: o.DialPods,
		log:      o.Log,
		now:      o.Now,
	}
	if d.live == nil {
		d.live = o.Client
	}
	if d.prober == nil {
		d.prober = &Prober{}
	}
	if d.now == nil {
		d.now = time.Now
	}
	return d
}

func (d *Driver) logger(ctx context.Context) logr.Logger {
	if d.log != nil {
		return *d.log
	}
	return logr.FromContextOrDiscard(ctx).WithName("kubernetes")
}

// wrap classifies err and names the provider and the operation.
func (d *Driver) wrap(err error, op string) error {
	return proxy.WithContext(classify(err), d.provider, op)
}

// Create implements proxy.Driver: it creates the Deployment (the root,
// carrying the mark and the spec hash), then applies the Secret and the
// Service owned by it. It returns without waiting for the pod. An existing
// Deployment of the same name is adopted only when it carries this
// request's mark, and then completed; otherwise Create is Permanent.
func (d *Driver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	inst, err := d.create(ctx, req)
	return inst, d.wrap(proxy.MissingOnCreate(err), opCreate)
}

func (d *Driver) create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	if err := ctx.Err(); err != nil {
		return proxy.Instance{}, err
	}
	if err := checkRequest(req); err != nil {
		return proxy.Instance{}, err
	}
	files, err := squid.Render(req.Proxy, squidOptions(req, d.clusterNetworks(ctx)))
	if err != nil {
		return proxy.Instance{}, err
	}
	dep := buildDeployment(d.cfg, req, files, proxy.Hash(req), d.now())
	if err := d.foreignChildren(ctx, req, dep.Namespace); err != nil {
		return proxy.Instance{}, err
	}
	err = d.client.Create(ctx, dep, client.FieldOwner(FieldOwner))
	switch {
	case err == nil:
		d.logger(ctx).V(1).Info("created Deployment", "namespace", dep.Namespace, "name", dep.Name, "uid", req.Mark.UID)
		// A crash before the children exist leaves a Deployment whose pod
		// never starts: Get notices (missingChildren) and reports it out of
		// date, and Update completes it.
		if err := d.children(ctx, dep, req, files); err != nil {
			return proxy.Instance{}, err
		}
		return d.view(ctx, dep)
	case kerrors.IsAlreadyExists(err):
		existing := &appsv1.Deployment{}
		if err := d.live.Get(ctx, client.ObjectKeyFromObject(dep), existing); err != nil {
			if kerrors.IsNotFound(err) {
				return proxy.Instance{}, proxy.Transientf("Deployment %s/%s was deleted while being created; will retry", dep.Namespace, dep.Name)
			}
			return proxy.Instance{}, err
		}
		if err := adoptable(existing, req.Mark); err != nil {
			return proxy.Instance{}, err
		}
		if existing.DeletionTimestamp != nil {
			return proxy.Instance{}, proxy.Transientf("Deployment %s/%s is being deleted; it is created again once it is gone", dep.Namespace, dep.Name)
		}
		// Ours, from an earlier Create: finish what it may not have.
		return d.complete(ctx, existing, req, files, true)
	case kerrors.IsNotFound(err):
		// The only thing a create can miss is the namespace.
		return proxy.Instance{}, proxy.Permanentf("namespace %q does not exist in the target cluster: create it, or set spec.kubernetes.namespace of %s to one that does", dep.Namespace, d.provider)
	default:
		return proxy.Instance{}, fmt.Errorf("cannot create Deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
}

// children writes the Secret (first: pods of a changed template must find
// the new files) and the Service of dep.
func (d *Driver) children(ctx context.Context, dep *appsv1.Deployment, req proxy.Request, files squid.Files) error {
	if err := d.writeChild(ctx, dep, req.Mark, buildSecret(dep, req, files), &corev1.Secret{}); err != nil {
		return fmt.Errorf("cannot write Secret %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	if d.cfg.NetworkPolicy {
		if err := d.writeChild(ctx, dep, req.Mark, buildNetworkPolicy(dep, req, d.clusterNetworks(ctx)), &networkingv1.NetworkPolicy{}); err != nil {
			return fmt.Errorf("cannot write NetworkPolicy %s/%s: %w", dep.Namespace, dep.Name, err)
		}
	}
	return d.ensureService(ctx, dep, req)
}

// foreignChildren refuses a request whose Secret or Service name is taken
// by an object that is not this resource's, before anything is created:
// an external name must never make the provider merge into, own or
// garbage-collect someone else's object.
func (d *Driver) foreignChildren(ctx context.Context, req proxy.Request, namespace string) error {
	key := types.NamespacedName{Namespace: namespace, Name: req.Name}
	children := []client.Object{&corev1.Secret{}}
	if d.cfg.NetworkPolicy {
		children = append(children, &networkingv1.NetworkPolicy{})
	}
	if req.Exposure.ServiceType != "" {
		children = append(children, &corev1.Service{})
	}
	for _, obj := range children {
		err := d.live.Get(ctx, key, obj)
		switch {
		case kerrors.IsNotFound(err):
			continue
		case err != nil:
			return fmt.Errorf("cannot get %s %s/%s: %w", kindOf(obj), key.Namespace, key.Name, err)
		}
		if err := childOwned(obj, nil, req.Mark); err != nil {
			return err
		}
	}
	return nil
}

// writeChild creates obj (a Secret or Service of dep) when no object has its
// name, or rewrites the existing one when it is this resource's (its mark,
// and dep or nobody as its controller). Anything else is left exactly as it
// is: Permanent, naming it. The rewrite carries the UID and resourceVersion
// read, so an object replaced in between is never overwritten. empty is a
// zero object of obj's type, for the read.
func (d *Driver) writeChild(ctx context.Context, dep *appsv1.Deployment, mark proxy.Mark, obj, empty client.Object) error {
	key := client.ObjectKeyFromObject(obj)
	existing := empty
	err := d.live.Get(ctx, key, existing)
	switch {
	case kerrors.IsNotFound(err):
		err := d.client.Create(ctx, obj, client.FieldOwner(FieldOwner))
		if kerrors.IsAlreadyExists(err) {
			return proxy.Transientf("%s %s/%s appeared while being created; it is checked again", kindOf(obj), key.Namespace, key.Name)
		}
		return err
	case err != nil:
		return err
	}
	if err := childOwned(existing, dep, mark); err != nil {
		return err
	}
	next, err := rewritten(existing, obj)
	if err != nil {
		return err
	}
	if err := d.client.Update(ctx, next, client.FieldOwner(FieldOwner)); err != nil {
		if kerrors.IsConflict(err) {
			return proxy.Transientf("%s %s/%s changed while being written; will retry", kindOf(obj), key.Namespace, key.Name)
		}
		return err
	}
	return nil
}

// childOwned refuses an existing child that is not mark's: without the
// mark's labels, or controlled by anything but dep (nil: by anything).
func childOwned(obj client.Object, dep *appsv1.Deployment, mark proxy.Mark) error {
	l := obj.GetLabels()
	got := proxy.Mark{UID: l[LabelUID], InstallationID: l[LabelInstallation]}
	what := fmt.Sprintf("%s %s/%s", kindOf(obj), obj.GetNamespace(), obj.GetName())
	switch {
	case l[LabelManagedBy] != ManagedBy || got.UID == "":
		return proxy.Permanentf("%s exists and was not created by provider-egressproxy for this proxy; it is left as it is: choose another external name, or remove it", what)
	case got != mark:
		return proxy.Permanentf("%s belongs to another resource (UID %s, installation %q); it is left as it is: choose another external name", what, got.UID, got.InstallationID)
	}
	if c := metav1.GetControllerOf(obj); c != nil {
		mine := c.Kind == "Deployment" && c.Name == obj.GetName() && (dep == nil || c.UID == dep.UID)
		if !mine {
			return proxy.Permanentf("%s is controlled by %s %s, not by this proxy's Deployment; it is left as it is", what, c.Kind, c.Name)
		}
	}
	return nil
}

// rewritten is existing with what the driver sets taken from want: labels
// and annotations merged (others' stay), ownerReferences, and the data or
// spec; the UID and resourceVersion stay existing's, as preconditions.
func rewritten(existing, want client.Object) (client.Object, error) {
	meta := func(next client.Object) {
		next.SetLabels(merged(existing.GetLabels(), want.GetLabels()))
		next.SetOwnerReferences(want.GetOwnerReferences())
	}
	switch w := want.(type) {
	case *networkingv1.NetworkPolicy:
		next := existing.(*networkingv1.NetworkPolicy).DeepCopy() //nolint:forcetypeassert // read into the same type.
		meta(next)
		next.Spec = w.Spec
		return next, nil
	case *corev1.Secret:
		next := existing.(*corev1.Secret).DeepCopy() //nolint:forcetypeassert // read into the same type.
		meta(next)
		next.Type, next.Data, next.StringData = w.Type, w.Data, nil
		return next, nil
	case *corev1.Service:
		next := existing.(*corev1.Service).DeepCopy() //nolint:forcetypeassert // read into the same type.
		meta(next)
		nodePorts := map[string]int32{}
		for _, p := range next.Spec.Ports {
			nodePorts[p.Name] = p.NodePort
		}
		ports := slices.Clone(w.Spec.Ports)
		if w.Spec.Type != corev1.ServiceTypeClusterIP {
			for i := range ports {
				ports[i].NodePort = nodePorts[ports[i].Name]
			}
		}
		next.Spec.Type = w.Spec.Type
		next.Spec.Selector = w.Spec.Selector
		next.Spec.Ports = ports
		next.Spec.ExternalTrafficPolicy = w.Spec.ExternalTrafficPolicy
		next.Spec.LoadBalancerSourceRanges = w.Spec.LoadBalancerSourceRanges
		if w.Spec.Type == corev1.ServiceTypeClusterIP {
			next.Spec.AllocateLoadBalancerNodePorts = nil
			next.Spec.HealthCheckNodePort = 0
		}
		return next, nil
	}
	return nil, proxy.Permanentf("cannot write a %T", want)
}

// kindOf names obj's kind for messages.
func kindOf(obj client.Object) string {
	switch obj.(type) {
	case *corev1.Secret:
		return "Secret"
	case *corev1.Service:
		return "Service"
	case *appsv1.Deployment:
		return "Deployment"
	case *networkingv1.NetworkPolicy:
		return "NetworkPolicy"
	}
	return fmt.Sprintf("%T", obj)
}

// complete brings dep (ours, not being deleted) and its children in line
// with req. force rewrites the children even when dep's hashes say they are
// current (a repeated Create may follow one that stopped half-way; Update
// is also called for a missing child). The Deployment is rewritten only
// when a hash differs.
func (d *Driver) complete(ctx context.Context, dep *appsv1.Deployment, req proxy.Request, files squid.Files, force bool) (proxy.Instance, error) {
	want := proxy.Hash(req)
	configHash := squid.Hash(files)
	current := dep.Annotations[AnnotationSpecHash] == want &&
		dep.Annotations[AnnotationTemplateHash] == d.cfg.templateHash() &&
		dep.Spec.Template.Annotations[AnnotationConfigHash] == configHash
	if current && !force {
		return d.view(ctx, dep)
	}
	if err := d.children(ctx, dep, req, files); err != nil {
		return proxy.Instance{}, err
	}
	if current {
		return d.view(ctx, dep)
	}
	// Read-modify-write of the whole spec, keeping what others added to the
	// metadata (the Deployment controller's revision annotation).
	desired := buildDeployment(d.cfg, req, files, want, d.now())
	next := dep.DeepCopy()
	next.TypeMeta = desired.TypeMeta
	next.Labels = merged(dep.Labels, desired.Labels)
	ann := desired.Annotations
	if c, ok := dep.Annotations[AnnotationCreatedAt]; ok {
		ann[AnnotationCreatedAt] = c
	}
	next.Annotations = merged(dep.Annotations, ann)
	if req.Exposure.ServiceType == "" {
		delete(next.Annotations, AnnotationService)
	}
	desired.Spec.Selector = dep.Spec.Selector // immutable
	next.Spec = desired.Spec
	next.Status = appsv1.DeploymentStatus{}
	if err := d.client.Update(ctx, next, client.FieldOwner(FieldOwner)); err != nil {
		return proxy.Instance{}, fmt.Errorf("cannot update Deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	d.logger(ctx).V(1).Info("updated Deployment", "namespace", dep.Namespace, "name", dep.Name, "specHash", want, "configHash", configHash)
	return d.view(ctx, next)
}

// ensureService applies the Service req wants, or deletes the one it no
// longer wants.
func (d *Driver) ensureService(ctx context.Context, dep *appsv1.Deployment, req proxy.Request) error {
	switch t := req.Exposure.ServiceType; t {
	case "":
		if _, had := dep.Annotations[AnnotationService]; !had {
			return nil
		}
		// Only this proxy's own Service goes, and only the one read.
		svc := &corev1.Service{}
		err := d.live.Get(ctx, client.ObjectKeyFromObject(dep), svc)
		switch {
		case kerrors.IsNotFound(err):
			return nil
		case err != nil:
			return fmt.Errorf("cannot get Service %s/%s: %w", dep.Namespace, dep.Name, err)
		}
		if err := childOwned(svc, dep, req.Mark); err != nil {
			return nil // not ours: never deleted; nothing of ours to remove
		}
		if err := d.client.Delete(ctx, svc, client.Preconditions{UID: &svc.UID}); err != nil && !kerrors.IsNotFound(err) {
			return fmt.Errorf("cannot delete Service %s/%s: %w", dep.Namespace, dep.Name, err)
		}
		return nil
	case string(corev1.ServiceTypeClusterIP), string(corev1.ServiceTypeLoadBalancer):
		if err := d.writeChild(ctx, dep, req.Mark, buildService(dep, req), &corev1.Service{}); err != nil {
			return fmt.Errorf("cannot write Service %s/%s: %w", dep.Namespace, dep.Name, err)
		}
		return nil
	default:
		return proxy.Permanentf("service type %q is not supported: want ClusterIP or LoadBalancer", t)
	}
}

// Get implements proxy.Driver.
func (d *Driver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	inst, err := d.get(ctx, ref)
	return inst, d.wrap(err, opGet)
}

func (d *Driver) get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	if err := ctx.Err(); err != nil {
		return proxy.Instance{}, err
	}
	dep, err := d.deployment(ctx, ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	return d.view(ctx, dep)
}

// deployment reads the Deployment ref names: by ID (namespace/name) when
// it has one, else by name in the config's namespace. The cache holds only
// the Deployments the driver made and may lag a create by a moment, so a
// miss is confirmed with a live read when ref asks (an import, a resource
// being deleted). A miss is otherwise trusted: at worst Create finds the
// Deployment exists and adopts it, as it carries this resource's mark.
func (d *Driver) deployment(ctx context.Context, ref proxy.Ref) (*appsv1.Deployment, error) {
	key, err := d.key(ref)
	if err != nil {
		return nil, err
	}
	dep := &appsv1.Deployment{}
	err = d.client.Get(ctx, key, dep)
	if kerrors.IsNotFound(err) && ref.Live && d.live != client.Reader(d.client) {
		err = d.live.Get(ctx, key, dep)
	}
	if kerrors.IsNotFound(err) {
		return nil, proxy.NotFoundf("Deployment %s/%s not found", key.Namespace, key.Name)
	}
	if err != nil {
		return nil, fmt.Errorf("cannot get Deployment %s/%s: %w", key.Namespace, key.Name, err)
	}
	return dep, nil
}

// key is where ref's Deployment lives.
func (d *Driver) key(ref proxy.Ref) (types.NamespacedName, error) {
	if ref.ID == "" {
		if !validName.MatchString(ref.Name) {
			return types.NamespacedName{}, proxy.Permanentf("invalid instance name %q", ref.Name)
		}
		return types.NamespacedName{Namespace: d.cfg.Namespace, Name: ref.Name}, nil
	}
	ns, name, ok := strings.Cut(ref.ID, "/")
	if !ok || !dnsLabel.MatchString(ns) || !validName.MatchString(name) {
		return types.NamespacedName{}, proxy.Permanentf("malformed instance ID %q: want <namespace>/<name>", ref.ID)
	}
	return types.NamespacedName{Namespace: ns, Name: name}, nil
}

// view reads dep's pods (and Service) and reports the instance.
func (d *Driver) view(ctx context.Context, dep *appsv1.Deployment) (proxy.Instance, error) {
	if dep.Labels[LabelManagedBy] != ManagedBy || dep.Labels[LabelUID] == "" {
		// Not ours: its pods are not in the cache; report it as it is.
		return observe(dep, nil, nil, d.cfg.templateHash()).inst, nil
	}
	var pods []corev1.Pod
	if dep.DeletionTimestamp == nil {
		l := &corev1.PodList{}
		if err := d.client.List(ctx, l, client.InNamespace(dep.Namespace),
			client.MatchingLabels{LabelName: dep.Labels[LabelName], LabelUID: dep.Labels[LabelUID]}); err != nil {
			return proxy.Instance{}, fmt.Errorf("cannot list the pods of %s/%s: %w", dep.Namespace, dep.Name, err)
		}
		pods = l.Items
	}
	var svc *corev1.Service
	var missing []string
	if t := dep.Annotations[AnnotationService]; t != "" && dep.DeletionTimestamp == nil {
		s := &corev1.Service{}
		key := client.ObjectKeyFromObject(dep)
		err := d.client.Get(ctx, key, s)
		if kerrors.IsNotFound(err) && d.live != client.Reader(d.client) {
			err = d.live.Get(ctx, key, s)
		}
		switch {
		case err == nil && childOwned(s, dep, markOf(dep)) == nil:
			svc = s
		case err == nil || kerrors.IsNotFound(err):
			// Missing, or another's of the same name (whose address is not
			// the proxy's).
			// Wanted but missing: no address until Update brings it back.
			svc = &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: dep.Name}, Spec: corev1.ServiceSpec{Type: corev1.ServiceType(t)}}
			missing = append(missing, "Service")
		default:
			return proxy.Instance{}, fmt.Errorf("cannot get Service %s/%s: %w", dep.Namespace, dep.Name, err)
		}
	}
	o := observe(dep, pods, svc, d.cfg.templateHash())
	if o.probe == "" && dep.DeletionTimestamp == nil && d.now().Sub(dep.CreationTimestamp.Time) > secretCheckAfter {
		// No pod serves long after creation: a Secret that was never
		// created (a crash right after the Deployment) or was deleted keeps
		// it from starting. One read, only for a proxy in this state.
		err := d.live.Get(ctx, client.ObjectKeyFromObject(dep), &corev1.Secret{})
		switch {
		case kerrors.IsNotFound(err):
			missing = append(missing, "Secret")
		case err != nil:
			return proxy.Instance{}, fmt.Errorf("cannot get Secret %s/%s: %w", dep.Namespace, dep.Name, err)
		}
	}
	if len(missing) > 0 && o.inst.SpecHash != "" {
		// Out of date whatever the hashes say: the controller calls Update,
		// which creates them again.
		o.inst.SpecHash = childrenMissing
		o.inst.Progress = fmt.Sprintf("the %s of the proxy is missing; it is created again", strings.Join(missing, " and "))
	}
	if target := d.probeTarget(o, svc, dep); target != "" {
		ok, pending := d.prober.Reachable(ctx, dep.Labels[LabelUID]+"/"+o.probeKey, target)
		o.inst.ProxyReachable = ok
		if !ok && o.inst.Progress == "" {
			if pending {
				o.inst.Progress = "checking that the proxy answers on " + target
			} else {
				o.inst.Progress = "the proxy does not answer on " + target
			}
		}
	} else if o.probe != "" {
		// A serving pod's readiness probe connected to the proxy port.
		o.inst.ProxyReachable = true
	}
	return o.inst, nil
}

// probeTarget is the address to check that the proxy answers on, or ""
// when its pod's readiness stands for the check (see Options.DialPods) or
// no pod serves.
func (d *Driver) probeTarget(o observation, svc *corev1.Service, dep *appsv1.Deployment) string {
	switch {
	case o.probe == "":
		return ""
	case d.dialPods:
		return o.probe
	case svc != nil && svc.Spec.Type == corev1.ServiceTypeLoadBalancer && o.inst.IP != "":
		return net.JoinHostPort(o.inst.IP, formatPort(portOf(dep)))
	}
	return ""
}

// Update implements proxy.Driver: every setting changes in place. A changed
// squid.conf or htpasswd changes the pod template's config hash, which
// rolls the pod (the new one first).
func (d *Driver) Update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	inst, err := d.update(ctx, ref, req)
	return inst, d.wrap(err, opUpdate)
}

func (d *Driver) update(ctx context.Context, ref proxy.Ref, req proxy.Request) (proxy.Instance, error) {
	if err := ctx.Err(); err != nil {
		return proxy.Instance{}, err
	}
	dep, err := d.deployment(ctx, ref)
	if err != nil {
		return proxy.Instance{}, err
	}
	if err := owned(dep, req.Mark, "update"); err != nil {
		return proxy.Instance{}, err
	}
	if dep.DeletionTimestamp != nil {
		return proxy.Instance{}, proxy.Transientf("Deployment %s/%s is being deleted", dep.Namespace, dep.Name)
	}
	req.Name = dep.Name // the objects are named after the Deployment
	files, err := squid.Render(req.Proxy, squidOptions(req, d.clusterNetworks(ctx)))
	if err != nil {
		return proxy.Instance{}, err
	}
	// Get reports a proxy with a missing child as out of date: Update
	// rewrites the children whatever the hashes say.
	return d.complete(ctx, dep, req, files, true)
}

// Delete implements proxy.Driver: it deletes the Deployment in the
// foreground, so the garbage collector removes the pods, the Secret and
// the Service before the Deployment itself goes. It returns at once.
func (d *Driver) Delete(ctx context.Context, ref proxy.Ref) error {
	return d.wrap(d.delete(ctx, ref), opDelete)
}

func (d *Driver) delete(ctx context.Context, ref proxy.Ref) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	dep, err := d.deployment(ctx, ref)
	switch {
	case proxy.IsNotFound(err):
		return nil
	case err != nil:
		return err
	case dep.DeletionTimestamp != nil:
		return nil // on its way
	}
	if err := owned(dep, ref.Mark, "delete"); err != nil {
		return err
	}
	err = d.client.Delete(ctx, dep,
		client.PropagationPolicy(metav1.DeletePropagationForeground),
		// Never delete a Deployment of the same name made since the read.
		client.Preconditions{UID: &dep.UID})
	if err != nil && !kerrors.IsNotFound(err) {
		if kerrors.IsConflict(err) {
			return proxy.Transientf("Deployment %s/%s changed while being deleted; will retry", dep.Namespace, dep.Name)
		}
		return fmt.Errorf("cannot delete Deployment %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	d.logger(ctx).V(1).Info("deleted Deployment", "namespace", dep.Namespace, "name", dep.Name)
	return nil
}

// List implements proxy.Driver: the Deployments in the config's namespace
// carrying installationID's mark.
func (d *Driver) List(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	l, err := d.list(ctx, installationID)
	return l, d.wrap(err, opList)
}

func (d *Driver) list(ctx context.Context, installationID string) ([]proxy.Instance, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if installationID == "" {
		return nil, proxy.Permanentf("empty installation ID")
	}
	if !labelValue.MatchString(installationID) {
		return nil, proxy.Permanentf("installation ID %q is not a valid label value", installationID)
	}
	l := &appsv1.DeploymentList{}
	if err := d.client.List(ctx, l, client.InNamespace(d.cfg.Namespace),
		client.MatchingLabels{LabelManagedBy: ManagedBy, LabelInstallation: installationID}); err != nil {
		return nil, fmt.Errorf("cannot list Deployments in %s: %w", d.cfg.Namespace, err)
	}
	out := make([]proxy.Instance, 0, len(l.Items))
	for i := range l.Items {
		if l.Items[i].Labels[LabelUID] == "" {
			continue
		}
		out = append(out, listed(&l.Items[i]))
	}
	return out, nil
}

// checkRequest rejects what no object could be built from.
func checkRequest(req proxy.Request) error {
	switch {
	case !validName.MatchString(req.Name):
		return proxy.Permanentf("invalid instance name %q: want a DNS label of at most 63 characters starting with a letter", req.Name)
	case req.Mark.UID == "" || req.Mark.InstallationID == "":
		return proxy.Permanentf("request for %q carries no complete ownership mark", req.Name)
	case !labelValue.MatchString(req.Mark.UID) || !labelValue.MatchString(req.Mark.InstallationID):
		return proxy.Permanentf("the ownership mark of %q is not valid as label values", req.Name)
	case req.Proxy.Port < 1 || req.Proxy.Port > 65535:
		return proxy.Permanentf("port %d is out of range", req.Proxy.Port)
	}
	return nil
}

// adoptable refuses an existing Deployment that is not this request's.
func adoptable(dep *appsv1.Deployment, m proxy.Mark) error {
	got := proxy.Mark{UID: dep.Labels[LabelUID], InstallationID: dep.Labels[LabelInstallation]}
	switch {
	case got.UID == "" || dep.Labels[LabelManagedBy] != ManagedBy:
		return proxy.Permanentf("Deployment %s/%s exists and carries no ownership mark of provider-egressproxy; refusing to adopt it", dep.Namespace, dep.Name)
	case got != m:
		return proxy.Permanentf("Deployment %s/%s belongs to another resource (UID %s, installation %q); refusing to adopt it", dep.Namespace, dep.Name, got.UID, got.InstallationID)
	}
	return nil
}

// owned refuses to act on a Deployment without our mark, or with another
// resource's mark (UID or installation) when the caller knows its own.
func owned(dep *appsv1.Deployment, m proxy.Mark, verb string) error {
	got := markOf(dep)
	switch {
	case got.UID == "" || dep.Labels[LabelManagedBy] != ManagedBy:
		return proxy.Permanentf("Deployment %s/%s carries no ownership mark of provider-egressproxy; refusing to %s it", dep.Namespace, dep.Name, verb)
	case m.UID != "" && got != m:
		return proxy.Permanentf("Deployment %s/%s belongs to another resource (UID %s, installation %q); refusing to %s it", dep.Namespace, dep.Name, got.UID, got.InstallationID, verb)
	}
	return nil
}

// markOf is the ownership mark dep carries.
func markOf(dep *appsv1.Deployment) proxy.Mark {
	return proxy.Mark{UID: dep.Labels[LabelUID], InstallationID: dep.Labels[LabelInstallation]}
}

func merged(base, over map[string]string) map[string]string {
	out := maps.Clone(base)
	if out == nil {
		out = map[string]string{}
	}
	maps.Copy(out, over)
	return out
}
