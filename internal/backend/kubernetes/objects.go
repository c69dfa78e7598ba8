package kubernetes

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"maps"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

// Labels every object of a proxy carries. The managed-by label is what the
// provider's cache selects on; the name and UID labels select a proxy's
// pods; the UID and installation labels are the ownership mark.
const (
	LabelManagedBy    = "app.kubernetes.io/managed-by"
	ManagedBy         = "provider-egressproxy"
	LabelName         = "egressproxy.io/name"
	LabelUID          = "egressproxy.io/uid"
	LabelInstallation = "egressproxy.io/installation"
)

// Annotations the driver writes.
const (
	// AnnotationSpecHash (Deployment) is proxy.Hash of the request the
	// proxy was last created or updated from. It is written last, once the
	// Secret and Service are in place, so a create interrupted half-way reads
	// as out of date and the next Update completes it.
	AnnotationSpecHash = "egressproxy.io/spec-hash"
	// AnnotationCreatedAt (Deployment) is when the driver created the proxy.
	AnnotationCreatedAt = "egressproxy.io/created-at"
	// AnnotationTemplateHash (Deployment) digests what the pod template is
	// built from besides the request (the config's image, resources, node
	// selector, tolerations, affinity, pull secrets, and this code's
	// template version), so a
	// ProviderConfig change or a provider upgrade rolls the pods too.
	AnnotationTemplateHash = "egressproxy.io/template-hash"
	// AnnotationService (Deployment) is the type of the Service in front of
	// the proxy, absent without one, so Get reads a Service only when one
	// should exist.
	AnnotationService = "egressproxy.io/service"
	// AnnotationNetworkPolicy (Deployment) is "true" when the proxy was
	// written with a NetworkPolicy, absent without one, so that the
	// orphan sweep of any config calls missing only a NetworkPolicy that
	// the proxy's own config wants (configs of one namespace may differ).
	AnnotationNetworkPolicy = "egressproxy.io/network-policy"
	// AnnotationConfigHash (pod template) is ConfigHash of the files in the
	// Secret: a changed squid.conf or htpasswd changes the template and so
	// rolls the pods.
	AnnotationConfigHash = "egressproxy.io/config-hash"
)

// Where things are in the pod. The paths are those of Debian's and Ubuntu's
// squid packages (the default image is Debian's, hack/squid-image.sh).
const (
	// ConfigMountPath is where the Secret (squid.conf, htpasswd, the TLS
	// certificate and key) is mounted.
	ConfigMountPath = "/etc/squid-egress"
	// KeySquidConf and KeyHtpasswd are the Secret's keys, and the files'
	// names in the pod.
	KeySquidConf = "squid.conf"
	KeyHtpasswd  = "htpasswd"
	// KeyTLSCert and KeyTLSKey are the proxy's certificate chain and key
	// when it listens with TLS.
	// KeyConfigHash is the Secret's copy of its pod template's
	// AnnotationConfigHash, so that what reads the Secret can tell which
	// template its files are for; the pods do not mount it.
	KeyConfigHash = "config-hash"
	KeyTLSCert    = "tls.crt"
	KeyTLSKey     = "tls.key"
	// FileOwner is the file in the pod that holds the resource's UID,
	// from the Secret's OwnerKey.
	FileOwner = "owner"
	// ContainerName is the Squid container's name.
	ContainerName = "squid"
	// PortName names the container and Service port.
	PortName = "proxy"
	// SquidBinary is squid in the image.
	SquidBinary = "/usr/sbin/squid"
	// SquidUser is the uid and gid of Debian's "proxy" user, which Squid
	// runs as: the container never runs as root.
	SquidUser = 13
)

// DefaultNamespace is the Namespace of a Config that names none.
const DefaultNamespace = "egress-proxies"

// DevImage is DefaultImage in a build that does not set it: the name
// hack/squid-image.sh's image has only where someone tagged it so.
const DevImage = "localhost/egressproxy/squid:dev"

// DefaultImage is the Squid image of a Config that names none: in a
// package build (hack/xpkg.sh), the project's own image
// (hack/squid-image.sh) by digest in the registry the packages are pushed
// to, set at link time (-ldflags -X, as the version is); DevImage in any
// other build.
var DefaultImage = DevImage

// templateVersion is part of AnnotationTemplateHash: bump it when a change
// to this file changes the Deployment, so existing proxies roll out.
// 2: the Secret's keys are listed (configItems); rolling also brings
// every pod under the Deployment's own template again after a provider
// downgrade, whose Secret would lack the owner key.
const templateVersion = "2"

// terminationGrace leaves Squid its shutdown_lifetime to drain connections
// after SIGTERM, plus a margin.
var terminationGrace = int64((squid.DefaultShutdownLifetime + 5*time.Second) / time.Second)

// DefaultResources are the Squid container's resources when the config
// sets none: enough for a few hundred concurrent tunnels.
func DefaultResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("50m"),
			corev1.ResourceMemory: resource.MustParse("64Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("256Mi"),
		},
	}
}

// Config is the driver's part of a ProviderConfig's kubernetes block.
type Config struct {
	// Namespace proxies are created in; DefaultNamespace when empty.
	Namespace string
	// Image is the Squid image; DefaultImage when empty.
	Image string
	// ImagePullSecrets name Secrets in Namespace.
	ImagePullSecrets []string
	// Resources of the Squid container; DefaultResources when nil.
	Resources *corev1.ResourceRequirements
	// NodeSelector for the pods.
	NodeSelector map[string]string
	// Tolerations and Affinity of the pods. (omitempty: the template hash,
	// and so every existing proxy's pods, stay the same while unused.)
	Tolerations []corev1.Toleration `json:",omitempty"`
	Affinity    *corev1.Affinity    `json:",omitempty"`
	// ClusterNetworks are CIDRs (or addresses) of the cluster's own
	// networks that proxies never reach, on top of what the driver
	// discovers (see clusterNetworks).
	ClusterNetworks []string
	// NetworkPolicy puts a NetworkPolicy on each proxy's pods saying what
	// Squid denies (see buildNetworkPolicy).
	NetworkPolicy bool
	// EgressCheck says the config names an egress check: in a cluster the
	// provider cannot reach the pods of, they report it themselves, and
	// the driver needs pods/log (egressreport.go). Not part of the
	// template: the request's check is.
	EgressCheck bool `json:"-"`
}

func (c Config) withDefaults() Config {
	if c.Namespace == "" {
		c.Namespace = DefaultNamespace
	}
	if c.Image == "" {
		c.Image = DefaultImage
	}
	if c.Resources == nil {
		r := DefaultResources()
		c.Resources = &r
	}
	return c
}

// templateHash digests c (and the template version) for
// AnnotationTemplateHash.
func (c Config) templateHash() string {
	// Not part of the pod template: they reach the pod through squid.conf
	// (whose own hash rolls it) or a separate object.
	c.ClusterNetworks, c.NetworkPolicy = nil, false
	b, _ := json.Marshal(struct { //nolint:errchkjson // plain data always marshals.
		V string
		C Config
	}{templateVersion, c})
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// validName is a name every object kind accepts: a DNS-1035 label (Services
// need one).
var validName = regexp.MustCompile(`^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$`)

// dnsLabel is a namespace name.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// labelValue is a valid label value.
var labelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$`)

// squidOptions are the internal/squid options for the image: the
// htpasswd from the mounted Secret, logs to the container's streams, no PID
// file (read-only root), a per-proxy salt, and the cluster's own networks
// denied.
func squidOptions(req proxy.Request, cluster []string) squid.Options {
	return squid.Options{
		HtpasswdPath:           ConfigMountPath + "/" + KeyHtpasswd,
		TLSCertPath:            ConfigMountPath + "/" + KeyTLSCert,
		TLSKeyPath:             ConfigMountPath + "/" + KeyTLSKey,
		HtpasswdSalt:           req.Mark.UID,
		UID:                    req.Mark.UID,
		DeniedDestinationCIDRs: cluster,
	}
}

// selectorLabels select one proxy's pods. Both are fixed for the life of a
// Deployment (its selector is immutable).
func selectorLabels(req proxy.Request) map[string]string {
	return map[string]string{LabelName: req.Name, LabelUID: req.Mark.UID}
}

// markLabels are the labels of every object of the proxy.
func markLabels(req proxy.Request) map[string]string {
	l := map[string]string{
		LabelManagedBy:    ManagedBy,
		LabelName:         req.Name,
		LabelUID:          req.Mark.UID,
		LabelInstallation: req.Mark.InstallationID,
	}
	// Extra labels of the request never override the mark.
	for k, v := range req.Labels {
		if _, ok := l[k]; !ok {
			l[k] = v
		}
	}
	return l
}

// buildDeployment is the root object of a proxy: Squid (one replica, or as
// many as the request asks, spread over nodes), run as a non-root user with
// nothing writable but its scratch folders.
// specHash is written as AnnotationSpecHash ("" leaves it out: see
// AnnotationSpecHash).
func buildDeployment(c Config, req proxy.Request, files squid.Files, specHash string, now time.Time) *appsv1.Deployment {
	c = c.withDefaults()
	port := req.Proxy.Port
	annotations := map[string]string{
		AnnotationCreatedAt:    now.UTC().Format(time.RFC3339),
		AnnotationTemplateHash: c.templateHash(),
	}
	if specHash != "" {
		annotations[AnnotationSpecHash] = specHash
	}
	if serviceType(req) != "" {
		annotations[AnnotationService] = serviceType(req)
	}
	if c.NetworkPolicy {
		annotations[AnnotationNetworkPolicy] = "true"
	}
	pullSecrets := make([]corev1.LocalObjectReference, 0, len(c.ImagePullSecrets))
	for _, s := range c.ImagePullSecrets {
		pullSecrets = append(pullSecrets, corev1.LocalObjectReference{Name: s})
	}
	var sysctls []corev1.Sysctl
	if port < 1024 {
		// A non-root Squid may bind a low port only when the pod's network
		// namespace allows it; this sysctl is namespaced and "safe".
		sysctls = []corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}
	}
	probe := func(period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler:     corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromString(PortName)}},
			PeriodSeconds:    period,
			TimeoutSeconds:   2,
			FailureThreshold: failures,
		}
	}
	scratch := []struct{ name, path string }{
		// Squid writes nothing with this squid.conf (no cache, no PID file,
		// logs to the streams), but its helpers and a core dump may want
		// these; an emptyDir keeps the root filesystem read-only.
		{"run", "/var/run/squid"},
		{"spool", "/var/spool/squid"},
		{"logs", "/var/log/squid"},
		{"tmp", "/tmp"},
	}
	volumes := []corev1.Volume{{
		Name: "config",
		VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{
			SecretName: req.Name,
			Items:      configItems(req, files),
			// Readable by Squid's group only (fsGroup), not by everyone.
			DefaultMode: ptr.To[int32](0o440),
		}},
	}}
	mounts := []corev1.VolumeMount{{Name: "config", MountPath: ConfigMountPath, ReadOnly: true}}
	for _, s := range scratch {
		volumes = append(volumes, corev1.Volume{Name: s.name, VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{SizeLimit: ptr.To(resource.MustParse("64Mi"))}}})
		mounts = append(mounts, corev1.VolumeMount{Name: s.name, MountPath: s.path})
	}

	return &appsv1.Deployment{
		TypeMeta: metav1.TypeMeta{APIVersion: "apps/v1", Kind: "Deployment"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            req.Name,
			Namespace:       c.Namespace,
			Labels:          markLabels(req),
			Annotations:     annotations,
			OwnerReferences: resourceOwner(req),
		},
		Spec: appsv1.DeploymentSpec{
			// A Deployment (not a bare pod) so that a pod lost with its
			// node is replaced.
			Replicas:             ptr.To(replicas(req)),
			RevisionHistoryLimit: ptr.To[int32](1),
			Selector:             &metav1.LabelSelector{MatchLabels: selectorLabels(req)},
			// The new pod first, the old one only once the new one is ready:
			// a configuration change never leaves the proxy without a pod.
			Strategy: appsv1.DeploymentStrategy{
				Type: appsv1.RollingUpdateDeploymentStrategyType,
				RollingUpdate: &appsv1.RollingUpdateDeployment{
					MaxUnavailable: ptr.To(intstr.FromInt32(0)),
					MaxSurge:       ptr.To(intstr.FromInt32(1)),
				},
			},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{
					Labels:      markLabels(req),
					Annotations: map[string]string{AnnotationConfigHash: ConfigHash(files, req)},
				},
				Spec: corev1.PodSpec{
					// Squid needs no Kubernetes API access, and a namespace
					// of many proxies would otherwise hand each pod an
					// environment variable per Service.
					AutomountServiceAccountToken:  ptr.To(false),
					EnableServiceLinks:            ptr.To(false),
					TerminationGracePeriodSeconds: ptr.To(terminationGrace),
					NodeSelector:                  maps.Clone(c.NodeSelector),
					Tolerations:                   slices.Clone(c.Tolerations),
					Affinity:                      c.Affinity.DeepCopy(),
					TopologySpreadConstraints:     spread(req),
					ImagePullSecrets:              pullSecrets,
					SecurityContext: &corev1.PodSecurityContext{
						RunAsNonRoot:   ptr.To(true),
						RunAsUser:      ptr.To[int64](SquidUser),
						RunAsGroup:     ptr.To[int64](SquidUser),
						FSGroup:        ptr.To[int64](SquidUser),
						SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
						Sysctls:        sysctls,
					},
					Containers: []corev1.Container{{
						Name:            ContainerName,
						Image:           c.Image,
						ImagePullPolicy: corev1.PullIfNotPresent,
						// In the foreground, with the mounted configuration
						// and nothing from the image's own.
						Command: []string{SquidBinary},
						Args:    []string{"-N", "-f", ConfigMountPath + "/" + KeySquidConf},
						Ports: []corev1.ContainerPort{{
							Name: PortName, ContainerPort: port, Protocol: corev1.ProtocolTCP,
						}},
						Resources:      *c.Resources.DeepCopy(),
						ReadinessProbe: probe(5, 2),
						LivenessProbe:  probe(20, 3),
						SecurityContext: &corev1.SecurityContext{
							RunAsNonRoot:             ptr.To(true),
							AllowPrivilegeEscalation: ptr.To(false),
							ReadOnlyRootFilesystem:   ptr.To(true),
							Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
						},
						VolumeMounts:             mounts,
						TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
					}},
					Volumes: volumes,
				},
			},
		},
	}
}

// spread keeps two or more replicas of a proxy on different nodes where
// there are nodes for them: at most one more on any node than on
// another, counting only the nodes its placement allows (the nodes it
// tolerates the taints of, NodeTaintsPolicy Honor; not cordoned ones) and
// only pods of the same template (a rollout's new pods spread among
// themselves). Where one node is allowed, all replicas share it. Nil for
// one replica.
func spread(req proxy.Request) []corev1.TopologySpreadConstraint {
	if replicas(req) < 2 {
		return nil
	}
	return []corev1.TopologySpreadConstraint{{
		MaxSkew:           1,
		TopologyKey:       corev1.LabelHostname,
		WhenUnsatisfiable: corev1.DoNotSchedule,
		LabelSelector:     &metav1.LabelSelector{MatchLabels: selectorLabels(req)},
		MatchLabelKeys:    []string{appsv1.DefaultDeploymentUniqueLabelKey},
		NodeTaintsPolicy:  ptr.To(corev1.NodeInclusionPolicyHonor),
	}}
}

// buildDisruptionBudget keeps all but one of a proxy's replicas up through
// voluntary disruptions (a node drain), owned by dep; nil for one replica,
// where it would only block the drain. A pod that is not ready may always
// be evicted: a crash-looping replica never holds a drain up.
func buildDisruptionBudget(dep *appsv1.Deployment, req proxy.Request) *policyv1.PodDisruptionBudget {
	if replicas(req) < 2 {
		return nil
	}
	return &policyv1.PodDisruptionBudget{
		TypeMeta: metav1.TypeMeta{APIVersion: "policy/v1", Kind: "PodDisruptionBudget"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            dep.Name,
			Namespace:       dep.Namespace,
			Labels:          markLabels(req),
			OwnerReferences: []metav1.OwnerReference{ownerRef(dep)},
		},
		Spec: policyv1.PodDisruptionBudgetSpec{
			MaxUnavailable:             ptr.To(intstr.FromInt32(1)),
			Selector:                   &metav1.LabelSelector{MatchLabels: selectorLabels(req)},
			UnhealthyPodEvictionPolicy: ptr.To(policyv1.AlwaysAllow),
		},
	}
}

// resourceOwner is the owner reference to the managed resource req asks
// for (Exposure.Owner), or none. Neither controller nor
// blockOwnerDeletion: the provider deletes the Deployment itself while
// the resource lives; the reference only lets the garbage collector do it
// once the resource is gone without the provider.
func resourceOwner(req proxy.Request) []metav1.OwnerReference {
	o := ownerOf(req)
	if o == nil {
		return nil
	}
	return []metav1.OwnerReference{{APIVersion: o.APIVersion, Kind: o.Kind, Name: o.Name, UID: types.UID(o.UID)}}
}

// withResourceOwner is refs with the reference to the managed resource
// (by its UID, the mark's) replaced by want's.
func withResourceOwner(refs []metav1.OwnerReference, uid string, want []metav1.OwnerReference) []metav1.OwnerReference {
	out := slices.DeleteFunc(slices.Clone(refs), func(r metav1.OwnerReference) bool { return string(r.UID) == uid })
	out = append(out, want...)
	if len(out) == 0 {
		return nil
	}
	return out
}

// ownerRef makes dep the owner of a child, so the garbage collector
// removes the child once dep is gone (a foreground deletion of dep waits
// for it), and a bypassed finalizer still leaves nothing behind.
func ownerRef(dep *appsv1.Deployment) metav1.OwnerReference {
	return metav1.OwnerReference{
		APIVersion:         "apps/v1",
		Kind:               "Deployment",
		Name:               dep.Name,
		UID:                dep.UID,
		Controller:         ptr.To(true),
		BlockOwnerDeletion: ptr.To(true),
	}
}

// ConfigHash is the pod template's AnnotationConfigHash: a digest of the
// files the Secret holds, keyed with the request's SecretDigest (itself
// keyed by the controller, from the proxy's password, TLS key and check
// credential). It changes exactly when a file does, and whoever may read
// Deployments but not Secrets (Kubernetes' view role) gets nothing to test
// password guesses against: squid.Hash of the files would be checked with
// one sha512crypt per guess.
func ConfigHash(files squid.Files, req proxy.Request) string {
	mac := hmac.New(sha256.New, []byte(req.SecretDigest))
	mac.Write([]byte(squid.Hash(files)))
	return hex.EncodeToString(mac.Sum(nil))[:16]
}

// OwnerKey is the key of the proxy's Secret that only a Secret written
// for the resource uid has. The pod mounts it (configItems), and the
// kubelet starts no container whose Secret lacks a listed key: a
// Deployment created before its Secret (Create creates the Deployment,
// then its children, and reads a child's name only when it is taken) can
// never run on a Secret of the same name that is not this resource's:
// someone else's, or a deleted resource's not yet collected.
func OwnerKey(uid string) string { return "owner-" + uid }

// configItems are the Secret's keys the pod mounts: Squid's files and the
// owner key. Listing them (rather than mounting the whole Secret) makes
// each one required.
func configItems(req proxy.Request, files squid.Files) []corev1.KeyToPath {
	items := []corev1.KeyToPath{{Key: KeySquidConf, Path: KeySquidConf}}
	if files.Htpasswd != "" {
		items = append(items, corev1.KeyToPath{Key: KeyHtpasswd, Path: KeyHtpasswd})
	}
	if files.TLSCert != "" {
		items = append(items, corev1.KeyToPath{Key: KeyTLSCert, Path: KeyTLSCert}, corev1.KeyToPath{Key: KeyTLSKey, Path: KeyTLSKey})
	}
	return append(items, corev1.KeyToPath{Key: OwnerKey(req.Mark.UID), Path: FileOwner})
}

// buildSecret holds Squid's files and the owner key, owned by dep.
func buildSecret(dep *appsv1.Deployment, req proxy.Request, files squid.Files) *corev1.Secret {
	data := map[string][]byte{KeySquidConf: []byte(files.SquidConf), OwnerKey(req.Mark.UID): []byte(req.Mark.UID),
		KeyConfigHash: []byte(ConfigHash(files, req))}
	if files.Htpasswd != "" {
		data[KeyHtpasswd] = []byte(files.Htpasswd)
	}
	if files.TLSCert != "" {
		data[KeyTLSCert], data[KeyTLSKey] = []byte(files.TLSCert), []byte(files.TLSKey)
	}
	return &corev1.Secret{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Secret"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            dep.Name,
			Namespace:       dep.Namespace,
			Labels:          markLabels(req),
			OwnerReferences: []metav1.OwnerReference{ownerRef(dep)},
		},
		Type: corev1.SecretTypeOpaque,
		Data: data,
	}
}

// buildService puts a ClusterIP or LoadBalancer Service in front of the
// proxy, owned by dep; nil when the request wants none.
func buildService(dep *appsv1.Deployment, req proxy.Request) *corev1.Service {
	t := corev1.ServiceType(serviceType(req))
	if t == "" {
		return nil
	}
	svc := &corev1.Service{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"},
		ObjectMeta: metav1.ObjectMeta{
			Name:            dep.Name,
			Namespace:       dep.Namespace,
			Labels:          markLabels(req),
			OwnerReferences: []metav1.OwnerReference{ownerRef(dep)},
		},
		Spec: corev1.ServiceSpec{
			Type:     t,
			Selector: selectorLabels(req),
			Ports: []corev1.ServicePort{{
				Name:       PortName,
				Port:       req.Proxy.Port,
				TargetPort: intstr.FromString(PortName),
				Protocol:   corev1.ProtocolTCP,
			}},
		},
	}
	if t == corev1.ServiceTypeLoadBalancer {
		// Squid admits clients by source address: the load balancer must
		// not replace it with a node's. Local also keeps traffic off nodes
		// without the pod.
		svc.Spec.ExternalTrafficPolicy = corev1.ServiceExternalTrafficPolicyLocal
		// Defence in depth: the cloud's firewall admits the same clients.
		svc.Spec.LoadBalancerSourceRanges = sourceRanges(req.Proxy.AllowedClientCIDRs)
		// kube-proxy applies to each address only the ranges of its
		// family, and none admit every source: the Service has addresses
		// of the clients' families only. One family is asked for as it is
		// (a cluster without it refuses the Service); with both, the
		// cluster's own, one or two, each holding ranges.
		switch fams := families(svc.Spec.LoadBalancerSourceRanges); len(fams) {
		case 1:
			svc.Spec.IPFamilyPolicy, svc.Spec.IPFamilies = ptr.To(corev1.IPFamilyPolicySingleStack), fams
		case 2:
			svc.Spec.IPFamilyPolicy = ptr.To(corev1.IPFamilyPolicyPreferDualStack)
		}
	}
	return svc
}

// families are the IP families of cidrs, IPv4 first.
func families(cidrs []string) []corev1.IPFamily {
	var out []corev1.IPFamily
	for _, f := range []corev1.IPFamily{corev1.IPv4Protocol, corev1.IPv6Protocol} {
		if slices.ContainsFunc(cidrs, func(c string) bool {
			p, err := netip.ParsePrefix(c)
			return err == nil && p.Addr().Is4() == (f == corev1.IPv4Protocol)
		}) {
			out = append(out, f)
		}
	}
	return out
}

// sourceRanges are the CIDRs in the form the API accepts (masked, IPv4 as
// IPv4), sorted so that reordering them changes nothing.
func sourceRanges(cidrs []string) []string {
	var out []string
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(c)
		if err != nil {
			continue // squid.Validate reported it already
		}
		p = p.Masked()
		if a := p.Addr(); a.Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
		}
		out = append(out, p.String())
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// instanceID is the driver's ID of a proxy: its namespace and name.
func instanceID(namespace, name string) string { return namespace + "/" + name }

// portOf is the proxy port of a Deployment built by buildDeployment.
func portOf(dep *appsv1.Deployment) int32 {
	for _, c := range dep.Spec.Template.Spec.Containers {
		if c.Name != ContainerName {
			continue
		}
		for _, p := range c.Ports {
			if p.Name == PortName {
				return p.ContainerPort
			}
		}
	}
	return 0
}

// formatPort is a port for messages and addresses.
func formatPort(p int32) string { return strconv.Itoa(int(p)) }
