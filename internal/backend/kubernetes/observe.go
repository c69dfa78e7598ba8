package kubernetes

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Get implements proxy.Driver.
func (d *Driver) Get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	return proxy.Run(ctx, proxy.OpGet, d.wrap, func(ctx context.Context) (proxy.Instance, error) { return d.get(ctx, ref) })
}

func (d *Driver) get(ctx context.Context, ref proxy.Ref) (proxy.Instance, error) {
	dep, err := d.deployment(ctx, ref)
	if proxy.IsNotFound(err) && ref.Deleting {
		// Gone in the background (Delete): the resource waits for its pods.
		key, kerr := d.key(ref)
		if kerr != nil {
			return proxy.Instance{}, kerr
		}
		return d.podsLeft(ctx, key, ref)
	}
	if err != nil {
		return proxy.Instance{}, err
	}
	return d.view(ctx, dep, ref.ProxyCA)
}

// deployment reads the Deployment ref names: by ID (namespace/name) when
// it has one, else by name in the config's namespace. The cache holds only
// the Deployments the driver made and may lag a create by a moment, so a
// miss is confirmed with a live read when ref asks (an import, a resource
// being deleted), unless the watch saw it deleted and this driver has not
// created it since, and for a Deployment a driver created that the watch
// has not delivered yet (gone), unless its create was answered: that
// answer stands in for the cache. A miss is otherwise trusted: at worst
// Create finds the Deployment exists and adopts it, as it carries this
// resource's mark.
func (d *Driver) deployment(ctx context.Context, ref proxy.Ref) (*appsv1.Deployment, error) {
	key, err := d.key(ref)
	if err != nil {
		return nil, err
	}
	dep := &appsv1.Deployment{}
	err = d.client.Get(ctx, key, dep)
	if kerrors.IsNotFound(err) && d.cached() {
		if made := d.gone.asAnswered(key); made != nil {
			dep, err = made, nil
		} else if ref.Live && !d.gone.seen(key) || d.gone.unseen(key) {
			err = d.live.Get(ctx, key, dep)
		}
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

// view reads dep's pods (and Service) and reports the instance; ca is the
// proxy's CA when it listens with TLS (the probe verifies against it).
func (d *Driver) view(ctx context.Context, dep *appsv1.Deployment, ca string) (proxy.Instance, error) {
	if dep.Labels[LabelManagedBy] != ManagedBy || dep.Labels[LabelUID] == "" {
		// Not ours: its pods are not in the cache; report it as it is.
		return d.observe(dep, nil, nil).inst, nil
	}
	var pods []corev1.Pod
	if dep.DeletionTimestamp == nil {
		l := &corev1.PodList{}
		if err := d.podsOf(ctx, l, dep.Namespace, client.MatchingLabels{LabelName: dep.Labels[LabelName], LabelUID: dep.Labels[LabelUID]}); err != nil {
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
		if kerrors.IsNotFound(err) && d.cached() {
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
	if dep.DeletionTimestamp == nil {
		// Found so by the orphan sweep's List: read from what it listed,
		// not here, so that Get sends no request for them (a Secret
		// deleted while the pod serves is missed only by the next pod).
		for _, kind := range d.absent.of(client.ObjectKeyFromObject(dep)) {
			if kind != "NetworkPolicy" || d.cfg.NetworkPolicy {
				missing = append(missing, kind)
			}
		}
	}
	o := d.observe(dep, pods, svc)
	if o.probe == "" && dep.DeletionTimestamp == nil && !slices.Contains(missing, "Secret") && d.now().Sub(dep.CreationTimestamp.Time) > secretCheckAfter {
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
		o.inst.Progress = missingProgress(missing)
	} else if o.inst.SpecHash != "" && dep.DeletionTimestamp == nil && d.unfinished.has(client.ObjectKeyFromObject(dep)) {
		// Its Create failed to write a child (its NetworkPolicy, say):
		// Update writes them all.
		o.inst.SpecHash = childrenMissing
		o.inst.Progress = "the Secret, NetworkPolicy or Service of the proxy could not be created; they are written again"
	} else if o.inst.SpecHash != "" && dep.DeletionTimestamp == nil && fenced(dep) != d.cfg.NetworkPolicy {
		// Written before the Deployment said so, or by the config before
		// its networkPolicy changed: the sweep would look for the wrong
		// NetworkPolicy. Update writes the children and the annotation,
		// not the pod template.
		o.inst.SpecHash = childrenMissing
		o.inst.Progress = "the Deployment does not record whether the proxy has a NetworkPolicy as spec.kubernetes.networkPolicy sets it; it is written again with its children"
	}
	if target := d.probeTarget(o, svc, dep); target != "" {
		// The prober is every config's, and configs of one cluster may
		// read each other's pods; the UID leads (the binding's Notify).
		pr := d.prober.Check(ctx, d.guard.Reported(), dep.Labels[LabelUID]+"/"+o.probeKey+"/"+d.provider, target, squid.Expected(markOf(dep)), ca)
		o.inst.ProxyReachable = pr.Serving
		if pr.Serving {
			o.inst.ProxyAddress = target
			squid.NoteAnswer(&o.inst, pr)
		}
		if !pr.Serving && o.inst.Progress == "" {
			if pr.Refused {
				o.inst.Progress = pr.Message
			} else if pr.Pending {
				o.inst.Progress = "checking that the proxy answers on " + target
			} else {
				o.inst.Progress = "the proxy does not answer on " + target + ": " + pr.Message
			}
		}
		if pr.Serving && d.dialPods && len(o.serving) > 1 {
			o.inst.Replicas = servingReplicas(o.serving, portOf(dep))
		}
	} else if o.probe != "" {
		// A remote cluster's pod the provider cannot reach: its readiness
		// probe, a connect to the proxy port from its node, stands for the
		// check.
		o.inst.ProxyReachable = true
	}
	if o.inst.State == proxy.StateRunning && o.inst.ProxyAddress == "" && !o.previous {
		// A pod of the configuration before reports what its check saw
		// with those settings: not the current check's word.
		d.readReport(ctx, dep, &o.inst)
	}
	o.inst.ServingReplicas = seenOneAtATime(o.serving, o.inst.Replicas)
	return o.inst, nil
}

// seenOneAtATime is how many pods serve when there are several and the
// egress check does not go through each (replicas, the ones it does, is
// empty: a load balancer picks one, or one pod reports); else 0.
func seenOneAtATime(serving []*corev1.Pod, replicas []proxy.Replica) int {
	if len(serving) > 1 && len(replicas) == 0 {
		return len(serving)
	}
	return 0
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

// servingReplicas are the serving pods as the instance's replicas, each at its
// own address.
func servingReplicas(pods []*corev1.Pod, port int32) []proxy.Replica {
	out := make([]proxy.Replica, len(pods))
	for i, p := range pods {
		out[i] = proxy.Replica{Name: p.Name, Node: p.Spec.NodeName, ProxyAddress: net.JoinHostPort(p.Status.PodIP, formatPort(port))}
	}
	return out
}
