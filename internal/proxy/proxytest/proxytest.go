// Package proxytest holds the conformance suite every proxy.Driver must pass
// (Run) and Memory, an in-memory reference driver that passes it and that the
// controller layer's tests use as their backend.
//
// A driver's test hands Run a Harness whose New builds a fresh driver on an
// empty (fake) backend, plus optional "pokes" that make the backend do what
// a test needs (finish a boot, answer busy, hold a deletion). A subtest that
// needs a poke the fixture lacks is skipped with a message naming it.
//
//	func TestConformance(t *testing.T) {
//		proxytest.Run(t, proxytest.Harness{New: func(t *testing.T) proxytest.Fixture {
//			backend := newFakeBackend(t)
//			return proxytest.Fixture{
//				Driver:   New(backend.Config(), "kvm-lab"),
//				Provider: "kvm-lab",
//				Request:  backend.Request,
//				Settle:   backend.Boot,
//				// ...
//			}
//		}})
//	}
package proxytest

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Harness is how a driver's test hands its driver to Run.
type Harness struct {
	// New returns a fresh driver on an empty backend for one subtest.
	// Subtests run in parallel; each calls New once and gets its own
	// backend. Register cleanups with t.Cleanup.
	New func(t *testing.T) Fixture
	// Complete says the fixture gives every poke: a check that would be
	// skipped for want of one fails instead. Every driver's harness sets
	// it; a skipped check is a hole in the contract.
	Complete bool
}

// Fixture is one driver on one empty backend, plus the backend pokes the
// suite needs. A nil poke means the backend cannot do it: the subtests that
// need it are skipped with a message saying which capability is missing,
// or fail where the harness is Complete (every driver's is).
type Fixture struct {
	// Driver under test. Required.
	Driver proxy.Driver
	// Provider is the provider name the driver was configured with; every
	// error leaving the driver must carry it in (*proxy.Error).Provider.
	// Empty means any non-empty Provider is accepted.
	Provider string
	// Request returns a valid request for this backend: placement keys
	// that exist, Mark{UID: uid, InstallationID: <the fixture's
	// installation>}. Required. The suite copies and changes the result
	// (other UIDs, another installation, sentinel secrets, changed proxy
	// settings), so such variations must be acceptable too.
	Request func(name, uid string) proxy.Request

	// Settle makes the backend finish whatever is pending for the instance
	// with this driver ID: the boot and address lease after Create (so the
	// instance is Running with an address), a task or operation, or the
	// deletion after Delete. Settle on an instance that no longer exists
	// returns nil. Until Settle, a created instance must not have finished
	// provisioning. The ID is empty for what Get reported of a resource
	// being deleted without an ID of its own (PartialCreate): Settle then
	// finishes what is pending for it.
	Settle func(ctx context.Context, id string) error
	// Foreign creates, in the placement Request uses, an instance with this
	// name that carries no mark (made by a human).
	Foreign func(ctx context.Context, name string) error
	// ForeignMarked creates, in the placement Request uses, an instance
	// with this name marked with the fixture's installation and this UID,
	// made by someone other than the driver under test.
	ForeignMarked func(ctx context.Context, name, uid string) error
	// SetUnknownState makes the backend report, for this instance, a state
	// the driver does not know.
	SetUnknownState func(ctx context.Context, id string) error
	// SetBusy makes the backend answer every call with "busy", "locked" or
	// a 5xx (busy=true), or behave normally again (busy=false).
	SetBusy func(ctx context.Context, busy bool)
	// HoldDelete puts the instance in the middle of being deleted until
	// release is called; release finishes the deletion and is idempotent.
	HoldDelete func(ctx context.Context, id string) (release func())
	// PartialCreate leaves on the backend, in the placement Request uses,
	// what a Create of this name for this UID that was cut short leaves
	// before its instance exists (a volume, a firewall rule, an address,
	// a seed ISO), and no instance.
	PartialCreate func(ctx context.Context, name, uid string) error
	// Leftovers lists what of the instance of this name is on the backend
	// besides the instance itself (what PartialCreate leaves); empty when
	// nothing is.
	Leftovers func(ctx context.Context, name string) ([]string, error)
	// ReportEgress makes the instance with this driver ID unreachable for
	// the provider's probe, and its guest report line as its own egress
	// check (the line squid.ReportScript prints), where the driver reads
	// such reports (a guest attribute, a file the guest agent reads, a
	// pod's log). It returns ErrAlwaysReached for a backend the provider
	// always reaches (its own cluster's pods), which never reads reports.
	ReportEgress func(ctx context.Context, id, line string) error
	// GuestReportsAddress makes the guest of the instance with this
	// driver ID report ip (TenantRefusedIP) as its address, as a guest a
	// tenant writes may (its guest agent). The fixture's tenant guard
	// refuses TenantRefused. It returns ErrAddressNotGuests for a backend
	// whose addresses are not the guest's word.
	GuestReportsAddress func(ctx context.Context, id, ip string) error
	// LogOutput returns everything the driver logged so far.
	LogOutput func() string
	// Secrets are secret values configured for this fixture (keys, tokens,
	// passwords of the backend) that must never appear in logs or errors.
	Secrets []string
	// MalformedIDs are IDs that are syntactically invalid for this backend.
	MalformedIDs []string
}

// ErrAlwaysReached is what ReportEgress returns for a backend the
// provider always reaches.
var ErrAlwaysReached = errors.New("proxytest: the provider always reaches this backend's proxies")

// tb is the part of testing.TB the checks use. *testing.T implements it;
// the suite's own tests implement it with a recorder, to prove that each
// check fails on a driver that breaks its property.
type tb interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
	Skipf(format string, args ...any)
	Logf(format string, args ...any)
}

// check is one subtest of the suite.
type check struct {
	name string
	fn   func(e *env)
}

// Run runs the conformance suite: one parallel subtest per property of the
// proxy.Driver contract, each on a fresh Fixture from h.New:
//
//	RepeatCreateCreatesNothingNew
//	GetAfterDeleteIsNotFound
//	DeleteTwiceSucceeds
//	DeleteOfNeverCreatedSucceeds
//	UnplacedRefIsNotFoundOrUnresolved
//	MalformedIDsArePermanent                          (MalformedIDs)
//	UnknownBackendStateReadsAsStopped                 (SetUnknownState)
//	RunningRequiresAddress
//	NeverStartedIsProvisioningNotStopped
//	MarkAndCreatedAtReadBack
//	ListIncludesOursAndExcludesOtherInstallations
//	ListExcludesUnmarkedInstances                     (Foreign)
//	CreateRefusesToAdoptUnmarkedInstance              (Foreign)
//	UpdateRefusesUnmarkedInstance                     (Foreign)
//	DeleteRefusesUnmarkedInstance                     (Foreign)
//	CreateRefusesToAdoptInstanceOfAnotherUID
//	UpdateRefusesInstanceOfAnotherUID
//	DeleteRefusesInstanceOfAnotherUID
//	CreateRefusesToAdoptInstanceOfAnotherInstallation
//	UpdateRefusesInstanceOfAnotherInstallation
//	DeleteRefusesInstanceOfAnotherInstallation
//	CreateRefusesToAdoptForeignMarkedInstance         (ForeignMarked)
//	UpdateRefusesForeignMarkedInstance                (ForeignMarked)
//	DeleteRefusesForeignMarkedInstance                (ForeignMarked)
//	DeletionRemovesWhatACutShortCreateLeft            (PartialCreate, Leftovers)
//	ListReportsWhatACutShortCreateLeft                (PartialCreate, Leftovers)
//	TidyKeepsWhatInstancesUse                         (drivers that are a proxy.Tidier)
//	GetDuringDeleteIsNeverNotFound                    (HoldDelete)
//	BusyBackendIsTransientNeverNotFound               (SetBusy)
//	CancelledContextReturnsPromptly
//	SecretsNeverLeak
//	UpdateRewritesSpecHash                            (skipped when SpecHash is not stored)
//	CheckReturnsTargets
//	ErrorsAreClassifiedWithProvider
//	EgressReportedOnlyFromAValidLineWhenUnreached     (ReportEgress)
//	TenantGuestsReportedAddressIsRefused              (GuestReportsAddress)
//
// A subtest whose fixture field (in parentheses) is missing is skipped,
// or fails under Harness.Complete.
// Settle, LogOutput and Secrets are used where present and make the
// checks that use them stricter.
func Run(t *testing.T, h Harness) {
	t.Helper()
	if h.New == nil {
		t.Fatal("proxytest: Harness.New is nil")
	}
	for _, c := range checks() {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			runCheck(t, h.New(t), c, h.Complete)
		})
	}
}

// checkTimeout bounds one subtest; a driver that hangs fails rather than
// stalling the test binary.
const checkTimeout = 20 * time.Second

// runCheck runs one check against one fixture, reporting to t.
func runCheck(t tb, f Fixture, c check, complete bool) {
	t.Helper()
	if f.Driver == nil {
		t.Fatalf("proxytest: Fixture.Driver is nil")
	}
	if f.Request == nil {
		t.Fatalf("proxytest: Fixture.Request is nil")
	}
	req := f.Request(nameA, uidA)
	if req.Name != nameA || req.Mark.UID != uidA || req.Mark.InstallationID == "" {
		t.Fatalf("proxytest: Fixture.Request(%q, %q) = Name %q, Mark %+v; want that name and UID and a non-empty InstallationID",
			nameA, uidA, req.Name, req.Mark)
	}
	ctx, cancel := context.WithTimeout(context.Background(), checkTimeout)
	defer cancel()
	c.fn(&env{t: t, f: f, ctx: ctx, installation: req.Mark.InstallationID, complete: complete})
}

// env is what a check works with.
type env struct {
	t            tb
	f            Fixture
	ctx          context.Context
	installation string
	// complete turns a skip for want of a poke into a failure.
	complete bool
}
