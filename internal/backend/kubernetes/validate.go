package kubernetes

import (
	"fmt"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	metav1validation "k8s.io/apimachinery/pkg/apis/meta/v1/validation"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// configPath is where the config's kubernetes block is, as the user writes
// it: every message of validate names a field under it.
const configPath = "spec.kubernetes"

// maxProblems is how many problems one message names at most.
const maxProblems = 5

// ownWords is a message in the provider's own words, made from the config
// and the request alone (field paths and values, none of them secret,
// never what a server said): a tenant's driver shows it as it is
// (quietStatus). A value of the config's kubernetes block that the API
// server would refuse in a pod template is one.
type ownWords struct{ msg string }

func (e *ownWords) Error() string { return e.msg }

// plainly is a classified error in the provider's own words (ownWords):
// args must come from the config or the request, never from a server.
func plainly(class proxy.Class, format string, args ...any) error {
	return &proxy.Error{Class: class, Err: &ownWords{msg: fmt.Sprintf(format, args...)}}
}

// validate checks what the config puts into every proxy's pod template as
// it is (resources, nodeSelector, tolerations, affinity, imagePullSecrets)
// with the API server's rules for a pod, so that a value it would refuse
// is named by the field the user wrote, before any request: the server's
// 422 names the Deployment's fields instead, and for a namespaced config
// its message is not shown at all (quietStatus). What is checked is what
// is cheap to check: the rest of affinity is left to the server (see
// deploymentWriteError). nil when every value passes.
func (c Config) validate() error {
	var p problems
	p.resources(c.Resources)
	p.nodeSelector(c.NodeSelector)
	p.tolerations(c.Tolerations)
	p.affinity(c.Affinity)
	return p.err()
}

// problems collects "path: what is wrong" lines.
type problems []string

func (p *problems) add(path, format string, args ...any) {
	*p = append(*p, path+": "+fmt.Sprintf(format, args...))
}

func (p *problems) addField(errs field.ErrorList) {
	for _, e := range errs {
		*p = append(*p, e.Error())
	}
}

func (p problems) err() error {
	if len(p) == 0 {
		return nil
	}
	msg := strings.Join(p[:min(len(p), maxProblems)], "; ")
	if len(p) > maxProblems {
		msg += fmt.Sprintf("; and %d more", len(p)-maxProblems)
	}
	return plainly(proxy.ClassPermanent, "%s", msg)
}

// reasons joins what a k8s.io/apimachinery/pkg/util/validation check said.
func reasons(msgs []string) string { return strings.Join(msgs, "; ") }

// resourceKey is the path of a resource name in requests or limits: a
// plain name as a field, a domain-prefixed one in brackets.
func resourceKey(base string, name corev1.ResourceName) string {
	if strings.ContainsAny(string(name), "./") {
		return base + "[" + string(name) + "]"
	}
	return base + "." + string(name)
}

// resources are the API server's rules for a container's resources
// (ValidateContainerResourceRequirements): names a container may ask for,
// no negative quantity, whole numbers of an extended resource, a hugepages
// quantity a multiple of its page size, each request at most its limit
// (equal to it for extended resources and hugepages, which need a limit),
// and no claims (the proxy's pods declare none).
func (p *problems) resources(r *corev1.ResourceRequirements) {
	if r == nil {
		return
	}
	base := configPath + ".resources"
	hugePages, cpuOrMemory := false, false
	for _, part := range []struct {
		name string
		list corev1.ResourceList
	}{{"limits", r.Limits}, {"requests", r.Requests}} {
		for _, name := range sortedNames(part.list) {
			q := part.list[name]
			path := resourceKey(base+"."+part.name, name)
			if msg := containerResourceName(name); msg != "" {
				p.add(path, "%s", msg)
				continue
			}
			if q.Sign() < 0 {
				p.add(path, "%s is negative", q.String())
				continue
			}
			if isExtendedResource(name) && q.MilliValue()%1000 != 0 {
				p.add(path, "%s is not a whole number, which an extended resource must be", q.String())
			}
			if isHugePages(name) {
				hugePages = true
				if msg := hugePagesValue(name, q); msg != "" {
					p.add(path, "%s", msg)
				}
			}
			if name == corev1.ResourceCPU || name == corev1.ResourceMemory {
				cpuOrMemory = true
			}
			if part.name != "requests" {
				continue
			}
			limit, ok := r.Limits[name]
			switch {
			case !ok && !overcommitAllowed(name):
				p.add(path, "%s has no limit: set %s to the same quantity (%s cannot be overcommitted)", q.String(), resourceKey(base+".limits", name), name)
			case !ok:
			case !overcommitAllowed(name) && q.Cmp(limit) != 0:
				p.add(path, "%s is not equal to its limit %s (%s cannot be overcommitted)", q.String(), limit.String(), name)
			case q.Cmp(limit) > 0:
				p.add(path, "%s is more than its limit %s", q.String(), limit.String())
			}
		}
	}
	if hugePages && !cpuOrMemory {
		p.add(base, "hugepages need a cpu or memory request or limit too")
	}
	if len(r.Claims) > 0 {
		p.add(base+".claims", "not supported: the proxy's pods declare no resource claims")
	}
}

func sortedNames(l corev1.ResourceList) []corev1.ResourceName {
	names := make([]corev1.ResourceName, 0, len(l))
	for n := range l {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// containerResourceName is why a container may not ask for name
// (validateContainerResourceName of the API server); "" when it may.
func containerResourceName(name corev1.ResourceName) string {
	const want = "want cpu, memory, ephemeral-storage, hugepages-<size> or an extended resource such as example.com/gpu"
	if msgs := validation.IsQualifiedName(string(name)); len(msgs) > 0 {
		return fmt.Sprintf("%q is not a valid resource name: %s (%s)", name, reasons(msgs), want)
	}
	if !strings.Contains(string(name), "/") {
		switch {
		case name == corev1.ResourceCPU, name == corev1.ResourceMemory, name == corev1.ResourceEphemeralStorage, isHugePages(name):
			return ""
		}
		return fmt.Sprintf("%q is not a resource a container can ask for: %s", name, want)
	}
	if !isNativeResource(name) && !isExtendedResource(name) {
		return fmt.Sprintf("%q is not a valid extended resource name (%s)", name, want)
	}
	return ""
}

func isHugePages(name corev1.ResourceName) bool {
	return strings.HasPrefix(string(name), corev1.ResourceHugePagesPrefix)
}

// isNativeResource: unprefixed, or in the kubernetes.io/ namespace.
func isNativeResource(name corev1.ResourceName) bool {
	return !strings.Contains(string(name), "/") || strings.Contains(string(name), corev1.ResourceDefaultNamespacePrefix)
}

// isExtendedResource: a qualified name outside kubernetes.io/ that quota
// can name (requests.<name>).
func isExtendedResource(name corev1.ResourceName) bool {
	if isNativeResource(name) || strings.HasPrefix(string(name), corev1.DefaultResourceRequestsPrefix) {
		return false
	}
	return len(validation.IsQualifiedName(corev1.DefaultResourceRequestsPrefix+string(name))) == 0
}

// overcommitAllowed: a request may be below its limit (native resources
// other than hugepages).
func overcommitAllowed(name corev1.ResourceName) bool {
	return isNativeResource(name) && !isHugePages(name)
}

// hugePagesValue is why q is not a quantity of name's pages; "" when it is.
func hugePagesValue(name corev1.ResourceName, q resource.Quantity) string {
	size, err := resource.ParseQuantity(strings.TrimPrefix(string(name), corev1.ResourceHugePagesPrefix))
	if err != nil || size.Sign() <= 0 || size.MilliValue()%1000 != 0 {
		return fmt.Sprintf("%q does not name a page size: want hugepages-2Mi or hugepages-1Gi, say", name)
	}
	if q.Value()%size.Value() != 0 {
		return fmt.Sprintf("%s is not a whole number of %s pages", q.String(), size.String())
	}
	return ""
}

// nodeSelector: label keys and values.
func (p *problems) nodeSelector(sel map[string]string) {
	path := configPath + ".nodeSelector"
	keys := make([]string, 0, len(sel))
	for k := range sel {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if msgs := validation.IsQualifiedName(k); len(msgs) > 0 {
			p.add(path, "key %q is not a valid label key: %s", k, reasons(msgs))
		}
		if msgs := validation.IsValidLabelValue(sel[k]); len(msgs) > 0 {
			p.add(path, "key %q: value %q is not a valid label value: %s", k, sel[k], reasons(msgs))
		}
	}
}

// tolerations are the API server's rules (ValidateTolerations) without the
// numeric operators Lt and Gt, which it refuses unless a feature gate
// admits them.
func (p *problems) tolerations(ts []corev1.Toleration) {
	for i, t := range ts {
		path := fmt.Sprintf("%s.tolerations[%d]", configPath, i)
		if t.Key != "" {
			if msgs := validation.IsQualifiedName(t.Key); len(msgs) > 0 {
				p.add(path+".key", "%q is not a valid taint key: %s", t.Key, reasons(msgs))
			}
		}
		switch t.Operator {
		case corev1.TolerationOpEqual, "":
			if t.Key == "" {
				p.add(path+".operator", "must be Exists when key is empty (a toleration without a key tolerates every taint)")
			}
			if msgs := validation.IsValidLabelValue(t.Value); len(msgs) > 0 {
				p.add(path+".value", "%q is not a valid taint value: %s", t.Value, reasons(msgs))
			}
		case corev1.TolerationOpExists:
			if t.Value != "" {
				p.add(path+".value", "must be empty when operator is Exists (it is %q)", t.Value)
			}
		default:
			p.add(path+".operator", "%q is not supported: want Exists, Equal or empty (Equal)", t.Operator)
		}
		switch t.Effect {
		case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute, "":
		default:
			p.add(path+".effect", "%q is not supported: want NoSchedule, PreferNoSchedule, NoExecute or empty (all three)", t.Effect)
		}
		if t.TolerationSeconds != nil && t.Effect != corev1.TaintEffectNoExecute {
			p.add(path+".tolerationSeconds", "applies to effect NoExecute only (effect is %q)", t.Effect)
		}
	}
}

// affinity checks what is cheap to check of the API server's rules: node
// affinity's terms (operators, keys, values, weights) and pod
// (anti-)affinity's label selectors, topology keys and weights. What else
// the server refuses is named by deploymentWriteError's hint.
func (p *problems) affinity(a *corev1.Affinity) {
	if a == nil {
		return
	}
	path := field.NewPath("spec", "kubernetes", "affinity")
	if na := a.NodeAffinity; na != nil {
		np := path.Child("nodeAffinity")
		if req := na.RequiredDuringSchedulingIgnoredDuringExecution; req != nil {
			rp := np.Child("requiredDuringSchedulingIgnoredDuringExecution", "nodeSelectorTerms")
			if len(req.NodeSelectorTerms) == 0 {
				p.add(rp.String(), "must have at least one term")
			}
			for i, term := range req.NodeSelectorTerms {
				p.nodeSelectorTerm(term, true, rp.Index(i))
			}
		}
		for i, term := range na.PreferredDuringSchedulingIgnoredDuringExecution {
			tp := np.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i)
			p.weight(term.Weight, tp.Child("weight"))
			// The server takes any value in a preference.
			p.nodeSelectorTerm(term.Preference, false, tp.Child("preference"))
		}
	}
	if pa := a.PodAffinity; pa != nil {
		p.podAffinityTerms(pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution, path.Child("podAffinity"))
	}
	if pa := a.PodAntiAffinity; pa != nil {
		p.podAffinityTerms(pa.RequiredDuringSchedulingIgnoredDuringExecution, pa.PreferredDuringSchedulingIgnoredDuringExecution, path.Child("podAntiAffinity"))
	}
}

func (p *problems) weight(w int32, path *field.Path) {
	if w < 1 || w > 100 {
		p.add(path.String(), "%d is out of range: want 1 to 100", w)
	}
}

// nodeSelectorTerm is ValidateNodeSelectorTerm of the API server; values
// are label values only where checkValues (a required term).
func (p *problems) nodeSelectorTerm(term corev1.NodeSelectorTerm, checkValues bool, path *field.Path) {
	for i, rq := range term.MatchExpressions {
		ep := path.Child("matchExpressions").Index(i)
		switch rq.Operator {
		case corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn:
			if len(rq.Values) == 0 {
				p.add(ep.Child("values").String(), "must be set when operator is %s", rq.Operator)
			}
		case corev1.NodeSelectorOpExists, corev1.NodeSelectorOpDoesNotExist:
			if len(rq.Values) > 0 {
				p.add(ep.Child("values").String(), "must be empty when operator is %s", rq.Operator)
			}
		case corev1.NodeSelectorOpGt, corev1.NodeSelectorOpLt:
			if len(rq.Values) != 1 {
				p.add(ep.Child("values").String(), "must hold exactly one value when operator is %s", rq.Operator)
			}
		default:
			p.add(ep.Child("operator").String(), "%q is not supported: want In, NotIn, Exists, DoesNotExist, Gt or Lt", rq.Operator)
		}
		if msgs := validation.IsQualifiedName(rq.Key); len(msgs) > 0 {
			p.add(ep.Child("key").String(), "%q is not a valid label key: %s", rq.Key, reasons(msgs))
		}
		if checkValues {
			for j, v := range rq.Values {
				if msgs := validation.IsValidLabelValue(v); len(msgs) > 0 {
					p.add(ep.Child("values").Index(j).String(), "%q is not a valid label value: %s", v, reasons(msgs))
				}
			}
		}
	}
	for i, rq := range term.MatchFields {
		fp := path.Child("matchFields").Index(i)
		switch rq.Operator {
		case corev1.NodeSelectorOpIn, corev1.NodeSelectorOpNotIn:
			if len(rq.Values) != 1 {
				p.add(fp.Child("values").String(), "must hold exactly one value when operator is %s", rq.Operator)
			}
		default:
			p.add(fp.Child("operator").String(), "%q is not supported for a field: want In or NotIn", rq.Operator)
		}
		if rq.Key != metav1.ObjectNameField {
			p.add(fp.Child("key").String(), "%q is not supported: want %s", rq.Key, metav1.ObjectNameField)
			continue
		}
		for j, v := range rq.Values {
			if msgs := validation.IsDNS1123Subdomain(v); len(msgs) > 0 {
				p.add(fp.Child("values").Index(j).String(), "%q is not a valid node name: %s", v, reasons(msgs))
			}
		}
	}
}

func (p *problems) podAffinityTerms(required []corev1.PodAffinityTerm, preferred []corev1.WeightedPodAffinityTerm, path *field.Path) {
	for i, t := range required {
		p.podAffinityTerm(t, path.Child("requiredDuringSchedulingIgnoredDuringExecution").Index(i))
	}
	for i, t := range preferred {
		tp := path.Child("preferredDuringSchedulingIgnoredDuringExecution").Index(i)
		p.weight(t.Weight, tp.Child("weight"))
		p.podAffinityTerm(t.PodAffinityTerm, tp.Child("podAffinityTerm"))
	}
}

func (p *problems) podAffinityTerm(t corev1.PodAffinityTerm, path *field.Path) {
	opts := metav1validation.LabelSelectorValidationOptions{}
	p.addField(metav1validation.ValidateLabelSelector(t.LabelSelector, opts, path.Child("labelSelector")))
	p.addField(metav1validation.ValidateLabelSelector(t.NamespaceSelector, opts, path.Child("namespaceSelector")))
	for i, ns := range t.Namespaces {
		if msgs := validation.IsDNS1123Label(ns); len(msgs) > 0 {
			p.add(path.Child("namespaces").Index(i).String(), "%q is not a valid namespace name: %s", ns, reasons(msgs))
		}
	}
	tk := path.Child("topologyKey").String()
	if t.TopologyKey == "" {
		p.add(tk, "is required (kubernetes.io/hostname or topology.kubernetes.io/zone, say)")
	} else if msgs := validation.IsQualifiedName(t.TopologyKey); len(msgs) > 0 {
		p.add(tk, "%q is not a valid label key: %s", t.TopologyKey, reasons(msgs))
	}
}
