package kubernetes

import (
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
)

// PodDigest is what Get reads of a pod: a watch that passes only updates
// changing it reconciles a proxy exactly when Get would see news.
func PodDigest(p *corev1.Pod) string {
	var b strings.Builder
	b.WriteString(string(p.Status.Phase))
	b.WriteString("|" + p.Status.PodIP)
	if p.DeletionTimestamp != nil {
		b.WriteString("|deleting")
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady || c.Type == corev1.PodScheduled {
			b.WriteString("|" + string(c.Type) + "=" + string(c.Status) + ":" + c.Reason)
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		if w := cs.State.Waiting; w != nil {
			b.WriteString("|" + cs.Name + ":" + w.Reason)
		}
	}
	return b.String()
}

// DeploymentDigest is what Get reads of a Deployment besides its pods.
func DeploymentDigest(d *appsv1.Deployment) string {
	var b strings.Builder
	if d.DeletionTimestamp != nil {
		b.WriteString("deleting")
	}
	if d.Spec.Replicas != nil && *d.Spec.Replicas == 0 {
		b.WriteString("|zero")
	}
	for _, c := range d.Status.Conditions {
		if c.Type == appsv1.DeploymentReplicaFailure {
			b.WriteString("|" + string(c.Status) + ":" + c.Message)
		}
	}
	return b.String()
}

// ServiceDigest is what Get reads of a Service.
func ServiceDigest(s *corev1.Service) string {
	var b strings.Builder
	b.WriteString(s.Spec.ClusterIP)
	for _, in := range s.Status.LoadBalancer.Ingress {
		b.WriteString("|" + in.IP + in.Hostname)
	}
	return b.String()
}
