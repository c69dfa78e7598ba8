// Package events sends the provider's Kubernetes events: every recorder
// the manager hands out (mgr.GetEventRecorderFor) records through one
// Broadcaster, which queues the events and sends them at a bounded rate,
// instead of client-go's broadcaster, which drops what does not fit its
// queues.
//
// client-go's broadcaster takes an event only when a 25-event channel has
// room, keeps at most 1,000 more for its sender, and sends them one at a
// time: a thousand proxies created together record two thousand events
// within seconds, and what does not fit is dropped and logged, never
// sent. Here an event is queued (up to MaxQueued, the only place one is
// dropped, and counted when it is), correlated as client-go does
// (identical events become a count on the first, a spamming object is
// skipped) and sent by a few senders at most Rate a second. Events are
// the writes a burst can best put off: while the provider writes its
// managed resources (NoteWrite), an event waits, up to MaxHold after it
// was recorded, so the writes that make the proxies Ready go first. An
// event keeps the time it was recorded at.
package events

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	kerrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/tools/record/util"
	"k8s.io/client-go/tools/reference"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Defaults of Broadcaster.
const (
	// DefaultRate is how many event requests a second the senders make at
	// most, with DefaultBurst at once.
	DefaultRate  = 10
	DefaultBurst = 20
	// DefaultQuiet is how long after the last noted write the provider
	// counts as busy, and DefaultMaxHold how long an event waits at most
	// while it is.
	DefaultQuiet   = time.Second
	DefaultMaxHold = time.Minute
	// DefaultMaxQueued bounds the queue: a few hundred bytes an event,
	// the events of 10,000 resources created together.
	DefaultMaxQueued = 20000
	// senders send in parallel: one request at a time cannot keep up with
	// the rate over a slow API server.
	senders = 4
	// tries is how often an event is sent before it is given up on
	// (counted as failed); the server refusing it outright is not retried.
	tries = 3
)

var (
	sentTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressproxy_events_sent_total",
		Help: "Kubernetes events the provider sent to the API server (a repeated event is sent as a count on the first).",
	})
	droppedTotal = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "egressproxy_events_dropped_total",
		Help: "Kubernetes events the provider recorded and never sent: its queue was full, the API server refused them, or the provider stopped first.",
	})
	queued = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "egressproxy_events_queued",
		Help: "Kubernetes events the provider recorded and has not sent yet.",
	})
	register sync.Once
)

// Broadcaster is a record.EventBroadcaster (ctrl.Options.EventBroadcaster)
// that queues events and sends them at a bounded rate. Use New.
type Broadcaster struct {
	// Rate and Burst limit the requests the senders make; MaxQueued
	// bounds the queue. Set before the first event.
	Rate      float64
	Burst     int
	MaxQueued int
	// Quiet and MaxHold: an event waits while a write was noted less than
	// Quiet ago, until it has waited MaxHold.
	Quiet, MaxHold time.Duration

	// lastWrite is when NoteWrite was last called (Unix nanoseconds).
	lastWrite atomic.Int64

	mu       sync.Mutex
	cond     *sync.Cond
	queue    []*pending
	sink     record.EventSink
	watchers map[int]func(*corev1.Event)
	next     int
	started  bool
	stopped  bool
	inFlight int
	done     sync.WaitGroup
}

// New returns a Broadcaster with the defaults, its metrics registered with
// controller-runtime's registry.
func New() *Broadcaster {
	register.Do(func() { metrics.Registry.MustRegister(sentTotal, droppedTotal, queued) })
	b := &Broadcaster{Rate: DefaultRate, Burst: DefaultBurst, MaxQueued: DefaultMaxQueued, Quiet: DefaultQuiet, MaxHold: DefaultMaxHold,
		watchers: map[int]func(*corev1.Event){}}
	b.cond = sync.NewCond(&b.mu)
	return b
}

// NewRecorder returns a recorder of events from source.
func (b *Broadcaster) NewRecorder(scheme *runtime.Scheme, source corev1.EventSource) record.EventRecorderLogger {
	return &recorder{b: b, scheme: scheme, source: source, log: klog.Background()}
}

// StartRecordingToSink starts the senders, which send to sink (the first
// sink given; the manager gives one).
func (b *Broadcaster) StartRecordingToSink(sink record.EventSink) watch.Interface {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started || b.stopped {
		return watch.NewEmptyWatch()
	}
	b.started, b.sink = true, sink
	correlator := record.NewEventCorrelatorWithOptions(record.CorrelatorOptions{})
	limiter := flowcontrol.NewTokenBucketRateLimiter(float32(b.Rate), max(b.Burst, 1))
	for range senders {
		b.done.Add(1)
		go b.send(correlator, limiter)
	}
	return watch.NewEmptyWatch()
}

// StartEventWatcher calls handler with every event, as it is sent.
func (b *Broadcaster) StartEventWatcher(handler func(*corev1.Event)) watch.Interface {
	b.mu.Lock()
	defer b.mu.Unlock()
	id := b.next
	b.next++
	b.watchers[id] = handler
	return &stopper{stop: func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		delete(b.watchers, id)
	}}
}

// StartLogging logs every event with logf, as it is sent.
func (b *Broadcaster) StartLogging(logf func(format string, args ...any)) watch.Interface {
	return b.StartEventWatcher(func(e *corev1.Event) {
		logf("Event(%#v): type: '%v' reason: '%v' %v", e.InvolvedObject, e.Type, e.Reason, e.Message)
	})
}

// StartStructuredLogging logs every event with klog at verbosity, as it
// is sent.
func (b *Broadcaster) StartStructuredLogging(verbosity klog.Level) watch.Interface {
	return b.StartEventWatcher(func(e *corev1.Event) {
		klog.V(verbosity).InfoS("Event occurred", "object", klog.KRef(e.InvolvedObject.Namespace, e.InvolvedObject.Name), "kind", e.InvolvedObject.Kind, "type", e.Type, "reason", e.Reason, "message", e.Message)
	})
}

// Shutdown stops taking events, sends what is queued for up to
// ShutdownWait (what is left then is dropped and counted) and stops the
// senders.
func (b *Broadcaster) Shutdown() {
	ctx, cancel := context.WithTimeout(context.Background(), ShutdownWait)
	defer cancel()
	b.Stop(ctx)
}

// ShutdownWait is how long Shutdown sends what is queued.
const ShutdownWait = 2 * time.Second

// Stop stops taking events and sends what is queued until ctx ends; what
// is left then is dropped and counted.
func (b *Broadcaster) Stop(ctx context.Context) {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	b.stopped = true
	b.cond.Broadcast()
	b.mu.Unlock()
	finished := make(chan struct{})
	go func() { b.done.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	droppedTotal.Add(float64(len(b.queue)))
	b.queue = nil
	queued.Set(0)
	b.cond.Broadcast()
}

// Start implements manager.Runnable: it returns when ctx ends, after
// Shutdown. Added to the manager, it stops the senders with it (the
// manager shuts down only the broadcasters it made itself).
func (b *Broadcaster) Start(ctx context.Context) error {
	<-ctx.Done()
	b.Shutdown()
	return nil
}

// NeedLeaderElection implements manager.LeaderElectionRunnable: events
// are sent by every replica (leader election records its own).
func (b *Broadcaster) NeedLeaderElection() bool { return false }

// NoteWrite notes a write of the provider's that a resource's readiness
// waits for (the managed reconcilers' writes): events wait while they go
// on.
func (b *Broadcaster) NoteWrite() { b.lastWrite.Store(time.Now().UnixNano()) }

// hold waits while the provider is busy writing (NoteWrite), until p has
// waited MaxHold since it was recorded or the broadcaster stops.
func (b *Broadcaster) hold(p *pending) {
	const tick = 50 * time.Millisecond
	for {
		now := time.Now()
		busy := now.UnixNano()-b.lastWrite.Load() < int64(b.Quiet)
		if !busy || now.Sub(p.at.Time) >= b.MaxHold {
			return
		}
		b.mu.Lock()
		stopped := b.stopped
		b.mu.Unlock()
		if stopped {
			return
		}
		time.Sleep(tick)
	}
}

// Idle reports whether no event waits or is being sent.
func (b *Broadcaster) Idle() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return len(b.queue) == 0 && b.inFlight == 0
}

// pending is a recorded event until it is sent: what the event is made
// of, a third of the event's size (thousands may wait in a burst).
type pending struct {
	ref corev1.ObjectReference
	// annotations are the event's, key and value in turn: a map of one
	// entry takes several times the room, and the recorder's map is
	// crossplane-runtime's, one per reconcile.
	annotations                []string
	eventtype, reason, message string
	at                         metav1.Time
	source                     *corev1.EventSource
}

// event is the event to send, as client-go's recorder makes it.
func (p *pending) event() *corev1.Event {
	ns := p.ref.Namespace
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	var annotations map[string]string
	if len(p.annotations) > 0 {
		annotations = make(map[string]string, len(p.annotations)/2)
		for i := 0; i+1 < len(p.annotations); i += 2 {
			annotations[p.annotations[i]] = p.annotations[i+1]
		}
	}
	return &corev1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: util.GenerateEventName(p.ref.Name, p.at.UnixNano()), Namespace: ns, Annotations: annotations},
		InvolvedObject:      p.ref,
		Reason:              p.reason,
		Message:             p.message,
		FirstTimestamp:      p.at,
		LastTimestamp:       p.at,
		Count:               1,
		Type:                p.eventtype,
		Source:              *p.source,
		ReportingController: p.source.Component,
		ReportingInstance:   p.source.Host,
	}
}

// enqueue takes e, or drops it (counted) when the queue is full or the
// broadcaster stopped.
func (b *Broadcaster) enqueue(e *pending, log logr.Logger) {
	b.mu.Lock()
	defer b.mu.Unlock()
	limit := b.MaxQueued
	if limit <= 0 {
		limit = DefaultMaxQueued
	}
	if b.stopped || len(b.queue) >= limit {
		droppedTotal.Inc()
		log.V(1).Info("dropped an event: the queue is full", "object", klog.KRef(e.ref.Namespace, e.ref.Name), "reason", e.reason)
		return
	}
	b.queue = append(b.queue, e)
	queued.Set(float64(len(b.queue) + b.inFlight))
	b.cond.Signal()
}

// take waits for an event; nil once stopped and drained, or stopped by a
// deadline (the queue then emptied).
func (b *Broadcaster) take() *pending {
	b.mu.Lock()
	defer b.mu.Unlock()
	for len(b.queue) == 0 {
		if b.stopped {
			return nil
		}
		b.cond.Wait()
	}
	e := b.queue[0]
	b.queue[0] = nil
	b.queue = b.queue[1:]
	if len(b.queue) == 0 {
		b.queue = nil // let the array go after a burst
	}
	b.inFlight++
	return e
}

func (b *Broadcaster) sent(e *corev1.Event, ok bool) {
	b.mu.Lock()
	b.inFlight--
	queued.Set(float64(len(b.queue) + b.inFlight))
	var ws []func(*corev1.Event)
	if ok {
		for _, w := range b.watchers {
			ws = append(ws, w)
		}
	}
	b.mu.Unlock()
	if !ok {
		droppedTotal.Inc()
		return
	}
	sentTotal.Inc()
	for _, w := range ws {
		w(e)
	}
}

// send is one sender: it correlates each event (as client-go's
// broadcaster does), waits for the rate limiter and sends it.
func (b *Broadcaster) send(correlator *record.EventCorrelator, limiter flowcontrol.RateLimiter) {
	defer b.done.Done()
	for {
		p := b.take()
		if p == nil {
			return
		}
		b.hold(p)
		e := p.event()
		r, err := correlator.EventCorrelate(e)
		if err != nil || r.Skip {
			// Skipped as spam: client-go drops it the same way.
			b.sent(e, false)
			continue
		}
		ok := false
		for try := range tries {
			if try > 0 {
				time.Sleep(time.Duration(try) * time.Second)
			}
			limiter.Accept()
			var done bool
			if done, ok = b.record(correlator, r.Event, r.Patch); done {
				break
			}
		}
		b.sent(r.Event, ok)
	}
}

// record sends e: as a patch of the event it repeats when it is a repeat
// (created when that event is gone). done is false for an error worth
// another try (the server unreachable).
func (b *Broadcaster) record(correlator *record.EventCorrelator, e *corev1.Event, patch []byte) (done, ok bool) {
	var got *corev1.Event
	var err error
	update := e.Count > 1
	if update {
		got, err = b.sink.Patch(e, patch)
	}
	if !update || kerrors.IsNotFound(err) {
		c := *e
		c.ResourceVersion = ""
		got, err = b.sink.Create(&c)
	}
	if err == nil {
		correlator.UpdateState(got)
		return true, true
	}
	var status *kerrors.StatusError
	if errors.As(err, &status) {
		// Refused (a namespace being deleted, an invalid event): another
		// try would be refused too.
		return true, kerrors.IsAlreadyExists(err)
	}
	return false, false
}

// stopper is a watch.Interface whose Stop calls stop.
type stopper struct {
	once sync.Once
	stop func()
}

func (s *stopper) Stop() { s.once.Do(s.stop) }

func (s *stopper) ResultChan() <-chan watch.Event { return nil }

// recorder is a record.EventRecorderLogger of one source.
type recorder struct {
	b      *Broadcaster
	scheme *runtime.Scheme
	source corev1.EventSource
	log    klog.Logger
}

func (r *recorder) WithLogger(l klog.Logger) record.EventRecorderLogger {
	c := *r
	c.log = l
	return &c
}

func (r *recorder) Event(obj runtime.Object, eventtype, reason, message string) {
	r.generate(obj, nil, eventtype, reason, message)
}

func (r *recorder) Eventf(obj runtime.Object, eventtype, reason, messageFmt string, args ...any) {
	r.generate(obj, nil, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

func (r *recorder) AnnotatedEventf(obj runtime.Object, annotations map[string]string, eventtype, reason, messageFmt string, args ...any) {
	r.generate(obj, annotations, eventtype, reason, fmt.Sprintf(messageFmt, args...))
}

// generate makes the event as client-go's recorder does and queues it.
func (r *recorder) generate(obj runtime.Object, annotations map[string]string, eventtype, reason, message string) {
	ref, err := reference.GetReference(r.scheme, obj)
	if err != nil {
		r.log.Error(err, "cannot record an event: no reference to its object", "reason", reason)
		return
	}
	if !util.ValidateEventType(eventtype) {
		r.log.Error(nil, "cannot record an event of this type", "type", eventtype, "reason", reason)
		return
	}
	var kv []string
	if len(annotations) > 0 {
		kv = make([]string, 0, 2*len(annotations))
		for k, v := range annotations {
			kv = append(kv, k, v)
		}
	}
	r.b.enqueue(&pending{ref: *ref, annotations: kv, eventtype: eventtype, reason: reason, message: message, at: metav1.Now(), source: &r.source}, r.log)
}
