package kubernetes

import (
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

func testRequest() proxy.Request {
	return proxy.Request{
		Name: "team-a-egress-1a2b3c4d",
		Mark: proxy.Mark{UID: "0c8f6a1e-5b7d-4e2a-9c3f-00000000000a", InstallationID: "prod-eu"},
		Proxy: proxy.Settings{
			Port:               3128,
			AllowedClientCIDRs: []string{"10.0.0.0/8"},
			AllowedPorts:       []int32{443},
		},
	}
}

func render(t *testing.T, req proxy.Request) squid.Files {
	t.Helper()
	f, err := squid.Render(req.Proxy, squidOptions(req, nil))
	if err != nil {
		t.Fatal(err)
	}
	return f
}

var now = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestBuildDeploymentMarkAndAnnotations(t *testing.T) {
	req := testRequest()
	files := render(t, req)
	dep := buildDeployment(Config{Namespace: "egress"}, req, files, "abc", now)

	wantLabels := map[string]string{
		LabelManagedBy:    ManagedBy,
		LabelName:         req.Name,
		LabelUID:          req.Mark.UID,
		LabelInstallation: "prod-eu",
	}
	if diff := cmp.Diff(wantLabels, dep.Labels); diff != "" {
		t.Errorf("Deployment labels (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantLabels, dep.Spec.Template.Labels); diff != "" {
		t.Errorf("pod labels (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]string{LabelName: req.Name, LabelUID: req.Mark.UID}, dep.Spec.Selector.MatchLabels); diff != "" {
		t.Errorf("selector (-want +got):\n%s", diff)
	}
	wantAnn := map[string]string{
		AnnotationSpecHash:     "abc",
		AnnotationCreatedAt:    "2026-11-29T12:00:00Z",
		AnnotationTemplateHash: Config{Namespace: "egress"}.withDefaults().templateHash(),
	}
	if diff := cmp.Diff(wantAnn, dep.Annotations); diff != "" {
		t.Errorf("annotations (-want +got):\n%s", diff)
	}
	if got := dep.Spec.Template.Annotations[AnnotationConfigHash]; got != ConfigHash(files, req) || got == squid.Hash(files) {
		t.Errorf("pod template config hash %q; want ConfigHash %q, keyed (not squid.Hash %q)", got, ConfigHash(files, req), squid.Hash(files))
	}
	if dep.Namespace != "egress" || dep.Name != req.Name {
		t.Errorf("Deployment %s/%s; want egress/%s", dep.Namespace, dep.Name, req.Name)
	}
	if got := buildDeployment(Config{}, req, files, "", now); got.Namespace != DefaultNamespace || got.Annotations[AnnotationSpecHash] != "" {
		t.Errorf("default namespace %q, spec hash %q; want %q and none", got.Namespace, got.Annotations[AnnotationSpecHash], DefaultNamespace)
	}
}

func TestBuildDeploymentRunsSquidLockedDown(t *testing.T) {
	req := testRequest()
	dep := buildDeployment(Config{}, req, render(t, req), "h", now)
	ps := dep.Spec.Template.Spec
	if len(ps.Containers) != 1 {
		t.Fatalf("%d containers; want 1", len(ps.Containers))
	}
	c := ps.Containers[0]

	if diff := cmp.Diff(&corev1.PodSecurityContext{
		RunAsNonRoot: ptr.To(true), RunAsUser: ptr.To[int64](13), RunAsGroup: ptr.To[int64](13), FSGroup: ptr.To[int64](13),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}, ps.SecurityContext); diff != "" {
		t.Errorf("pod securityContext (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(&corev1.SecurityContext{
		RunAsNonRoot: ptr.To(true), AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
	}, c.SecurityContext); diff != "" {
		t.Errorf("container securityContext (-want +got):\n%s", diff)
	}
	if ptr.Deref(ps.AutomountServiceAccountToken, true) || ptr.Deref(ps.EnableServiceLinks, true) {
		t.Errorf("automountServiceAccountToken %v, enableServiceLinks %v; want false, false", ps.AutomountServiceAccountToken, ps.EnableServiceLinks)
	}
	if diff := cmp.Diff(DefaultResources(), c.Resources); diff != "" {
		t.Errorf("default resources (-want +got):\n%s", diff)
	}
	if c.Image != DefaultImage {
		t.Errorf("image %q; want %q", c.Image, DefaultImage)
	}
	if diff := cmp.Diff([]string{"/usr/sbin/squid", "-N", "-f", "/etc/squid-egress/squid.conf"}, append(c.Command, c.Args...)); diff != "" {
		t.Errorf("command (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]corev1.ContainerPort{{Name: "proxy", ContainerPort: 3128, Protocol: corev1.ProtocolTCP}}, c.Ports); diff != "" {
		t.Errorf("ports (-want +got):\n%s", diff)
	}
	if c.ReadinessProbe == nil || c.ReadinessProbe.TCPSocket == nil || c.ReadinessProbe.TCPSocket.Port != intstr.FromString("proxy") {
		t.Errorf("readiness probe %+v; want a TCP check of the proxy port", c.ReadinessProbe)
	}
	if ps.SecurityContext.Sysctls != nil {
		t.Errorf("sysctls %v on a high port; want none", ps.SecurityContext.Sysctls)
	}
	mounts := map[string]string{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m.Name
	}
	if mounts[ConfigMountPath] != "config" || mounts["/tmp"] == "" {
		t.Errorf("mounts %v; want the config Secret at %s and scratch folders", mounts, ConfigMountPath)
	}
	for _, v := range ps.Volumes {
		if v.Name == "config" && (v.Secret == nil || v.Secret.SecretName != req.Name || *v.Secret.DefaultMode != 0o440) {
			t.Errorf("config volume %+v; want Secret %s, mode 0440", v.VolumeSource, req.Name)
		}
	}
	if s := dep.Spec.Strategy.RollingUpdate; s == nil || s.MaxUnavailable.IntValue() != 0 || s.MaxSurge.IntValue() != 1 {
		t.Errorf("strategy %+v; want the new pod before the old one goes", dep.Spec.Strategy)
	}
	if *dep.Spec.Replicas != 1 {
		t.Errorf("replicas %d; want 1", *dep.Spec.Replicas)
	}
}

func TestBuildDeploymentFromConfig(t *testing.T) {
	req := testRequest()
	req.Proxy.Port = 81 // a low port that is not a destination port (80 and 443 are)
	res := corev1.ResourceRequirements{Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("1Gi")}}
	cfg := Config{Image: "example.com/squid:7", Resources: &res, NodeSelector: map[string]string{"pool": "egress"}, ImagePullSecrets: []string{"regcred"}}
	dep := buildDeployment(cfg, req, render(t, req), "h", now)
	ps := dep.Spec.Template.Spec
	c := ps.Containers[0]
	if c.Image != "example.com/squid:7" || !cmp.Equal(res, c.Resources) || ps.NodeSelector["pool"] != "egress" ||
		len(ps.ImagePullSecrets) != 1 || ps.ImagePullSecrets[0].Name != "regcred" {
		t.Errorf("config not applied: image %q, resources %v, nodeSelector %v, pull secrets %v", c.Image, c.Resources, ps.NodeSelector, ps.ImagePullSecrets)
	}
	if diff := cmp.Diff([]corev1.Sysctl{{Name: "net.ipv4.ip_unprivileged_port_start", Value: "0"}}, ps.SecurityContext.Sysctls); diff != "" {
		t.Errorf("a low port needs the unprivileged-port sysctl (-want +got):\n%s", diff)
	}
	if a, b := (Config{}).withDefaults().templateHash(), cfg.withDefaults().templateHash(); a == b {
		t.Errorf("template hash %q does not change with the config", a)
	}
}

func TestConfigHashFollowsFiles(t *testing.T) {
	req := testRequest()
	base := buildDeployment(Config{}, req, render(t, req), "h", now).Spec.Template.Annotations[AnnotationConfigHash]
	changed := testRequest()
	changed.Proxy.AllowedClientCIDRs = []string{"192.168.0.0/16"}
	if got := buildDeployment(Config{}, changed, render(t, changed), "h", now).Spec.Template.Annotations[AnnotationConfigHash]; got == base {
		t.Errorf("config hash unchanged (%q) after changing the allowed CIDRs: the pods would not roll", got)
	}
	auth := testRequest()
	auth.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "p"}
	if got := buildDeployment(Config{}, auth, render(t, auth), "h", now).Spec.Template.Annotations[AnnotationConfigHash]; got == base {
		t.Errorf("config hash unchanged after turning auth on")
	}
}

func TestBuildSecret(t *testing.T) {
	req := testRequest()
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "alice", Password: "S3NT1NEL-password"}
	files := render(t, req)
	dep := buildDeployment(Config{}, req, files, "h", now)
	dep.UID = "dep-uid"
	s := buildSecret(dep, req, files)
	if string(s.Data[KeySquidConf]) != files.SquidConf || string(s.Data[KeyHtpasswd]) != files.Htpasswd {
		t.Errorf("Secret data does not hold the rendered files")
	}
	if strings.Contains(string(s.Data[KeyHtpasswd]), "S3NT1NEL") || strings.Contains(string(s.Data[KeySquidConf]), "S3NT1NEL") {
		t.Errorf("the Secret holds the password in the clear")
	}
	if !strings.Contains(files.SquidConf, "/etc/squid-egress/htpasswd") {
		t.Errorf("squid.conf does not read the mounted htpasswd:\n%s", files.SquidConf)
	}
	if diff := cmp.Diff([]string{"dep-uid"}, []string{string(s.OwnerReferences[0].UID)}); diff != "" || !*s.OwnerReferences[0].BlockOwnerDeletion {
		t.Errorf("owner references %+v; want the Deployment, blocking its deletion", s.OwnerReferences)
	}
	if s.Labels[LabelUID] != req.Mark.UID || s.Labels[LabelManagedBy] != ManagedBy {
		t.Errorf("Secret labels %v; want the mark", s.Labels)
	}
	noAuth := testRequest()
	if s := buildSecret(dep, noAuth, render(t, noAuth)); len(s.Data) != 3 || s.Data[OwnerKey(noAuth.Mark.UID)] == nil || s.Data[KeyConfigHash] == nil {
		t.Errorf("Secret without auth holds %d keys; want squid.conf, the config hash and the owner key only", len(s.Data))
	}
}

// The pod mounts the Secret's keys by name, each required, the owner key
// among them: the kubelet starts no container on a Secret of the proxy's
// name that was not written for this resource (someone else's, another
// resource's of the same name), so Create may make the Deployment before
// it knows the Secret's name is free.
func TestPodNeedsTheResourcesOwnSecret(t *testing.T) {
	for _, auth := range []bool{false, true} {
		req := testRequest()
		req.Proxy.Auth = proxy.Auth{Enabled: auth, Username: "alice", Password: "pw-0123456789abcdef"}
		files := render(t, req)
		dep := buildDeployment(Config{}, req, files, "h", now)
		var items []corev1.KeyToPath
		for _, v := range dep.Spec.Template.Spec.Volumes {
			if v.Name == "config" {
				if v.Secret.Optional != nil && *v.Secret.Optional {
					t.Errorf("auth %v: the config Secret is optional", auth)
				}
				items = v.Secret.Items
			}
		}
		want := []corev1.KeyToPath{{Key: KeySquidConf, Path: KeySquidConf}}
		if auth {
			want = append(want, corev1.KeyToPath{Key: KeyHtpasswd, Path: KeyHtpasswd})
		}
		want = append(want, corev1.KeyToPath{Key: OwnerKey(req.Mark.UID), Path: FileOwner})
		if diff := cmp.Diff(want, items); diff != "" {
			t.Errorf("auth %v: config volume items (-want +got):\n%s", auth, diff)
		}
		ours := buildSecret(dep, req, files)
		other := req
		other.Mark.UID = "another-uid"
		theirs := buildSecret(dep, other, files)
		for _, it := range items {
			if it.Path == "" || it.Path != filepath.Base(it.Path) {
				t.Errorf("auth %v: item %+v is not a plain file name", auth, it)
			}
			if _, ok := ours.Data[it.Key]; !ok {
				t.Errorf("auth %v: the pod needs key %q, which the resource's own Secret lacks", auth, it.Key)
			}
		}
		if _, ok := theirs.Data[OwnerKey(req.Mark.UID)]; ok {
			t.Errorf("auth %v: another resource's Secret holds this resource's owner key", auth)
		}
	}
}

func TestBuildService(t *testing.T) {
	req := testRequest()
	dep := &appsv1.Deployment{}
	dep.Name, dep.Namespace, dep.UID = req.Name, "egress", "dep-uid"
	if s := buildService(dep, req); s != nil {
		t.Errorf("a Service without a service type: %+v", s)
	}
	req.Extension = Exposure{ServiceType: "ClusterIP"}
	s := buildService(dep, req)
	if s.Spec.Type != corev1.ServiceTypeClusterIP || s.Spec.Ports[0].Port != 3128 || s.Spec.ExternalTrafficPolicy != "" {
		t.Errorf("ClusterIP Service %+v", s.Spec)
	}
	if diff := cmp.Diff(map[string]string{LabelName: req.Name, LabelUID: req.Mark.UID}, s.Spec.Selector); diff != "" {
		t.Errorf("selector (-want +got):\n%s", diff)
	}
	req.Extension = Exposure{ServiceType: "LoadBalancer"}
	req.Proxy.AllowedClientCIDRs = []string{"10.1.2.3/8", "::ffff:192.168.0.0/112", "10.0.0.0/8"}
	s = buildService(dep, req)
	if s.Spec.ExternalTrafficPolicy != corev1.ServiceExternalTrafficPolicyLocal {
		t.Errorf("LoadBalancer externalTrafficPolicy %q; want Local, so Squid sees the client's address", s.Spec.ExternalTrafficPolicy)
	}
	if diff := cmp.Diff([]string{"10.0.0.0/8", "192.168.0.0/16"}, s.Spec.LoadBalancerSourceRanges); diff != "" {
		t.Errorf("loadBalancerSourceRanges (-want +got):\n%s", diff)
	}
}

// TestNetworkPolicySaysWhatSquidDenies: the policy on a proxy's pods lets
// them reach the world and DNS, never the denied ranges or the cluster's
// networks, and of the private ranges only what the resource opened, the
// metadata addresses inside excepted.
func TestNetworkPolicySaysWhatSquidDenies(t *testing.T) {
	req := testRequest()
	req.Proxy.AllowedDestinationCIDRs = []string{"100.64.0.0/10", "10.30.0.0/16"}
	dep := buildDeployment(Config{}, req, render(t, req), "h", time.Unix(0, 0))
	np := buildNetworkPolicy(dep, req, []string{"10.96.0.0/12", "192.0.2.7/32"})
	if np.Name != dep.Name || np.Namespace != dep.Namespace || len(np.OwnerReferences) != 1 || np.Labels[LabelUID] != req.Mark.UID {
		t.Errorf("policy %s/%s owners %v labels %v; want the Deployment's name, owner and mark", np.Namespace, np.Name, np.OwnerReferences, np.Labels)
	}
	if diff := cmp.Diff(selectorLabels(req), np.Spec.PodSelector.MatchLabels); diff != "" {
		t.Errorf("pod selector (-want +got):\n%s", diff)
	}
	if fmt.Sprint(np.Spec.PolicyTypes) != "[Egress]" || len(np.Spec.Egress) != 2 {
		t.Fatalf("policy types %v, %d egress rules; want Egress only, DNS and destinations", np.Spec.PolicyTypes, len(np.Spec.Egress))
	}
	blocks := map[string][]string{}
	for _, p := range np.Spec.Egress[1].To {
		blocks[p.IPBlock.CIDR] = p.IPBlock.Except
	}
	for _, c := range []string{"127.0.0.0/8", "169.254.0.0/16", "168.63.129.16/32", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "10.96.0.0/12", "192.0.2.7/32"} {
		if !slices.Contains(blocks["0.0.0.0/0"], c) {
			t.Errorf("0.0.0.0/0 does not except %s: %v", c, blocks["0.0.0.0/0"])
		}
	}
	for _, c := range []string{"::/96", "fe80::/10", "fc00::/7", "fd00:ec2::254/128"} {
		if !slices.Contains(blocks["::/0"], c) {
			t.Errorf("::/0 does not except %s: %v", c, blocks["::/0"])
		}
	}
	if ex, ok := blocks["100.64.0.0/10"]; !ok || !slices.Contains(ex, "100.100.100.200/32") {
		t.Errorf("opened 100.64.0.0/10: %v, %v; want it allowed with Alibaba's metadata address excepted", ok, ex)
	}
	if ex, ok := blocks["10.30.0.0/16"]; !ok || len(ex) != 0 {
		t.Errorf("opened 10.30.0.0/16: %v, %v; want it allowed", ok, ex)
	}
}

// TestConfigHashIsKeyed: the pod template's config hash, which whoever may
// read Deployments sees, changes with the password as the htpasswd does,
// but cannot be computed from the files alone: without the request's
// SecretDigest, a guessed password's htpasswd tells nothing.
func TestConfigHashIsKeyed(t *testing.T) {
	req := testRequest()
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "u", Password: "pw-S3NT1NEL-guessable"}
	req.SecretDigest = "digest-of-the-password"
	files := render(t, req)
	guessed := req
	guessed.SecretDigest = ""
	if ConfigHash(files, req) == ConfigHash(files, guessed) || ConfigHash(files, req) == squid.Hash(files) {
		t.Error("the config hash can be computed from the files without the request's SecretDigest")
	}
	other := req
	other.Proxy.Auth.Password = "pw-S3NT1NEL-another"
	other.SecretDigest = "digest-of-another-password"
	if ConfigHash(render(t, other), other) == ConfigHash(files, req) {
		t.Error("the config hash did not change with the password")
	}
}
