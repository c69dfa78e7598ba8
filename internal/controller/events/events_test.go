package events

import (
	"context"
	"fmt"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
)

// sink is an API server's events as a record.EventSink sees it.
type sink struct {
	mu      sync.Mutex
	created []*corev1.Event
	patched int
	// slow, when set, is how long each request takes.
	slow time.Duration
	// refuse, when set, answers every create with this error.
	refuse error
	// tried counts the creates asked for, refused or not.
	tried int
}

func (s *sink) Create(e *corev1.Event) (*corev1.Event, error) {
	time.Sleep(s.slow)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tried++
	if s.refuse != nil {
		return nil, s.refuse
	}
	c := e.DeepCopy()
	c.ResourceVersion = "1"
	s.created = append(s.created, c)
	return c, nil
}

func (s *sink) Update(e *corev1.Event) (*corev1.Event, error) { return e, nil }

func (s *sink) Patch(e *corev1.Event, _ []byte) (*corev1.Event, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.patched++
	return e, nil
}

func (s *sink) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.created)
}

func pod(i int) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: fmt.Sprintf("p-%04d", i), UID: "uid"},
	}
}

func waitIdle(t *testing.T, b *Broadcaster) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for !b.Idle() {
		if time.Now().After(deadline) {
			t.Fatal("events still queued after 30 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestABurstIsSentWhole(t *testing.T) {
	// client-go's broadcaster drops what does not fit its 25-event channel
	// and 1,000-event queue: two thousand events at once over a slow
	// server lose most of them.
	b := New()
	b.Rate, b.Burst = 100000, 100000
	s := &sink{slow: time.Millisecond}
	b.StartRecordingToSink(s)
	defer b.Shutdown()
	sent, dropped := testutil.ToFloat64(sentTotal), testutil.ToFloat64(droppedTotal)
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	const n = 2000
	for i := range n {
		r.Event(pod(i), corev1.EventTypeNormal, "Created", "created")
	}
	waitIdle(t, b)
	if got := s.count(); got != n {
		t.Errorf("the server got %d of %d events", got, n)
	}
	if d := testutil.ToFloat64(sentTotal) - sent; d != n {
		t.Errorf("egressproxy_events_sent_total grew by %v, want %d", d, n)
	}
	if d := testutil.ToFloat64(droppedTotal) - dropped; d != 0 {
		t.Errorf("egressproxy_events_dropped_total grew by %v, want 0", d)
	}
}

func TestEventsAreSentAtTheRate(t *testing.T) {
	b := New()
	b.Rate, b.Burst = 100, 10
	s := &sink{}
	b.StartRecordingToSink(s)
	defer b.Shutdown()
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	start := time.Now()
	for i := range 60 {
		r.Event(pod(i), corev1.EventTypeNormal, "Created", "created")
	}
	waitIdle(t, b)
	// 10 at once, then 50 at 100 a second.
	if took := time.Since(start); took < 400*time.Millisecond {
		t.Errorf("60 events at 100 a second with a burst of 10 took %v, want at least 0.4 s", took)
	}
	if got := s.count(); got != 60 {
		t.Errorf("the server got %d of 60 events", got)
	}
}

func TestARepeatIsACount(t *testing.T) {
	b := New()
	s := &sink{}
	b.StartRecordingToSink(s)
	defer b.Shutdown()
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	r.Event(pod(1), corev1.EventTypeWarning, "CannotConnect", "refused")
	waitIdle(t, b)
	r.Event(pod(1), corev1.EventTypeWarning, "CannotConnect", "refused")
	waitIdle(t, b)
	if s.count() != 1 || s.patched != 1 {
		t.Errorf("an event repeated: %d created, %d patched; want 1 and 1 (client-go's correlation)", s.count(), s.patched)
	}
	e := s.created[0]
	if e.InvolvedObject.Name != "p-0001" || e.InvolvedObject.Kind != "Pod" || e.Namespace != "ns" || e.Source.Component != "test" || e.ReportingController != "test" || e.Count != 1 || e.Type != corev1.EventTypeWarning {
		t.Errorf("event sent: %+v", e)
	}
}

// TestAnnotationsAreSent: an event's annotations (crossplane-runtime's
// external-name) reach the API server as recorded, the recorder's map
// changed after the event was recorded or not.
func TestAnnotationsAreSent(t *testing.T) {
	b := New()
	s := &sink{}
	b.StartRecordingToSink(s)
	defer b.Shutdown()
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	annotations := map[string]string{"external-name": "p-0001", "other": "x"}
	r.AnnotatedEventf(pod(1), annotations, corev1.EventTypeNormal, "CreatedExternalResource", "created %s", "it")
	annotations["external-name"] = "changed"
	r.Event(pod(2), corev1.EventTypeNormal, "Plain", "no annotations")
	waitIdle(t, b)
	if s.count() != 2 {
		t.Fatalf("%d events sent; want 2", s.count())
	}
	// Four senders: in either order.
	annotated, plain := s.created[0], s.created[1]
	if annotated.Reason != "CreatedExternalResource" {
		annotated, plain = plain, annotated
	}
	if got, want := annotated.Annotations, map[string]string{"external-name": "p-0001", "other": "x"}; !maps.Equal(got, want) || annotated.Message != "created it" {
		t.Errorf("annotations sent %v, message %q; want %v", got, annotated.Message, want)
	}
	if got := plain.Annotations; got != nil {
		t.Errorf("an event without annotations was sent with %v", got)
	}
}

func TestFullQueueDropsAndCounts(t *testing.T) {
	b := New()
	b.MaxQueued = 5
	dropped := testutil.ToFloat64(droppedTotal)
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	// Not started: nothing is sent, the queue fills.
	for i := range 8 {
		r.Event(pod(i), corev1.EventTypeNormal, "Created", "created")
	}
	if d := testutil.ToFloat64(droppedTotal) - dropped; d != 3 {
		t.Errorf("8 events into a queue of 5: %v counted dropped, want 3", d)
	}
	s := &sink{}
	b.StartRecordingToSink(s)
	waitIdle(t, b)
	b.Shutdown()
	if s.count() != 5 {
		t.Errorf("sent %d of the 5 queued", s.count())
	}
}

func TestRefusedEventIsNotRetried(t *testing.T) {
	b := New()
	s := &sink{refuse: kerrors.NewForbidden(schema.GroupResource{Resource: "events"}, "x", fmt.Errorf("namespace ns is being terminated"))}
	b.StartRecordingToSink(s)
	defer b.Shutdown()
	dropped := testutil.ToFloat64(droppedTotal)
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	r.Event(pod(1), corev1.EventTypeNormal, "Created", "created")
	waitIdle(t, b)
	s.mu.Lock()
	tried := s.tried
	s.mu.Unlock()
	if tried != 1 {
		t.Errorf("a refused event was sent %d times; want once (not retried)", tried)
	}
	if d := testutil.ToFloat64(droppedTotal) - dropped; d != 1 {
		t.Errorf("a refused event: %v counted dropped, want 1", d)
	}
}

func TestStopSendsWhatIsQueued(t *testing.T) {
	b := New()
	b.Rate, b.Burst = 1000, 1000
	s := &sink{}
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	for i := range 20 {
		r.Event(pod(i), corev1.EventTypeNormal, "Created", "created")
	}
	b.StartRecordingToSink(s)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { _ = b.Start(ctx); close(done) }()
	cancel()
	<-done
	if s.count() != 20 {
		t.Errorf("stopped with 20 queued: %d sent", s.count())
	}
	r.Event(pod(21), corev1.EventTypeNormal, "Created", "created")
	if !b.Idle() {
		t.Error("an event recorded after the stop was queued")
	}
}

// TestEventsWaitWhileResourcesAreWritten: while the provider writes its
// managed resources (NoteWrite) an event is not sent; once the writes
// stop for Quiet it is, and an event held MaxHold goes even while they go
// on.
func TestEventsWaitWhileResourcesAreWritten(t *testing.T) {
	b := New()
	b.Quiet, b.MaxHold = 300*time.Millisecond, time.Hour
	s := &sink{}
	b.StartRecordingToSink(s)
	defer b.Shutdown()
	r := b.NewRecorder(clientgoscheme.Scheme, corev1.EventSource{Component: "test"})
	stop := writing(b)
	r.Event(pod(1), corev1.EventTypeNormal, "Created", "created")
	time.Sleep(time.Second)
	if n := s.count(); n != 0 {
		t.Errorf("%d events sent while the resources were being written; want none", n)
	}
	stop()
	waitIdle(t, b)
	if n := s.count(); n != 1 {
		t.Errorf("%d events sent after the writes stopped; want 1", n)
	}

	// Held long enough, an event goes while the writes go on.
	b.MaxHold = 200 * time.Millisecond
	defer writing(b)()
	r.Event(pod(2), corev1.EventTypeNormal, "Created", "created")
	waitIdle(t, b)
	if n := s.count(); n != 2 {
		t.Errorf("%d events sent; want the one held MaxHold too", n)
	}
}

// writing notes a write on b every 10 ms, as the managed reconcilers do
// in a burst, until the returned stop is called (it returns once the
// writes have stopped).
func writing(b *Broadcaster) (stop func()) {
	b.NoteWrite() // busy from the return on
	done, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		for {
			select {
			case <-done:
				return
			default:
				b.NoteWrite()
				time.Sleep(10 * time.Millisecond)
			}
		}
	}()
	return func() { close(done); <-stopped }
}
