package kubernetes

import (
	"fmt"
	"net"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// observation is what Get learned from the objects, before the
// reachability check.
type observation struct {
	inst proxy.Instance
	// probe is the pod address (ip:port) to check for the proxy answering;
	// empty when no pod is serving.
	probe string
	// probeKey identifies the serving pod for the probe cache.
	probeKey string
	// serving are, for a proxy of several replicas, the pods that serve,
	// of any configuration (while a new one rolls out, the old pods still
	// send traffic from their addresses), sorted by name.
	serving []*corev1.Pod
	// previous says the serving pod runs a configuration before the
	// Deployment's (a rollout in progress): what it reports of its egress
	// check was made with those settings (another echo URL, maybe).
	previous bool
}

// observeFor maps a proxy's Deployment, its pods and its Service (nil when
// it has none) onto an Instance. templateHash is the Deployment template
// digest of the driver's current config.
//
//	Deployment being deleted                 Stopped, "being deleted"
//	Deployment scaled to zero                Stopped
//	a serving pod (below)                    Running, IP of the pod or Service
//	  ... Service without an address yet     Provisioning
//	pods pending, starting, not ready        Provisioning, with why
//	only pods in phase Unknown or a phase
//	  this driver does not know              Stopped
//	no pods (Failed ones are being replaced) Provisioning, with why
//
// A serving pod is Running, Ready, has an address and is not being deleted:
// a pod on its way out never reads as Running. Pods with the current
// configuration are preferred; while a new configuration rolls out, the old
// pod keeps serving and Progress says so. A proxy of several replicas is
// Running while one serves (the first by name is probed); Progress and the
// replicas detail say how many of them do.
//
// quiet is set for a tenant's cluster (a namespaced config's kubeconfig):
// Progress then holds the cluster's reasons (ImagePullBackOff,
// Unschedulable, an exit code), never its messages (see podProgress).
func observeFor(dep *appsv1.Deployment, pods []corev1.Pod, svc *corev1.Service, templateHash string, quiet bool) observation {
	inst := proxy.Instance{
		ID:        instanceID(dep.Namespace, dep.Name),
		Name:      dep.Name,
		Mark:      proxy.Mark{UID: dep.Labels[LabelUID], InstallationID: dep.Labels[LabelInstallation]},
		CreatedAt: createdAt(dep),
		SpecHash:  dep.Annotations[AnnotationSpecHash],
		Details:   map[string]string{"namespace": dep.Namespace, "deployment": dep.Name},
	}
	if name := dep.Labels[LabelName]; name != "" {
		inst.Name = name
	}
	if inst.SpecHash != "" && dep.Annotations[AnnotationTemplateHash] != templateHash {
		// The config (image, resources...) changed since the last write:
		// reading as out of date makes the controller call Update.
		inst.SpecHash += "+template-changed"
	}
	if svc != nil {
		inst.Details["service"] = svc.Name
	}

	switch {
	case dep.DeletionTimestamp != nil:
		inst.State, inst.Progress = proxy.StateStopped, "being deleted"
		return observation{inst: inst}
	case dep.Spec.Replicas != nil && *dep.Spec.Replicas == 0:
		inst.State, inst.Progress = proxy.StateStopped, "the Deployment is scaled to zero replicas"
		return observation{inst: inst}
	}

	want := dep.Spec.Template.Annotations[AnnotationConfigHash]
	var currents, olds []*corev1.Pod
	var waiting []string
	stopped, starting := 0, 0
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	for i := range pods {
		p := &pods[i]
		switch {
		case p.DeletionTimestamp != nil:
			continue
		case serving(p):
			if p.Annotations[AnnotationConfigHash] == want {
				currents = append(currents, p)
			} else {
				olds = append(olds, p)
			}
		case p.Status.Phase == corev1.PodPending || p.Status.Phase == corev1.PodRunning:
			if why := podProgress(p, quiet); why != "" {
				waiting = append(waiting, why)
			} else {
				starting++
			}
		case p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed:
			// Replaced by the ReplicaSet; nothing to report.
		default: // Unknown (its node is gone) or a phase we do not know
			stopped++
			phase := string(p.Status.Phase)
			if quiet && !reasonShape.MatchString(phase) {
				phase = "not shown to tenants"
			}
			waiting = append(waiting, fmt.Sprintf("pod %s is in phase %q", p.Name, phase))
		}
	}

	set := currents
	desired := int32(1)
	if dep.Spec.Replicas != nil {
		desired = *dep.Spec.Replicas
	}
	switch {
	case len(currents) == 0 && len(olds) > 0:
		set = olds
		inst.Progress = "rolling out a new configuration; the previous pod serves meanwhile"
		if len(waiting) > 0 {
			inst.Progress += ": " + waiting[0]
		}
	case len(currents) > 0 && len(currents) < int(desired) && len(olds) > 0:
		inst.Progress = fmt.Sprintf("rolling out a new configuration: %d of %d replicas have it", len(currents), desired)
	case len(currents) > 0 && len(currents) < int(desired):
		inst.Progress = fmt.Sprintf("%d of %d replicas serve", len(currents), desired)
		if len(waiting) > 0 {
			inst.Progress += ": " + waiting[0]
		}
	}
	if len(set) > 0 {
		pod := set[0]
		inst.Details["pod"] = pod.Name
		if desired > 1 {
			inst.Details["replicas"] = fmt.Sprintf("%d/%d", len(set), desired)
		}
		o := observation{
			inst:     inst,
			probe:    net.JoinHostPort(pod.Status.PodIP, formatPort(portOf(dep))),
			probeKey: string(pod.UID),
		}
		o.previous = len(currents) == 0
		if desired > 1 {
			o.serving = slices.SortedFunc(slices.Values(append(slices.Clone(currents), olds...)), func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
		}
		o.inst.State, o.inst.IP = proxy.StateRunning, pod.Status.PodIP
		if svc != nil {
			ip, why := serviceAddress(svc)
			if ip == "" {
				o.inst.State, o.inst.IP, o.inst.Progress = proxy.StateProvisioning, "", why
			} else {
				o.inst.IP = ip
				if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
					// In-cluster clients reach a ClusterIP Service by name,
					// which outlives a recreated Service's address; a load
					// balancer's address is for clients outside, where the
					// name does not resolve.
					o.inst.Host = svc.Name + "." + svc.Namespace + ".svc"
				}
			}
		}
		return o
	}

	switch {
	case stopped > 0 && stopped == len(waiting) && starting == 0:
		inst.State = proxy.StateStopped
	default:
		inst.State = proxy.StateProvisioning
	}
	switch {
	case len(waiting) > 0:
		inst.Progress = strings.Join(waiting, "; ")
	case replicaFailure(dep, quiet) != "":
		inst.Progress = replicaFailure(dep, quiet)
	default:
		inst.Progress = startingProgress
	}
	return observation{inst: inst}
}

// observe is observeFor a platform's cluster: its messages are quoted.
func observe(dep *appsv1.Deployment, pods []corev1.Pod, svc *corev1.Service, templateHash string) observation {
	return observeFor(dep, pods, svc, templateHash, false)
}

// observe is observeFor d's cluster: a tenant's (d.quiet) is never quoted.
func (d *Driver) observe(dep *appsv1.Deployment, pods []corev1.Pod, svc *corev1.Service) observation {
	return observeFor(dep, pods, svc, d.cfg.templateHash(), d.quiet)
}

// serving is a pod that can take traffic.
func serving(p *corev1.Pod) bool {
	return p.DeletionTimestamp == nil && p.Status.Phase == corev1.PodRunning && p.Status.PodIP != "" && podReady(p)
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// startingProgress is the progress of a proxy whose pod is on its way
// (being created, scheduled, pulled, started, probed): none, so the
// resource reads plain Creating. Reporting each step would be a status
// write of its own, for a thousand proxies at once, and says nothing a
// user acts on; what does (an unschedulable pod, an image that cannot be
// pulled, restarts, a quota) is reported.
const startingProgress = ""

// podProgress says why a pod is not serving yet when that is worth a
// user's attention (it cannot be scheduled, its image cannot be pulled,
// it keeps restarting); "" when it is on its way.
//
// For a tenant's cluster (quiet) it names the reasons and exit codes
// only: a condition's or a container's message, and a termination message
// (the tail of the container's log), are what that cluster answered and
// are never quoted. The reporting container's termination message is
// never quoted for any cluster: its log holds the answer of the echo
// endpoint the proxy's egress check names.
func podProgress(p *corev1.Pod, quiet bool) string {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return fmt.Sprintf("pod %s is not scheduled: %s", p.Name, said(c.Reason, c.Message, quiet))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil && w.Reason != "" && w.Reason != "ContainerCreating" {
			msg := fmt.Sprintf("pod %s: container %s is waiting: %s", p.Name, cs.Name, said(w.Reason, w.Message, quiet))
			// A crash loop says why in the last run's end: its exit code and
			// message (the tail of its log, by the pod's
			// FallbackToLogsOnError).
			if t := cs.LastTerminationState.Terminated; t != nil {
				msg += fmt.Sprintf("; last exit %d (%s)", t.ExitCode, reasonOf(t.Reason, quiet))
				if m := lastLines(t.Message, 5, 512); m != "" && !quiet && cs.Name != ReportContainerName {
					msg += ": " + m
				}
			}
			return msg
		}
		if t := cs.LastTerminationState.Terminated; t != nil && cs.RestartCount > 0 && !cs.Ready {
			return fmt.Sprintf("pod %s: container %s restarted %d times, last exit %d (%s)", p.Name, cs.Name, cs.RestartCount, t.ExitCode, reasonOf(t.Reason, quiet))
		}
	}
	return ""
}

// said is a cluster's reason and message, as it gave them; for a tenant's
// cluster (quiet) the reason alone.
func said(reason, message string, quiet bool) string {
	if quiet {
		return reasonOf(reason, quiet)
	}
	return strings.TrimSpace(reason + " " + message)
}

// reasonShape is what a Kubernetes reason looks like: one CamelCase word
// (ImagePullBackOff, Unschedulable, OOMKilled, FailedCreate).
var reasonShape = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9]{0,63}$`)

// reasonOf is a cluster's reason; for a tenant's cluster (quiet) only one
// shaped as a reason is: anything else stands in for a message.
func reasonOf(reason string, quiet bool) string {
	if quiet && reason != "" && !reasonShape.MatchString(reason) {
		return "a reason not shown to tenants"
	}
	return reason
}

// lastLines is the last n lines of s, on one line, at most max bytes (the
// end kept).
func lastLines(s string, n, max int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i := range lines {
		lines[i] = strings.TrimSpace(lines[i])
	}
	out := strings.Join(slices.DeleteFunc(lines, func(l string) bool { return l == "" }), " | ")
	if len(out) > max {
		out = "..." + out[len(out)-max:]
	}
	return out
}

// replicaFailure is the Deployment's ReplicaFailure condition (a pod the
// ReplicaSet could not create: a ResourceQuota, a LimitRange, an admission
// webhook), or "". For a tenant's cluster (quiet), its reason
// (FailedCreate), never its message (an admission webhook's words).
func replicaFailure(dep *appsv1.Deployment, quiet bool) string {
	for _, c := range dep.Status.Conditions {
		if c.Type == appsv1.DeploymentReplicaFailure && c.Status == corev1.ConditionTrue {
			what := c.Message
			if quiet {
				what = reasonOf(c.Reason, quiet)
			}
			msg := "cannot create the pod"
			if strings.Contains(c.Message, "exceeded quota") {
				msg += " (ResourceQuota)"
			}
			if what != "" {
				msg += ": " + what
			}
			return msg
		}
	}
	return ""
}

// serviceAddress is where clients reach the proxy through svc, or "" and why
// not yet.
func serviceAddress(svc *corev1.Service) (string, string) {
	switch svc.Spec.Type {
	case corev1.ServiceTypeLoadBalancer:
		for _, in := range svc.Status.LoadBalancer.Ingress {
			if in.IP != "" {
				return in.IP, ""
			}
			if in.Hostname != "" {
				return in.Hostname, ""
			}
		}
		return "", fmt.Sprintf("waiting for the load balancer of Service %s to get an address", svc.Name)
	default:
		if ip := svc.Spec.ClusterIP; ip != "" && ip != corev1.ClusterIPNone {
			return ip, ""
		}
		return "", fmt.Sprintf("Service %s has no cluster IP yet", svc.Name)
	}
}

// createdAt is the driver's created-at annotation, else the Deployment's
// creation time (for instances the driver did not create).
func createdAt(dep *appsv1.Deployment) time.Time {
	if t, err := time.Parse(time.RFC3339, dep.Annotations[AnnotationCreatedAt]); err == nil {
		return t
	}
	return dep.CreationTimestamp.UTC()
}

// listed is the cheap view List returns: identity, mark and creation time.
func listed(dep *appsv1.Deployment) proxy.Instance {
	name := dep.Labels[LabelName]
	if name == "" {
		name = dep.Name
	}
	return proxy.Instance{
		ID:        instanceID(dep.Namespace, dep.Name),
		Name:      name,
		Mark:      proxy.Mark{UID: dep.Labels[LabelUID], InstallationID: dep.Labels[LabelInstallation]},
		CreatedAt: createdAt(dep),
		SpecHash:  dep.Annotations[AnnotationSpecHash],
	}
}
