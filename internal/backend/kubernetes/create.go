package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
	"github.com/egressproxy/provider-egressproxy/internal/telemetry"
)

// Create implements proxy.Driver: it creates the Deployment (the root,
// carrying the mark and the spec hash), then its Secret, NetworkPolicy,
// Service and PodDisruptionBudget, owned by it. It returns without waiting for the pod. An
// existing Deployment of the same name is adopted only when it carries
// this request's mark, and then completed; otherwise Create is Permanent.
//
// A child's name is read only when its create finds it taken: one that is
// this resource's is rewritten, anything else refuses the Create, and the
// Deployment just made goes again. Its pod never runs on a Secret that is
// not this resource's meanwhile (OwnerKey). A name once refused is read
// before anything is created on the next attempt (taken), so a refused
// resource retrying does not create and delete a Deployment each time.
func (d *Driver) Create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpCreate, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.create(ctx, req) })
}

func (d *Driver) create(ctx context.Context, req proxy.Request) (proxy.Instance, error) {
	if err := checkRequest(req); err != nil {
		return proxy.Instance{}, err
	}
	if err := d.cfg.validate(); err != nil {
		return proxy.Instance{}, err
	}
	nets, err := d.deniedNetworks(ctx, req)
	if err != nil {
		return proxy.Instance{}, err
	}
	files, err := squid.Render(req.Proxy, squidOptions(req, nets))
	if err != nil {
		return proxy.Instance{}, err
	}
	dep := d.buildDeployment(req, files, proxy.Hash(req))
	if lg := d.logger(ctx).V(telemetry.VDetail); lg.Enabled() {
		lg.Info("kubernetes create", "namespace", dep.Namespace, "name", dep.Name, "port", req.Proxy.Port, "allowedClientCIDRs", req.Proxy.AllowedClientCIDRs,
			"allowedPorts", req.Proxy.AllowedPorts, "auth", req.Proxy.Auth.Username != "", "deployment", curatedDeployment(dep))
	}
	key := client.ObjectKeyFromObject(dep)
	if d.taken.has(key) {
		if err := d.foreignChildren(ctx, req, dep.Namespace); err != nil {
			return proxy.Instance{}, err
		}
	}
	// From here a miss of the name in the cache may be this create's
	// Deployment, not yet delivered by the watch.
	d.gone.forget(key, true)
	err = d.client.Create(ctx, dep, client.FieldOwner(FieldOwner))
	switch {
	case err == nil:
		d.gone.answered(key, dep)
		d.logger(ctx).V(1).Info("created Deployment", "namespace", dep.Namespace, "name", dep.Name, "uid", req.Mark.UID)
		// A crash before the children exist leaves a Deployment whose pod
		// never starts: Get notices (missingChildren) and reports it out of
		// date, and Update completes it. A child whose write failed is
		// remembered (unfinished): the Deployment carries the spec hash
		// already, and a pod that serves without its NetworkPolicy would
		// otherwise read as up to date. What a restart forgets of it, the
		// orphan sweep's List finds (noteAbsent).
		if err := d.children(ctx, dep, req, files, nets, true); err != nil {
			if proxy.IsPermanent(err) {
				// A name taken by what is not ours: nothing of the proxy
				// stays (its children that were made go with it).
				d.taken.add(key)
				d.undo(ctx, dep)
			} else {
				d.unfinished.add(key)
			}
			return proxy.Instance{}, err
		}
		d.taken.drop(key)
		d.unfinished.drop(key)
		d.absent.drop(key)
		return d.view(ctx, dep, req.Proxy.ProxyCA())
	case kerrors.IsAlreadyExists(err):
		existing := &appsv1.Deployment{}
		if err := d.live.Get(ctx, key, existing); err != nil {
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
		return d.complete(ctx, existing, req, files, nets, true)
	case kerrors.IsNotFound(err):
		// The only thing a create can miss is the namespace.
		return proxy.Instance{}, plainly(proxy.ClassPermanent, "namespace %q does not exist in the target cluster: create it, or set spec.kubernetes.namespace of %s to one that does", dep.Namespace, d.provider)
	default:
		return proxy.Instance{}, &deploymentWriteError{verb: "create", key: key, err: err}
	}
}

// undo deletes dep, just created by this Create, in the background (its
// pod cannot have started: see OwnerKey); only that Deployment (its UID).
// A failure leaves it to the resource's deletion, as any of its objects.
func (d *Driver) undo(ctx context.Context, dep *appsv1.Deployment) {
	err := d.client.Delete(ctx, dep, client.PropagationPolicy(metav1.DeletePropagationBackground), client.Preconditions{UID: &dep.UID})
	if err != nil && !kerrors.IsNotFound(err) {
		d.logger(ctx).Info("cannot delete the Deployment of a refused Create; it goes with the resource", "namespace", dep.Namespace, "name", dep.Name, "error", err.Error())
		return
	}
	d.logger(ctx).V(1).Info("deleted the Deployment of a refused Create", "namespace", dep.Namespace, "name", dep.Name)
}

// children writes the Secret (first: pods of a changed template must find
// the new files), the NetworkPolicy (denying nets, the cluster networks
// squid.conf was rendered with: the outer fence never allows what Squid
// denies), the Service and the PodDisruptionBudget of dep. fresh says dep
// was created just now: the children are created without reading them
// first, and a name found taken is read then.
func (d *Driver) children(ctx context.Context, dep *appsv1.Deployment, req proxy.Request, files squid.Files, nets []string, fresh bool) error {
	writes := []func() error{
		func() error {
			if err := d.writeChild(ctx, dep, req.Mark, d.buildSecret(dep, req, files), &corev1.Secret{}, fresh); err != nil {
				return &secretWriteError{key: types.NamespacedName{Namespace: dep.Namespace, Name: dep.Name}, err: err}
			}
			return nil
		},
	}
	if d.cfg.NetworkPolicy {
		writes = append(writes, func() error {
			if err := d.writeChild(ctx, dep, req.Mark, buildNetworkPolicy(dep, req, nets), &networkingv1.NetworkPolicy{}, fresh); err != nil {
				return fmt.Errorf("cannot write NetworkPolicy %s/%s: %w", dep.Namespace, dep.Name, err)
			}
			return nil
		})
	}
	writes = append(writes, func() error { return d.ensureService(ctx, dep, req, fresh) })
	writes = append(writes, func() error { return d.ensureDisruptionBudget(ctx, dep, req, fresh) })
	if fresh {
		// A new Deployment's pod waits for its Secret whichever lands
		// first: the children are created at once, in parallel (a Create
		// holds its reconcile worker one round trip instead of three).
		return inParallel(writes...)
	}
	for _, w := range writes {
		if err := w(); err != nil {
			return err
		}
	}
	return nil
}

// inParallel runs fns at once and returns the first of their errors in
// the order given (so a message does not depend on which finished first).
func inParallel(fns ...func() error) error {
	errs := make([]error, len(fns))
	var wg sync.WaitGroup
	for i, fn := range fns {
		wg.Go(func() { errs[i] = fn() })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// foreignChildren refuses a request whose Secret, NetworkPolicy, Service
// or PodDisruptionBudget name is taken by an object that is not this resource's, before anything
// is created: an external name must never make the provider merge into,
// own or garbage-collect someone else's object. Create reads them first
// only for a name refused before (taken); otherwise their creates find it.
func (d *Driver) foreignChildren(ctx context.Context, req proxy.Request, namespace string) error {
	key := types.NamespacedName{Namespace: namespace, Name: req.Name}
	children := []client.Object{&corev1.Secret{}}
	if d.cfg.NetworkPolicy {
		children = append(children, &networkingv1.NetworkPolicy{})
	}
	if serviceType(req) != "" {
		children = append(children, &corev1.Service{})
	}
	if replicas(req) > 1 {
		children = append(children, &policyv1.PodDisruptionBudget{})
	}
	// The reads are independent: at once, in parallel.
	checks := make([]func() error, len(children))
	for i, obj := range children {
		checks[i] = func() error {
			err := d.live.Get(ctx, key, obj)
			switch {
			case kerrors.IsNotFound(err):
				return nil
			case err != nil:
				return fmt.Errorf("cannot get %s %s/%s: %w", kindOf(obj), key.Namespace, key.Name, err)
			}
			return childOwned(obj, nil, req.Mark)
		}
	}
	return inParallel(checks...)
}

// writeChild creates obj (a Secret, NetworkPolicy or Service of dep) when
// no object has its name, or rewrites the existing one when it is this
// resource's (its mark, and dep or nobody as its controller). Anything
// else is left exactly as it is: Permanent, naming it. The rewrite carries
// the UID and resourceVersion read, so an object replaced in between is
// never overwritten. empty is a zero object of obj's type, for the read.
// create says to create obj first, and read the name only when taken (a
// new Deployment's child, likely free).
func (d *Driver) writeChild(ctx context.Context, dep *appsv1.Deployment, mark proxy.Mark, obj, empty client.Object, create bool) error {
	key := client.ObjectKeyFromObject(obj)
	if create {
		if err := d.client.Create(ctx, obj, client.FieldOwner(FieldOwner)); !kerrors.IsAlreadyExists(err) {
			return err
		}
		// Taken: whose it is decides, as for any existing object.
	}
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
	case *policyv1.PodDisruptionBudget:
		next := existing.(*policyv1.PodDisruptionBudget).DeepCopy() //nolint:forcetypeassert // read into the same type.
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
		if w.Spec.IPFamilyPolicy != nil {
			if len(w.Spec.IPFamilies) > 0 && len(next.Spec.IPFamilies) > 0 && next.Spec.IPFamilies[0] != w.Spec.IPFamilies[0] {
				return nil, &familyMoved{svc: next, want: w.Spec.IPFamilies[0]}
			}
			next.Spec.IPFamilyPolicy = w.Spec.IPFamilyPolicy
			if len(w.Spec.IPFamilies) > 0 {
				next.Spec.IPFamilies = w.Spec.IPFamilies
			}
		}
		if w.Spec.Type == corev1.ServiceTypeClusterIP {
			next.Spec.AllocateLoadBalancerNodePorts = nil
			next.Spec.HealthCheckNodePort = 0
		}
		return next, nil
	}
	return nil, proxy.Permanentf("cannot write a %T", want)
}

// familyMoved is a Service whose first IP family is not the one wanted:
// the API server never changes it in place.
type familyMoved struct {
	svc  *corev1.Service
	want corev1.IPFamily
}

func (e *familyMoved) Error() string {
	return fmt.Sprintf("Service %s/%s serves %s first, not %s", e.svc.Namespace, e.svc.Name, e.svc.Spec.IPFamilies[0], e.want)
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
	case *policyv1.PodDisruptionBudget:
		return "PodDisruptionBudget"
	case *appsv1.ReplicaSet:
		return "ReplicaSet"
	case *corev1.Pod:
		return "Pod"
	}
	return fmt.Sprintf("%T", obj)
}

// complete brings dep (ours, not being deleted) and its children in line
// with req. force rewrites the children even when dep's hashes say they are
// current (a repeated Create may follow one that stopped half-way; Update
// is also called for a missing child). The Deployment is rewritten only
// when a hash differs or it does not say whether the config writes a
// NetworkPolicy (AnnotationNetworkPolicy), which changes no pod.
func (d *Driver) complete(ctx context.Context, dep *appsv1.Deployment, req proxy.Request, files squid.Files, nets []string, force bool) (proxy.Instance, error) {
	want := proxy.Hash(req)
	configHash := ConfigHash(files, req)
	specCurrent := dep.Annotations[AnnotationSpecHash] == want &&
		dep.Annotations[AnnotationTemplateHash] == d.cfg.templateHash() &&
		dep.Spec.Template.Annotations[AnnotationConfigHash] == configHash
	current := specCurrent && fenced(dep) == d.cfg.NetworkPolicy
	if current && !force {
		return d.view(ctx, dep, req.Proxy.ProxyCA())
	}
	if err := d.children(ctx, dep, req, files, nets, false); err != nil {
		return proxy.Instance{}, err
	}
	d.unfinished.drop(client.ObjectKeyFromObject(dep))
	d.absent.drop(client.ObjectKeyFromObject(dep))
	if current {
		return d.view(ctx, dep, req.Proxy.ProxyCA())
	}
	if specCurrent {
		return d.recordFence(ctx, dep, req)
	}
	// Read-modify-write of the whole spec, keeping what others added to the
	// metadata (the Deployment controller's revision annotation).
	desired := d.buildDeployment(req, files, want)
	next := dep.DeepCopy()
	next.TypeMeta = desired.TypeMeta
	next.Labels = merged(dep.Labels, desired.Labels)
	ann := desired.Annotations
	if c, ok := dep.Annotations[AnnotationCreatedAt]; ok {
		ann[AnnotationCreatedAt] = c
	}
	next.Annotations = merged(dep.Annotations, ann)
	next.OwnerReferences = withResourceOwner(dep.OwnerReferences, req.Mark.UID, desired.OwnerReferences)
	if serviceType(req) == "" {
		delete(next.Annotations, AnnotationService)
	}
	if !d.cfg.NetworkPolicy {
		delete(next.Annotations, AnnotationNetworkPolicy)
	}
	desired.Spec.Selector = dep.Spec.Selector // immutable
	next.Spec = desired.Spec
	next.Status = appsv1.DeploymentStatus{}
	if err := d.client.Update(ctx, next, client.FieldOwner(FieldOwner)); err != nil {
		return proxy.Instance{}, &deploymentWriteError{verb: "update", key: client.ObjectKeyFromObject(dep), err: err}
	}
	d.logger(ctx).V(1).Info("updated Deployment", "namespace", dep.Namespace, "name", dep.Name, "specHash", want, "configHash", configHash)
	return d.view(ctx, next, req.Proxy.ProxyCA())
}

// recordFence writes to dep, whose spec is current, only whether it was
// written with a NetworkPolicy (AnnotationNetworkPolicy), on the
// Deployment as the API server holds it (the cache's is stripped): its
// pod template, and what others added to it (kubectl rollout restart's
// annotation), stay and no pod rolls. An update, not a patch: patch is
// not among the verbs a config's identity is granted.
func (d *Driver) recordFence(ctx context.Context, dep *appsv1.Deployment, req proxy.Request) (proxy.Instance, error) {
	key := client.ObjectKeyFromObject(dep)
	cur := &appsv1.Deployment{}
	if err := d.live.Get(ctx, key, cur); err != nil {
		return proxy.Instance{}, fmt.Errorf("cannot get Deployment %s: %w", key, err)
	}
	if cur.UID != dep.UID {
		return proxy.Instance{}, proxy.Transientf("Deployment %s was replaced while it was read; it is read again", key)
	}
	if d.cfg.NetworkPolicy {
		cur.Annotations = merged(cur.Annotations, map[string]string{AnnotationNetworkPolicy: "true"})
	} else {
		delete(cur.Annotations, AnnotationNetworkPolicy)
	}
	if err := d.client.Update(ctx, cur, client.FieldOwner(FieldOwner)); err != nil {
		return proxy.Instance{}, &deploymentWriteError{verb: "update", key: key, err: err}
	}
	return d.view(ctx, cur, req.Proxy.ProxyCA())
}

// ensureService applies the Service req wants, or deletes the one it no
// longer wants.
func (d *Driver) ensureService(ctx context.Context, dep *appsv1.Deployment, req proxy.Request, fresh bool) error {
	switch t := serviceType(req); t {
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
		svc := buildService(dep, req)
		err := d.writeChild(ctx, dep, req.Mark, svc, &corev1.Service{}, fresh)
		var moved *familyMoved
		switch {
		case errors.As(err, &moved):
			// A Service's first family never changes, and its address of
			// the other family would admit every client of that family.
			if moved.svc.DeletionTimestamp == nil {
				if err := d.client.Delete(ctx, moved.svc, client.Preconditions{UID: &moved.svc.UID}); err != nil && !kerrors.IsNotFound(err) {
					return fmt.Errorf("cannot delete Service %s/%s to make it again in %s: %w", dep.Namespace, dep.Name, moved.want, err)
				}
			}
			return plainly(proxy.ClassTransient, "Service %s/%s serves %s first, and spec.forProvider.proxy.allowedClientCIDRs has ranges of %s only: it is deleted and made again in %s once gone (its load balancer's address changes)",
				dep.Namespace, dep.Name, moved.svc.Spec.IPFamilies[0], moved.want, moved.want)
		case kerrors.IsInvalid(err) && len(svc.Spec.IPFamilies) == 1:
			msg := fmt.Sprintf("the target cluster refused Service %s/%s, most likely for its IP family: it is asked for in %s only, the family of every range of spec.forProvider.proxy.allowedClientCIDRs, since a load balancer address of a family without ranges would admit every client of that family; add the clients' ranges of the cluster's family", dep.Namespace, dep.Name, svc.Spec.IPFamilies[0])
			if !d.quiet {
				msg += " (" + err.Error() + ")"
			}
			return plainly(proxy.ClassPermanent, "%s", msg)
		case err != nil:
			return fmt.Errorf("cannot write Service %s/%s: %w", dep.Namespace, dep.Name, err)
		}
		return nil
	default:
		return proxy.Permanentf("service type %q is not supported: want ClusterIP or LoadBalancer", t)
	}
}

// ensureDisruptionBudget writes the PodDisruptionBudget of a proxy of two
// or more replicas, or deletes the one of a proxy scaled down to one
// (dep still has the replicas it had: children are written before it).
// Only this proxy's own budget goes, as read.
func (d *Driver) ensureDisruptionBudget(ctx context.Context, dep *appsv1.Deployment, req proxy.Request, fresh bool) error {
	if pdb := buildDisruptionBudget(dep, req); pdb != nil {
		if err := d.writeChild(ctx, dep, req.Mark, pdb, &policyv1.PodDisruptionBudget{}, fresh); err != nil {
			return fmt.Errorf("cannot write PodDisruptionBudget %s/%s: %w", dep.Namespace, dep.Name, err)
		}
		return nil
	}
	if dep.Spec.Replicas == nil || *dep.Spec.Replicas < 2 {
		return nil // it never had one
	}
	pdb := &policyv1.PodDisruptionBudget{}
	err := d.live.Get(ctx, client.ObjectKeyFromObject(dep), pdb)
	switch {
	case kerrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("cannot get PodDisruptionBudget %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	if childOwned(pdb, dep, req.Mark) != nil {
		return nil // not ours: never deleted
	}
	if err := d.client.Delete(ctx, pdb, client.Preconditions{UID: &pdb.UID}); err != nil && !kerrors.IsNotFound(err) {
		return fmt.Errorf("cannot delete PodDisruptionBudget %s/%s: %w", dep.Namespace, dep.Name, err)
	}
	return nil
}

// checkRequest rejects what no object could be built from.
func checkRequest(req proxy.Request) error {
	switch {
	case !validName.MatchString(req.Name):
		return plainly(proxy.ClassPermanent, "invalid instance name %q: want a DNS label of at most 63 characters starting with a letter", req.Name)
	case req.Mark.UID == "" || req.Mark.InstallationID == "":
		return plainly(proxy.ClassPermanent, "request for %q carries no complete ownership mark", req.Name)
	case !labelValue.MatchString(req.Mark.UID) || !labelValue.MatchString(req.Mark.InstallationID):
		return plainly(proxy.ClassPermanent, "the ownership mark of %q is not valid as label values", req.Name)
	case req.Proxy.Port < 1 || req.Proxy.Port > 65535:
		return plainly(proxy.ClassPermanent, "port %d is out of range", req.Proxy.Port)
	case replicas(req) > MaxReplicas:
		return plainly(proxy.ClassPermanent, "spec.forProvider.replicas %d is out of range: want 1 to %d", replicas(req), MaxReplicas)
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

// curatedDeployment is what the log shows of a Deployment the driver
// creates: its shape, never a Secret's content (the htpasswd is in the
// Secret, which is not shown).
func curatedDeployment(dep *appsv1.Deployment) map[string]any {
	out := map[string]any{"labels": dep.Labels, "replicas": dep.Spec.Replicas}
	spec := dep.Spec.Template.Spec
	out["serviceAccountName"] = spec.ServiceAccountName
	var containers []string
	for _, c := range spec.Containers {
		containers = append(containers, fmt.Sprintf("%s image=%s requests=%v limits=%v", c.Name, c.Image, c.Resources.Requests, c.Resources.Limits))
	}
	out["containers"] = containers
	var volumes []string
	for _, v := range spec.Volumes {
		switch {
		case v.Secret != nil:
			volumes = append(volumes, v.Name+" secret="+v.Secret.SecretName)
		default:
			volumes = append(volumes, v.Name)
		}
	}
	out["volumes"] = volumes
	return out
}
