package kubernetes

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
	"github.com/egressproxy/provider-egressproxy/internal/squid"
)

func withCheck(url string) proxy.Request {
	req := testRequest()
	req.Proxy.EgressCheck = &proxy.EgressCheck{URL: url, Username: squid.CheckUsername, Password: "sentinel-check-password"}
	return req
}

// Where the provider reaches neither the pods nor a load balancer, the pod
// runs the reporting container, which alone mounts the check's request.
func TestReportingContainer(t *testing.T) {
	remote := New(Options{Config: Config{Namespace: "egress", EgressCheck: true}, Now: func() time.Time { return now }})
	local := New(Options{Config: Config{Namespace: "egress", EgressCheck: true}, DialPods: true, Now: func() time.Time { return now }})
	req := withCheck("http://echo.example.com/ip")
	files := render(t, req)

	dep := remote.buildDeployment(req, files, "h")
	cs := dep.Spec.Template.Spec.Containers
	if len(cs) != 2 || cs[1].Name != ReportContainerName || cs[1].Image != DefaultImage {
		t.Fatalf("containers %v; want squid and %s of the same image", names(cs), ReportContainerName)
	}
	r := cs[1]
	if r.Command[0] != "/bin/bash" || r.Command[2] != squid.ReportLoop || !slices.Equal(r.Command[3:], []string{ReportContainerName, ReportMountPath + "/" + KeyEgressCheck, "3128", "3600"}) {
		t.Errorf("reporter command %q", r.Command)
	}
	if sc := r.SecurityContext; !*sc.RunAsNonRoot || *sc.AllowPrivilegeEscalation || !*sc.ReadOnlyRootFilesystem || len(sc.Capabilities.Drop) != 1 {
		t.Errorf("reporter security context %+v; want Squid's: non-root, read-only, no capabilities", sc)
	}
	for _, m := range cs[0].VolumeMounts {
		if m.Name == ReportContainerName {
			t.Error("the Squid container mounts the check's request")
		}
	}
	var vol *corev1.Volume
	for i, v := range dep.Spec.Template.Spec.Volumes {
		if v.Name == ReportContainerName {
			vol = &dep.Spec.Template.Spec.Volumes[i]
		}
	}
	if vol == nil || vol.Secret.SecretName != req.Name || len(vol.Secret.Items) != 1 || vol.Secret.Items[0].Key != KeyEgressCheck {
		t.Errorf("reporter volume %+v; want the one key %s of the proxy's Secret", vol, KeyEgressCheck)
	}
	if strings.Contains(strings.Join(r.Command, " "), "sentinel-check-password") {
		t.Error("the check's password is in the pod spec")
	}
	sec := remote.buildSecret(dep, req, files)
	want, _ := squid.ReportRequest(*req.Proxy.EgressCheck)
	if string(sec.Data[KeyEgressCheck]) != want {
		t.Errorf("Secret %s = %q; want %q", KeyEgressCheck, sec.Data[KeyEgressCheck], want)
	}
	// Update writes the Secret before the Deployment: the key is there
	// for the Deployment that does not run the reporter yet.
	if sec := remote.buildSecret(buildDeployment(remote.cfg, req, files, "h", now), req, files); sec.Data[KeyEgressCheck] == nil {
		t.Error("the Secret written before the Deployment gains the reporter lacks the request")
	}

	for name, tc := range map[string]struct {
		d   *Driver
		req proxy.Request
	}{
		"ThisCluster":  {local, req},
		"NoCheck":      {remote, testRequest()},
		"HTTPSEcho":    {remote, withCheck("https://api.ipify.org/")},
		"LoadBalancer": {remote, func() proxy.Request { r := req; r.Extension = Exposure{ServiceType: "LoadBalancer"}; return r }()},
	} {
		t.Run(name, func(t *testing.T) {
			f := render(t, tc.req)
			dep := tc.d.buildDeployment(tc.req, f, "h")
			if n := len(dep.Spec.Template.Spec.Containers); n != 1 {
				t.Errorf("%d containers; want Squid alone", n)
			}
			if _, ok := tc.d.buildSecret(dep, tc.req, f).Data[KeyEgressCheck]; ok {
				t.Error("the Secret holds the check's request")
			}
		})
	}

	if ps := remote.reportPermissions(); len(ps) != 1 || ps[0] != (Permission{Resource: "pods/log", Verb: "get", Namespace: "egress"}) {
		t.Errorf("remote report permissions %v; want get pods/log in egress", ps)
	}
	if ps := local.reportPermissions(); ps != nil {
		t.Errorf("this cluster's report permissions %v; want none", ps)
	}
	if ps := New(Options{Config: Config{Namespace: "egress"}}).reportPermissions(); ps != nil {
		t.Errorf("report permissions without a check %v; want none", ps)
	}
}

func names(cs []corev1.Container) []string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Name)
	}
	return n
}

// The report is read from the serving pod's reporting container's log and
// published only when it is one valid address, or says why the check
// failed in the provider's words; the time is the kubelet's, never later
// than now.
func TestReadReport(t *testing.T) {
	req := withCheck("http://echo.example.com/ip")
	for name, tc := range map[string]struct {
		log         string
		err         error
		wantIP      string
		wantAt      time.Time
		wantFailure string
		noAsked     bool
	}{
		"Address": {log: "2026-11-29T11:59:00Z " + squid.ReportMarker + " 1 200 203.0.113.9\n", wantIP: "203.0.113.9", wantAt: now.Add(-time.Minute)},
		"Future":  {log: "2026-11-29T13:00:00Z " + squid.ReportMarker + " 1 200 203.0.113.9\n", wantIP: "203.0.113.9", wantAt: now},
		"Failed": {log: "2026-11-29T11:59:00Z " + squid.ReportMarker + " 1 000 \n",
			wantAt: now.Add(-time.Minute), wantFailure: "the instance's own Squid did not answer the check"},
		"EchoDown": {log: "2026-11-29T11:59:00Z " + squid.ReportMarker + " 1 502 <html>sentinel</html>\n",
			wantAt: now.Add(-time.Minute), wantFailure: "the check through the instance's own Squid was answered 502"},
		"Malformed": {log: "2026-11-29T11:59:00Z " + squid.ReportMarker + " 1 200 <html>sentinel</html>\n"},
		"None":      {log: "2026-11-29T11:59:00Z starting\n"},
		"NoLog":     {err: errors.New("forbidden")},
	} {
		t.Run(name, func(t *testing.T) {
			var asked []string
			d := New(Options{Config: Config{Namespace: "egress", EgressCheck: true}, Now: func() time.Time { return now },
				PodLog: func(_ context.Context, ns, pod, container string, tail, limit int64) ([]byte, error) {
					asked = append(asked, ns+"/"+pod+"/"+container)
					if tail > 10 || limit > squid.MaxReport {
						t.Errorf("log read of %d lines, %d bytes; want a capped tail", tail, limit)
					}
					return []byte(tc.log), tc.err
				}})
			dep := d.buildDeployment(req, render(t, req), "h")
			dep.ObjectMeta = metav1.ObjectMeta{Namespace: "egress", Name: req.Name}
			inst := proxy.Instance{Details: map[string]string{"pod": "p-1"}}
			d.readReport(context.Background(), dep, &inst)
			if !slices.Equal(asked, []string{"egress/p-1/" + ReportContainerName}) {
				t.Errorf("log reads %v", asked)
			}
			if inst.EgressIP != tc.wantIP || (tc.wantIP != "" && (inst.EgressSource != proxy.EgressReported || !inst.EgressCheckedAt.Equal(tc.wantAt))) {
				t.Errorf("egress %q %q %v; want %q Reported at %v", inst.EgressIP, inst.EgressSource, inst.EgressCheckedAt, tc.wantIP, tc.wantAt)
			}
			if tc.wantIP == "" && inst.EgressSource != "" {
				t.Errorf("source %q without an address", inst.EgressSource)
			}
			if inst.EgressFailure != tc.wantFailure || (tc.wantFailure != "" && !inst.EgressCheckedAt.Equal(tc.wantAt)) {
				t.Errorf("egress failure %q at %v; want %q at %v", inst.EgressFailure, inst.EgressCheckedAt, tc.wantFailure, tc.wantAt)
			}
		})
	}
	// A Deployment without the reporter: no read.
	d := New(Options{PodLog: func(context.Context, string, string, string, int64, int64) ([]byte, error) {
		t.Error("read the log of a pod without a reporter")
		return nil, nil
	}})
	d.readReport(context.Background(), &appsv1.Deployment{}, &proxy.Instance{Details: map[string]string{"pod": "p"}})
}

// TestNoReportOfAPodOfThePreviousConfiguration: while a new configuration
// rolls out (another echo URL) and only a pod of the one before serves,
// Get reads no report: the old pod's check was made with the settings
// before, and its answer is not the current check's word. Once a pod of
// the current configuration serves, its report is read.
func TestNoReportOfAPodOfThePreviousConfiguration(t *testing.T) {
	req := withCheck("http://echo.example.com/ip")
	for name, tc := range map[string]struct {
		podHash string // the serving pod's config hash; "" for the Deployment's
		wantIP  string
	}{
		"APodOfThePreviousConfiguration": {podHash: "older"},
		"APodOfTheCurrentConfiguration":  {wantIP: "203.0.113.9"},
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			fc := fake.NewClientBuilder().WithScheme(clientgoscheme.Scheme).Build()
			var asked []string
			d := New(Options{Provider: "ClusterProviderConfig pods", Config: Config{Namespace: "egress", EgressCheck: true}, Client: fc, Live: fc,
				Now: func() time.Time { return now },
				PodLog: func(_ context.Context, _, pod, _ string, _, _ int64) ([]byte, error) {
					asked = append(asked, pod)
					return []byte(now.Add(-time.Minute).Format(time.RFC3339) + " " + squid.ReportMarker + " 1 200 203.0.113.9\n"), nil
				}})
			d.taken = &taken{}
			inst, err := d.Create(ctx, req)
			if err != nil {
				t.Fatal(err)
			}
			dep := &appsv1.Deployment{}
			if err := fc.Get(ctx, client.ObjectKey{Namespace: "egress", Name: req.Name}, dep); err != nil {
				t.Fatal(err)
			}
			hash := tc.podHash
			if hash == "" {
				hash = dep.Spec.Template.Annotations[AnnotationConfigHash]
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "egress", Name: "p-1", Labels: map[string]string{LabelName: req.Name, LabelUID: req.Mark.UID},
				Annotations: map[string]string{AnnotationConfigHash: hash}}}
			if err := fc.Create(ctx, pod); err != nil {
				t.Fatal(err)
			}
			pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.1.0.5", Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}}
			if err := fc.Status().Update(ctx, pod); err != nil {
				t.Fatal(err)
			}
			got, err := d.Get(ctx, proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark})
			if err != nil {
				t.Fatal(err)
			}
			if got.State != proxy.StateRunning || got.EgressIP != tc.wantIP || (tc.wantIP == "" && (got.EgressSource != "" || len(asked) > 0)) {
				t.Errorf("Get = %s, egress %q %q (logs read: %v); want Running, egress %q", got.State, got.EgressIP, got.EgressSource, asked, tc.wantIP)
			}
		})
	}
}
