package kubernetes

import (
	"context"
	"errors"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

func resources(req, lim map[corev1.ResourceName]string) *corev1.ResourceRequirements {
	r := &corev1.ResourceRequirements{}
	for n, q := range req {
		if r.Requests == nil {
			r.Requests = corev1.ResourceList{}
		}
		r.Requests[n] = resource.MustParse(q)
	}
	for n, q := range lim {
		if r.Limits == nil {
			r.Limits = corev1.ResourceList{}
		}
		r.Limits[n] = resource.MustParse(q)
	}
	return r
}

func nodeAffinity(exprs ...corev1.NodeSelectorRequirement) *corev1.Affinity {
	return &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
		NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: exprs}},
	}}}
}

type resourceMap = map[corev1.ResourceName]string

var validateCases = map[string]struct {
	cfg Config
	// want are parts of the message; none: the config passes.
	want []string
}{
	"empty":    {cfg: Config{}},
	"defaults": {cfg: Config{}.withDefaults()},
	"every field good": {cfg: Config{
		Resources: resources(resourceMap{"cpu": "100m", "memory": "64Mi", "ephemeral-storage": "1Gi", "example.com/gpu": "1", "hugepages-2Mi": "4Mi"},
			resourceMap{"cpu": "1", "memory": "64Mi", "example.com/gpu": "1", "hugepages-2Mi": "4Mi"}),
		NodeSelector:     map[string]string{"egressproxy.io/egress": "true", "kubernetes.io/os": "linux", "zone": ""},
		ImagePullSecrets: []string{"regcred", "pull.example.com"},
		Tolerations: []corev1.Toleration{
			{Key: "egressproxy.io/egress", Operator: corev1.TolerationOpEqual, Value: "true", Effect: corev1.TaintEffectNoSchedule},
			{Key: "dedicated", Value: "egress"},
			{Key: "node.kubernetes.io/unreachable", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoExecute, TolerationSeconds: ptr.To[int64](30)},
			{Operator: corev1.TolerationOpExists},
		},
		Affinity: &corev1.Affinity{
			NodeAffinity: &corev1.NodeAffinity{
				RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
					MatchExpressions: []corev1.NodeSelectorRequirement{
						{Key: "egressproxy.io/egress", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}},
						{Key: "spot", Operator: corev1.NodeSelectorOpDoesNotExist},
						{Key: "cores", Operator: corev1.NodeSelectorOpGt, Values: []string{"4"}},
					},
					MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpNotIn, Values: []string{"node-1"}}},
				}}},
				PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{Weight: 100, Preference: corev1.NodeSelectorTerm{
					MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"any value: preferred terms are not checked"}}},
				}}},
			},
			PodAntiAffinity: &corev1.PodAntiAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.WeightedPodAffinityTerm{{
				Weight: 50,
				PodAffinityTerm: corev1.PodAffinityTerm{
					TopologyKey:   "kubernetes.io/hostname",
					LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelManagedBy: ManagedBy}},
					Namespaces:    []string{"egress"},
				},
			}}},
		},
	}},

	"request over its limit": {
		cfg:  Config{Resources: resources(resourceMap{"cpu": "2"}, resourceMap{"cpu": "1"})},
		want: []string{"spec.kubernetes.resources.requests.cpu: 2 is more than its limit 1"},
	},
	"memory request over its limit": {
		cfg:  Config{Resources: resources(resourceMap{"memory": "1Gi"}, resourceMap{"memory": "512Mi"})},
		want: []string{"spec.kubernetes.resources.requests.memory: 1Gi is more than its limit 512Mi"},
	},
	"negative quantity": {
		cfg:  Config{Resources: resources(resourceMap{"memory": "-64Mi"}, nil)},
		want: []string{"spec.kubernetes.resources.requests.memory: -64Mi is negative"},
	},
	"unknown resource": {
		cfg:  Config{Resources: resources(nil, resourceMap{"gpu": "1"})},
		want: []string{"spec.kubernetes.resources.limits.gpu:", `"gpu" is not a resource a container can ask for`},
	},
	"pods is not a container resource": {
		cfg:  Config{Resources: resources(resourceMap{"pods": "1"}, nil)},
		want: []string{"spec.kubernetes.resources.requests.pods:"},
	},
	"invalid resource name": {
		cfg:  Config{Resources: resources(nil, resourceMap{"bad name!": "1"})},
		want: []string{"spec.kubernetes.resources.limits.bad name!:", "not a valid resource name"},
	},
	"requests. prefix is not an extended resource": {
		cfg:  Config{Resources: resources(nil, resourceMap{"requests.example.com/gpu": "1"})},
		want: []string{"spec.kubernetes.resources.limits[requests.example.com/gpu]:", "not a valid extended resource name"},
	},
	"extended resource request without limit": {
		cfg:  Config{Resources: resources(resourceMap{"example.com/gpu": "1"}, nil)},
		want: []string{"spec.kubernetes.resources.requests[example.com/gpu]: 1 has no limit"},
	},
	"extended resource request below its limit": {
		cfg:  Config{Resources: resources(resourceMap{"example.com/gpu": "1"}, resourceMap{"example.com/gpu": "2"})},
		want: []string{"spec.kubernetes.resources.requests[example.com/gpu]: 1 is not equal to its limit 2"},
	},
	"extended resource fraction": {
		cfg:  Config{Resources: resources(nil, resourceMap{"example.com/gpu": "500m"})},
		want: []string{"spec.kubernetes.resources.limits[example.com/gpu]: 500m is not a whole number"},
	},
	"hugepages alone": {
		cfg:  Config{Resources: resources(nil, resourceMap{"hugepages-2Mi": "4Mi"})},
		want: []string{"spec.kubernetes.resources: hugepages need a cpu or memory"},
	},
	"hugepages not a multiple of the page": {
		cfg:  Config{Resources: resources(nil, resourceMap{"hugepages-2Mi": "3Mi", "memory": "1Gi"})},
		want: []string{"spec.kubernetes.resources.limits.hugepages-2Mi: 3Mi is not a whole number of 2Mi pages"},
	},
	"claims": {
		cfg:  Config{Resources: &corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}},
		want: []string{"spec.kubernetes.resources.claims: not supported"},
	},

	"nodeSelector value": {
		cfg:  Config{NodeSelector: map[string]string{"zone": "a b"}},
		want: []string{`spec.kubernetes.nodeSelector: key "zone": value "a b" is not a valid label value: `},
	},
	"nodeSelector key": {
		cfg:  Config{NodeSelector: map[string]string{"bad key!": "a"}},
		want: []string{`spec.kubernetes.nodeSelector: key "bad key!" is not a valid label key: `},
	},

	"toleration key": {
		cfg:  Config{Tolerations: []corev1.Toleration{{Key: "ok"}, {Key: "bad key!", Operator: corev1.TolerationOpExists}}},
		want: []string{`spec.kubernetes.tolerations[1].key: "bad key!" is not a valid taint key: `},
	},
	"toleration operator": {
		cfg:  Config{Tolerations: []corev1.Toleration{{Key: "k", Operator: "Lt", Value: "3"}}},
		want: []string{`spec.kubernetes.tolerations[0].operator: "Lt" is not supported: want Exists, Equal or empty`},
	},
	"toleration Exists with a value": {
		cfg:  Config{Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Value: "v"}}},
		want: []string{`spec.kubernetes.tolerations[0].value: must be empty when operator is Exists`},
	},
	"toleration Equal without a key": {
		cfg:  Config{Tolerations: []corev1.Toleration{{Value: "v"}}},
		want: []string{`spec.kubernetes.tolerations[0].operator: must be Exists when key is empty`},
	},
	"toleration value": {
		cfg:  Config{Tolerations: []corev1.Toleration{{Key: "k", Value: "a b"}}},
		want: []string{`spec.kubernetes.tolerations[0].value: "a b" is not a valid taint value`},
	},
	"toleration effect": {
		cfg:  Config{Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Effect: "NoScheduleNoAdmit"}}},
		want: []string{`spec.kubernetes.tolerations[0].effect: "NoScheduleNoAdmit" is not supported: want NoSchedule, PreferNoSchedule, NoExecute or empty`},
	},
	"tolerationSeconds without NoExecute": {
		cfg:  Config{Tolerations: []corev1.Toleration{{Key: "k", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule, TolerationSeconds: ptr.To[int64](30)}}},
		want: []string{`spec.kubernetes.tolerations[0].tolerationSeconds: applies to effect NoExecute only`},
	},

	// The API server takes any pull Secret name, and the pod runs without
	// one that does not exist: nothing that works today is refused.
	"imagePullSecrets any name": {
		cfg: Config{ImagePullSecrets: []string{"regcred", "Bad_Name", ""}},
	},

	"node affinity operator": {
		cfg:  Config{Affinity: nodeAffinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: "Is", Values: []string{"a"}})},
		want: []string{`spec.kubernetes.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0].matchExpressions[0].operator: "Is" is not supported`},
	},
	"node affinity key": {
		cfg:  Config{Affinity: nodeAffinity(corev1.NodeSelectorRequirement{Key: "bad key!", Operator: corev1.NodeSelectorOpExists})},
		want: []string{`nodeSelectorTerms[0].matchExpressions[0].key: "bad key!" is not a valid label key`},
	},
	"node affinity value": {
		cfg:  Config{Affinity: nodeAffinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a b"}})},
		want: []string{`nodeSelectorTerms[0].matchExpressions[0].values[0]: "a b" is not a valid label value`},
	},
	"node affinity In without values": {
		cfg:  Config{Affinity: nodeAffinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpIn})},
		want: []string{`nodeSelectorTerms[0].matchExpressions[0].values: must be set when operator is In`},
	},
	"node affinity Exists with values": {
		cfg:  Config{Affinity: nodeAffinity(corev1.NodeSelectorRequirement{Key: "zone", Operator: corev1.NodeSelectorOpExists, Values: []string{"a"}})},
		want: []string{`nodeSelectorTerms[0].matchExpressions[0].values: must be empty when operator is Exists`},
	},
	"node affinity without terms": {
		cfg:  Config{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{}}}},
		want: []string{`spec.kubernetes.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms: must have at least one term`},
	},
	"node affinity weight": {
		cfg: Config{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
			Weight: 0, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{{Key: "zone", Operator: corev1.NodeSelectorOpExists}}},
		}}}}},
		want: []string{`spec.kubernetes.affinity.nodeAffinity.preferredDuringSchedulingIgnoredDuringExecution[0].weight: 0 is out of range`},
	},
	"node affinity field": {
		cfg: Config{Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{RequiredDuringSchedulingIgnoredDuringExecution: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.labels", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}}}}},
		}}}},
		want: []string{`nodeSelectorTerms[0].matchFields[0].key: "metadata.labels" is not supported: want metadata.name`},
	},
	"pod anti-affinity selector": {
		cfg: Config{Affinity: &corev1.Affinity{PodAntiAffinity: &corev1.PodAntiAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			TopologyKey:   "kubernetes.io/hostname",
			LabelSelector: &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: "app", Operator: metav1.LabelSelectorOpIn}}},
		}}}}},
		want: []string{`spec.kubernetes.affinity.podAntiAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].labelSelector.matchExpressions[0].values`},
	},
	"pod affinity without topology key": {
		cfg: Config{Affinity: &corev1.Affinity{PodAffinity: &corev1.PodAffinity{RequiredDuringSchedulingIgnoredDuringExecution: []corev1.PodAffinityTerm{{
			LabelSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "db"}},
		}}}}},
		want: []string{`spec.kubernetes.affinity.podAffinity.requiredDuringSchedulingIgnoredDuringExecution[0].topologyKey: is required`},
	},

	"several problems": {
		cfg: Config{
			Resources:    resources(resourceMap{"cpu": "2"}, resourceMap{"cpu": "1"}),
			NodeSelector: map[string]string{"zone": "a b"},
			Tolerations:  []corev1.Toleration{{Key: "bad key!", Operator: corev1.TolerationOpExists}},
		},
		want: []string{"spec.kubernetes.resources.requests.cpu: 2 is more than its limit 1; spec.kubernetes.nodeSelector: ", "; spec.kubernetes.tolerations[0].key: "},
	},
}

// TestConfigValidate: each value the API server would refuse in the pod
// template is refused, Permanent, by the field the user wrote; good values
// pass.
func TestConfigValidate(t *testing.T) {
	for name, tc := range validateCases {
		t.Run(name, func(t *testing.T) {
			err := tc.cfg.validate()
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("validate() = %v; want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("validate() = nil; want an error naming %q", tc.want)
			}
			if !proxy.IsPermanent(err) {
				t.Errorf("validate() = %v of class %s; want Permanent", err, proxy.ClassOf(err))
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("validate() = %q; want it to hold %q", err, w)
				}
			}
		})
	}
}

// TestValidateCapsItsMessage: a config with many bad values names the
// first few and counts the rest.
func TestValidateCapsItsMessage(t *testing.T) {
	var c Config
	for range 7 {
		c.Tolerations = append(c.Tolerations, corev1.Toleration{Key: "bad key!", Operator: corev1.TolerationOpExists})
	}
	err := c.validate()
	if err == nil || !strings.Contains(err.Error(), "tolerations[4]") || strings.Contains(err.Error(), "tolerations[5]") || !strings.HasSuffix(err.Error(), "; and 2 more") {
		t.Errorf("validate() = %v; want the first %d problems and a count of the rest", err, maxProblems)
	}
}

var badConfig = Config{Namespace: "egress", Resources: resources(resourceMap{"cpu": "2"}, resourceMap{"cpu": "1"})}

const badConfigMessage = "spec.kubernetes.resources.requests.cpu: 2 is more than its limit 1"

// TestCreateAndUpdateRefuseAnInvalidConfigBeforeAnyRequest: Create and
// Update of a driver whose config the API server would refuse fail,
// Permanent, naming the field, without a request; for a tenant's cluster
// (quiet) too, whose server's messages are hidden but not the provider's
// own.
func TestCreateAndUpdateRefuseAnInvalidConfigBeforeAnyRequest(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		d, _, c := countingDriver(t)
		d.cfg = badConfig.withDefaults()
		d.quiet = quiet
		_, err := d.Create(context.Background(), testRequest())
		if err == nil || !proxy.IsPermanent(err) || !strings.Contains(err.Error(), badConfigMessage) {
			t.Errorf("quiet %v: Create = %v; want Permanent, naming %q", quiet, err, badConfigMessage)
		}
		_, err = d.Update(context.Background(), proxy.Ref{Name: testRequest().Name, ID: "egress/" + testRequest().Name}, testRequest())
		if err == nil || !proxy.IsPermanent(err) || !strings.Contains(err.Error(), badConfigMessage) {
			t.Errorf("quiet %v: Update = %v; want Permanent, naming %q", quiet, err, badConfigMessage)
		}
		if got := c.sorted(); len(got) != 0 {
			t.Errorf("quiet %v: requests %v; want none", quiet, got)
		}
	}
}

// TestCheckReportsAnInvalidConfig: the config's health says what Create
// would refuse, so the config does not read Healthy.
func TestCheckReportsAnInvalidConfig(t *testing.T) {
	d, _, _ := countingDriver(t)
	d.cfg = badConfig.withDefaults()
	h := d.Check(context.Background())
	if h.Healthy() || len(h.Targets) != 1 || h.Targets[0].Reason != ReasonInvalidConfig || !strings.Contains(h.Targets[0].Message, badConfigMessage) {
		t.Errorf("Check = %+v; want unhealthy, %s, naming %q", h, ReasonInvalidConfig, badConfigMessage)
	}
}

// invalidDriver is a driver over a fake API server that refuses every
// Deployment write with 422 Invalid, its message holding a sentinel.
func invalidDriver(t *testing.T, quiet bool, objs ...client.Object) *Driver {
	t.Helper()
	invalid := kerrors.NewInvalid(schema.GroupKind{Group: "apps", Kind: "Deployment"}, "p", field.ErrorList{
		field.Invalid(field.NewPath("spec", "template", "spec", "affinity"), "x", "SENTINEL-server-words"),
	})
	fc := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).WithObjects(objs...).WithInterceptorFuncs(interceptor.Funcs{
		Create: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*appsv1.Deployment); ok {
				return invalid
			}
			return cl.Create(ctx, obj, opts...)
		},
		Update: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if _, ok := obj.(*appsv1.Deployment); ok {
				return invalid
			}
			return cl.Update(ctx, obj, opts...)
		},
	}).Build()
	d := New(Options{Provider: "ProviderConfig team-a/pods", Config: Config{Namespace: "egress"}, Client: fc, Live: fc})
	d.taken = &taken{}
	d.quiet = quiet
	return d
}

// TestRefusedDeploymentNamesTheConfigFields: what local checks miss and
// the server refuses (422 Invalid) on a Deployment write is, for a
// tenant's cluster, reported without the server's words but with the
// config fields that feed the Deployment; a platform config's driver
// quotes the server.
func TestRefusedDeploymentNamesTheConfigFields(t *testing.T) {
	req := testRequest()
	ctx := context.Background()

	_, err := invalidDriver(t, true).Create(ctx, req)
	if err == nil || !proxy.IsPermanent(err) || strings.Contains(err.Error(), "SENTINEL") ||
		!strings.Contains(err.Error(), "answered 422 Invalid (its message is not shown to tenants) to the create of Deployment egress/"+req.Name) ||
		!strings.Contains(err.Error(), "check spec.kubernetes.resources, nodeSelector, tolerations, affinity and imagePullSecrets") {
		t.Errorf("quiet Create = %v; want Permanent, the status without the server's words, and the config fields", err)
	}
	var status kerrors.APIStatus
	if !errors.As(err, &status) || !kerrors.IsInvalid(err) {
		t.Errorf("quiet Create = %v; want it to unwrap to the 422", err)
	}

	_, err = invalidDriver(t, false).Create(ctx, req)
	if err == nil || !strings.Contains(err.Error(), "cannot create Deployment egress/"+req.Name+": ") || !strings.Contains(err.Error(), "SENTINEL-server-words") {
		t.Errorf("platform Create = %v; want the server's words", err)
	}

	// Update of an existing proxy after the config changed.
	files := render(t, req)
	dep := buildDeployment(Config{Namespace: "egress"}, req, files, "old", now)
	dep.Annotations[AnnotationTemplateHash] = "stale"
	_, err = invalidDriver(t, true, dep).Update(ctx, proxy.Ref{Name: req.Name, ID: "egress/" + req.Name}, req)
	if err == nil || strings.Contains(err.Error(), "SENTINEL") || !strings.Contains(err.Error(), "to the update of Deployment egress/"+req.Name) ||
		!strings.Contains(err.Error(), "check spec.kubernetes.resources, nodeSelector, tolerations, affinity and imagePullSecrets") {
		t.Errorf("quiet Update = %v; want the status without the server's words, and the config fields", err)
	}
}

// TestQuietStatusHintsOnlyAtDeployments: a 422 of another write, or
// another status of a Deployment write, carries no hint.
func TestQuietStatusHintsOnlyAtDeployments(t *testing.T) {
	invalid := kerrors.NewInvalid(schema.GroupKind{Kind: "Secret"}, "p", nil)
	for name, err := range map[string]error{
		"secret 422":     invalid,
		"deployment 403": &deploymentWriteError{verb: "create", key: client.ObjectKey{Namespace: "n", Name: "p"}, err: kerrors.NewForbidden(schema.GroupResource{Resource: "deployments"}, "p", errors.New("no"))},
	} {
		if got := quietStatus(err).Error(); strings.Contains(got, "check spec.kubernetes") {
			t.Errorf("%s: quietStatus = %q; want no hint", name, got)
		}
	}
}

// TestOwnWordsPassQuietly: a tenant's driver hides what a server said,
// never the provider's own words (a namespace missing, a bad value of the
// config or request), which name what to fix.
func TestOwnWordsPassQuietly(t *testing.T) {
	for _, err := range []error{
		plainly(proxy.ClassPermanent, "namespace %q does not exist in the target cluster: create it", "egress"),
		badConfig.validate(),
		checkRequest(proxy.Request{Name: "Not_A_Label"}),
	} {
		d := &Driver{quiet: true, provider: "ProviderConfig team-a/pods"}
		got := d.wrap(err, "create")
		if !strings.Contains(got.Error(), err.Error()) || strings.Contains(got.Error(), "not shown") {
			t.Errorf("a tenant's driver says %q; want the provider's own words %q", got, err)
		}
	}
}
