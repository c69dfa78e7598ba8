package kubernetes

import (
	"context"
	"strconv"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// The egress check from inside the pod (docs/allow-listing.md): where the
// provider cannot reach a proxy (a remote cluster's pod without a
// LoadBalancer), a second container of the same image sends the check
// through the pod's own Squid on loopback and prints its answer as one
// line to its log, which the driver reads back with the pod log
// subresource (pods/log get: read-only, the least the channel needs).
const (
	// ReportContainerName is the reporting container's name.
	ReportContainerName = "egress-check"
	// KeyEgressCheck is the Secret's key holding the check's request (with
	// the check's credential), mounted into the reporting container only.
	KeyEgressCheck = "egress-check"
	// ReportMountPath is where the reporting container finds it.
	ReportMountPath = "/etc/egressproxy-check"
	// reportInterval is how often the pod checks again after an answer
	// (seconds). A new pod (another node, a new address) checks at once.
	reportInterval = 3600
	// reportLogTail is how many of the container's last lines are read.
	reportLogTail = 5
)

// PodLogFunc reads the tail of a container's log, with the kubelet's
// timestamps, at most limitBytes.
type PodLogFunc func(ctx context.Context, namespace, pod, container string, tailLines, limitBytes int64) ([]byte, error)

// reportPermissions is what the reports need besides Permissions: the
// pod log of a cluster whose pods the provider does not reach, when the
// config names a check.
func (d *Driver) reportPermissions() []Permission {
	if !d.cfg.EgressCheck || d.dialPods {
		return nil
	}
	return []Permission{{Resource: "pods/log", Verb: "get", Namespace: d.cfg.Namespace}}
}

// reportsEgress says whether req's pods check their egress address
// themselves: a check is configured, and the provider reaches neither the
// pods nor a load balancer in front of them.
func (d *Driver) reportsEgress(req proxy.Request) bool {
	if req.Proxy.EgressCheck == nil || d.dialPods || serviceType(req) == string(corev1.ServiceTypeLoadBalancer) {
		return false
	}
	_, err := squid.ReportRequest(*req.Proxy.EgressCheck)
	return err == nil
}

// deployment is buildDeployment with the reporting container where
// reportsEgress says so.
func (d *Driver) buildDeployment(req proxy.Request, files squid.Files, specHash string) *appsv1.Deployment {
	dep := buildDeployment(d.cfg, req, files, specHash, d.now())
	if !d.reportsEgress(req) {
		return dep
	}
	spec := &dep.Spec.Template.Spec
	spec.Volumes = append(spec.Volumes, corev1.Volume{
		Name: ReportContainerName,
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName:  req.Name,
			Items:       []corev1.KeyToPath{{Key: KeyEgressCheck, Path: KeyEgressCheck}},
			DefaultMode: ptr.To[int32](0o440),
		}},
	})
	spec.Containers = append(spec.Containers, corev1.Container{
		Name:            ReportContainerName,
		Image:           d.cfg.Image,
		ImagePullPolicy: corev1.PullIfNotPresent,
		Command: []string{"/bin/bash", "-c", squid.ReportLoop, ReportContainerName,
			ReportMountPath + "/" + KeyEgressCheck, strconv.Itoa(int(squid.ReportPort(req.Proxy))), strconv.Itoa(reportInterval)},
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("1m"), corev1.ResourceMemory: resource.MustParse("4Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("32Mi")},
		},
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		VolumeMounts: []corev1.VolumeMount{{Name: ReportContainerName, MountPath: ReportMountPath, ReadOnly: true}},
		// Not FallbackToLogsOnError: the log holds the echo endpoint's
		// answer, which would become the termination message and then the
		// proxy's Ready condition. The report is read from the log
		// (readReport), never from the termination message; the script
		// writes no termination file, so the message stays empty.
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	})
	return dep
}

// buildSecret is buildSecret with the check's request for a Deployment
// that runs the reporting container.
func (d *Driver) buildSecret(dep *appsv1.Deployment, req proxy.Request, files squid.Files) *corev1.Secret {
	sec := buildSecret(dep, req, files)
	// By the request, not dep: Update writes the Secret before the
	// Deployment that will mount it.
	if d.reportsEgress(req) {
		if r, err := squid.ReportRequest(*req.Proxy.EgressCheck); err == nil {
			sec.Data[KeyEgressCheck] = []byte(r)
		}
	}
	return sec
}

// reporter says whether dep's pods run the reporting container.
func reporter(dep *appsv1.Deployment) bool {
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name == ReportContainerName {
			return true
		}
	}
	return false
}

// readReport fills inst's egress address, or why the check failed, from
// what the serving pod's reporting container last printed. A log that
// cannot be read or holds no valid report leaves both empty: the
// controller then says the address is not known. The log is the tenant
// cluster's word: read capped, parsed strictly (squid.LastReport), never
// quoted.
func (d *Driver) readReport(ctx context.Context, dep *appsv1.Deployment, inst *proxy.Instance) {
	pod := inst.Details["pod"]
	if d.podLog == nil || pod == "" || !reporter(dep) {
		return
	}
	b, err := d.podLog(ctx, dep.Namespace, pod, ReportContainerName, reportLogTail, squid.MaxReport)
	if err != nil {
		d.logger(ctx).V(1).Info("cannot read the egress check's report", "namespace", dep.Namespace, "pod", pod, "error", logError(err, d.quiet))
		return
	}
	r, ok, err := squid.LastReport(b)
	switch {
	case err != nil:
		d.logger(ctx).V(1).Info("the egress check's report is not valid", "namespace", dep.Namespace, "pod", pod, "error", err.Error())
	case ok:
		r.At = squid.ReportedAt(r.At, d.now())
		r.Publish(inst)
	}
}

// logError is err's message, with a tenant's cluster's answer not quoted.
func logError(err error, quiet bool) string {
	if quiet {
		return quietStatus(err).Error()
	}
	return err.Error()
}
