package proxytest

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/egressproxy/provider-egressproxy/internal/proxy"
)

// Names, UIDs and installations the checks use. Names and values are valid
// as instance names and as label values on every backend.
const (
	nameA     = "pt-alpha"
	nameB     = "pt-beta"
	nameC     = "pt-gamma"
	nameD     = "pt-delta"
	nameNever = "pt-never-created"

	uidA = "0c8f6a1e-5b7d-4e2a-9c3f-00000000000a"
	uidB = "0c8f6a1e-5b7d-4e2a-9c3f-00000000000b"
	uidC = "0c8f6a1e-5b7d-4e2a-9c3f-00000000000c"

	otherInstallation  = "proxytest-other-installation"
	unusedInstallation = "proxytest-unused-installation"

	// Sentinel secrets put into requests; none may ever be seen outside.
	sentinelPassword1  = "pw-S3NT1NEL-q7x2k9m4v8c1"
	sentinelPassword2  = "pw-S3NT1NEL-r5t6y1u3w0d2"
	sentinelCloudInit1 = "ci-S3NT1NEL-z7x4w2v8n5e3"
	sentinelCloudInit2 = "ci-S3NT1NEL-h2j9k4l6p1f4"

	// promptly is how fast a call with a cancelled context must return.
	promptly = 500 * time.Millisecond
	// hung is how long the suite waits before calling a call hung.
	hung = 5 * time.Second
	// createdAtSlack is how far CreatedAt may lie outside the Create call
	// (clock skew, second-precision timestamps on the backend).
	createdAtSlack = 2 * time.Minute
)

// checks is the suite, in the order subtests are started.
func checks() []check {
	cs := []check{
		{"RepeatCreateCreatesNothingNew", checkRepeatCreate},
		{"GetAfterDeleteIsNotFound", checkGetAfterDelete},
		{"DeleteTwiceSucceeds", checkDeleteTwice},
		{"DeleteOfNeverCreatedSucceeds", checkDeleteNeverCreated},
		{"UnplacedRefIsNotFoundOrUnresolved", checkUnplacedRef},
		{"MalformedIDsArePermanent", checkMalformedIDs},
		{"UnknownBackendStateReadsAsStopped", checkUnknownState},
		{"RunningRequiresAddress", checkRunningRequiresAddress},
		{"NeverStartedIsProvisioningNotStopped", checkNeverStarted},
		{"MarkAndCreatedAtReadBack", checkMarkAndCreatedAt},
		{"ListIncludesOursAndExcludesOtherInstallations", checkListInstallations},
		{"ListExcludesUnmarkedInstances", checkListExcludesUnmarked},
		{"DeleteByWhatListReturns", checkDeleteByListed},
	}
	cs = append(cs, takeoverChecks()...)
	return append(cs,
		check{"DeletionRemovesWhatACutShortCreateLeft", checkPartialCreate},
		check{"ListReportsWhatACutShortCreateLeft", checkListLeftovers},
		check{"TidyKeepsWhatInstancesUse", checkTidy},
		check{"GetDuringDeleteIsNeverNotFound", checkGetDuringDelete},
		check{"BusyBackendIsTransientNeverNotFound", checkBusy},
		check{"CancelledContextReturnsPromptly", checkCancelled},
		check{"SecretsNeverLeak", checkSecrets},
		check{"UpdateRewritesSpecHash", checkUpdateSpecHash},
		check{"CheckReturnsTargets", checkCheck},
		check{"ErrorsAreClassifiedWithProvider", checkErrorsClassified},
		check{"EgressReportedOnlyFromAValidLineWhenUnreached", checkEgressReport},
		check{"TenantGuestsReportedAddressIsRefused", checkTenantGuest},
	)
}

// RepeatCreateCreatesNothingNew: Create is idempotent, before and after the
// backend finished provisioning; List and Get see one instance, same ID.
func checkRepeatCreate(e *env) {
	req := e.f.Request(nameA, uidA)
	first := e.create(req)
	if again := e.create(e.f.Request(nameA, uidA)); again.ID != first.ID {
		e.t.Errorf("second Create returned ID %q; want the first Create's %q", again.ID, first.ID)
	}
	e.settle(first.ID)
	if again := e.create(req); again.ID != first.ID {
		e.t.Errorf("Create after Settle returned ID %q; want the first Create's %q", again.ID, first.ID)
	}
	if diff := cmp.Diff([]string{first.ID}, ids(e.list(e.installation))); diff != "" {
		e.t.Errorf("List after repeated Create (-want +got):\n%s", diff)
	}
	for _, r := range []proxy.Ref{refTo(first, req), nameRef(req)} {
		if got := e.mustGet(r); got.ID != first.ID {
			e.t.Errorf("Get(%s) returned ID %q; want %q", describeRef(r), got.ID, first.ID)
		}
	}
}

// GetAfterDeleteIsNotFound: once Delete returned (and the backend settled),
// Get by ID and by name is NotFound.
func checkGetAfterDelete(e *env) {
	req, inst := e.createSettled()
	e.deleteSettled(inst, req)
	for _, r := range []proxy.Ref{refTo(inst, req), nameRef(req)} {
		if got, err := e.get(r); !proxy.IsNotFound(err) {
			e.t.Errorf("Get(%s) after Delete = instance %q, %s; want NotFound", describeRef(r), got.ID, describe(err))
		}
	}
}

// DeleteByWhatListReturns: what List returns of an instance (ID, name and
// mark; no placement) is enough to delete it, as the orphan sweep does.
func checkDeleteByListed(e *env) {
	req, inst := e.createSettled()
	var listed *proxy.Instance
	for _, l := range e.list(e.installation) {
		if l.ID == inst.ID {
			listed = &l
		}
	}
	if listed == nil {
		e.t.Fatalf("List does not return the instance %q just created", inst.ID)
	}
	ref := proxy.Ref{ID: listed.ID, Name: listed.Name, Mark: listed.Mark, Live: true}
	if err := e.f.Driver.Delete(e.ctx, ref); err != nil {
		e.t.Fatalf("Delete(%s) by what List returned = %s; want nil", describeRef(ref), describe(err))
	}
	e.settle(inst.ID)
	if got, err := e.get(refTo(inst, req)); !proxy.IsNotFound(err) {
		e.t.Errorf("Get after a Delete by what List returned = instance %q, %s; want NotFound", got.ID, describe(err))
	}
}

// DeleteTwiceSucceeds: Delete of an already deleted instance succeeds, by
// ID and by name.
func checkDeleteTwice(e *env) {
	req, inst := e.createSettled()
	e.deleteSettled(inst, req)
	for _, r := range []proxy.Ref{refTo(inst, req), nameRef(req)} {
		if err := e.f.Driver.Delete(e.ctx, r); err != nil {
			e.t.Errorf("second Delete(%s) = %s; want nil", describeRef(r), describe(err))
		}
	}
}

// DeleteOfNeverCreatedSucceeds: Delete of an instance that never existed
// succeeds.
func checkDeleteNeverCreated(e *env) {
	r := nameRef(e.f.Request(nameNever, uidA))
	if err := e.f.Driver.Delete(e.ctx, r); err != nil {
		e.t.Errorf("Delete(%s) of a never-created instance = %s; want nil", describeRef(r), describe(err))
	}
}

// UnplacedRefIsNotFoundOrUnresolved: a Ref without an ID whose placement
// names no location, or one the driver lacks, as the controller sends for
// a resource being deleted whose spec the config cannot resolve (a typo
// in a key), finds nothing (Get NotFound, Delete nil), or says that it
// cannot look (proxy.Unresolvedf), never any other error: the controller
// lets go of such a resource that never made an instance only on those.
func checkUnplacedRef(e *env) {
	req := e.f.Request(nameNever, uidA)
	for _, location := range []string{"", "pt-no-such-place"} {
		r := proxy.Ref{Name: req.Name, Mark: req.Mark, Placement: proxy.Placement{Location: location}, Live: true, Deleting: true}
		if _, err := e.get(r); !proxy.IsNotFound(err) && !proxy.IsUnresolved(err) {
			e.t.Errorf("Get(%s) in location %q = %s; want NotFound or Unresolved", describeRef(r), location, describe(err))
		}
		if err := e.f.Driver.Delete(e.ctx, r); err != nil && !proxy.IsUnresolved(err) {
			e.t.Errorf("Delete(%s) in location %q = %s; want nil or Unresolved", describeRef(r), location, describe(err))
		}
	}
}

// DeletionRemovesWhatACutShortCreateLeft: what a Create cut short left
// without an instance is no instance to a live resource (Get is NotFound,
// so Create runs again and takes it over), is reported to the resource
// being deleted (Ref.Deleting: never NotFound while it remains, with the
// resource's mark), and is gone once Delete has run and Get says
// NotFound: a resource whose instance never appeared leaks nothing.
func checkPartialCreate(e *env) {
	e.need("PartialCreate", e.f.PartialCreate != nil)
	e.need("Leftovers", e.f.Leftovers != nil)
	req := e.f.Request(nameA, uidA)
	if err := e.f.PartialCreate(e.ctx, nameA, uidA); err != nil {
		e.t.Fatalf("proxytest: PartialCreate: %v", err)
	}
	if left, err := e.f.Leftovers(e.ctx, nameA); err != nil || len(left) == 0 {
		e.t.Fatalf("proxytest: PartialCreate left nothing (%v, %v): the check would prove nothing", left, err)
	}
	live := nameRef(req)
	live.Mark = req.Mark
	if got, err := e.get(live); !proxy.IsNotFound(err) {
		e.t.Errorf("Get(%s) of a live resource whose create was cut short = %+v, %s; want NotFound, so that Create runs again", describeRef(live), got, describe(err))
	}
	r := live
	r.Live, r.Deleting = true, true
	for i := 0; ; i++ {
		if i == 10 {
			e.t.Errorf("the deletion never ended: Get(%s) keeps reporting the instance after %d Deletes", describeRef(r), i)
			return
		}
		inst, err := e.get(r)
		if proxy.IsNotFound(err) {
			if i == 0 {
				e.t.Errorf("Get(%s) of the resource being deleted = NotFound while what its create left remains; want it reported, so that Delete runs", describeRef(r))
			}
			break
		}
		if err != nil {
			e.t.Errorf("Get(%s) of the resource being deleted = %s; want an instance or NotFound", describeRef(r), describe(err))
			return
		}
		if inst.Mark != r.Mark {
			e.t.Errorf("Get(%s) of the resource being deleted reports mark %+v; want the resource's %+v", describeRef(r), inst.Mark, r.Mark)
		}
		if err := e.f.Driver.Delete(e.ctx, r); err != nil {
			e.t.Errorf("Delete(%s) = %s; want nil", describeRef(r), describe(err))
			return
		}
		e.settle(inst.ID) // may be "": what is left may have no ID of its own
	}
	if left, err := e.f.Leftovers(e.ctx, nameA); err != nil || len(left) > 0 {
		e.t.Errorf("after the deletion, left on the backend: %v (%v); want nothing", left, err)
	}
}

// ListReportsWhatACutShortCreateLeft: what a Create cut short left
// without an instance is listed (an entry with Leftovers, named after the
// instance) so that the orphan sweep finds it once its resource is gone;
// with the resource's mark, and then not to another installation, and a
// Delete by what List returned removes it; or, where the backend can
// mark it only in part, with an empty mark and the UID's prefix, never
// deleted by the sweep.
func checkListLeftovers(e *env) {
	e.need("PartialCreate", e.f.PartialCreate != nil)
	e.need("Leftovers", e.f.Leftovers != nil)
	req := e.f.Request(nameA, uidA)
	if err := e.f.PartialCreate(e.ctx, nameA, uidA); err != nil {
		e.t.Fatalf("proxytest: PartialCreate: %v", err)
	}
	if left, err := e.f.Leftovers(e.ctx, nameA); err != nil || len(left) == 0 {
		e.t.Fatalf("proxytest: PartialCreate left nothing (%v, %v): the check would prove nothing", left, err)
	}
	var listed *proxy.Instance
	for _, l := range e.list(e.installation) {
		if l.Name == nameA {
			listed = &l
		}
	}
	switch {
	case listed == nil:
		e.t.Fatalf("List(%q) does not report what the cut-short create of %q left; want an entry with Leftovers", e.installation, nameA)
	case len(listed.Leftovers) == 0:
		e.t.Fatalf("List(%q) reports %q without Leftovers while no instance exists; want them named", e.installation, nameA)
	case listed.Mark == (proxy.Mark{}):
		if p := listed.Details[proxy.DetailUIDPrefix]; p == "" || !strings.HasPrefix(strings.ReplaceAll(uidA, "-", ""), p) {
			e.t.Fatalf("List reports the leftovers of %q with no mark and UID prefix %q; want the resource's mark, or a prefix of %q", nameA, p, uidA)
		}
		return
	case listed.Mark != req.Mark:
		e.t.Fatalf("List reports the leftovers of %q marked %+v; want the resource's %+v", nameA, listed.Mark, req.Mark)
	}
	for _, l := range e.list(otherInstallation) {
		if l.Name == nameA {
			e.t.Errorf("List(%q) of another installation reports the leftovers of %q (%+v)", otherInstallation, nameA, l.Mark)
		}
	}
	ref := proxy.Ref{ID: listed.ID, Name: listed.Name, Mark: listed.Mark, Live: true}
	for i := 0; ; i++ {
		if i == 10 {
			e.t.Errorf("Delete(%s) by what List returned never removed the leftovers", describeRef(ref))
			return
		}
		if err := e.f.Driver.Delete(e.ctx, ref); err != nil {
			e.t.Fatalf("Delete(%s) by what List returned = %s; want nil", describeRef(ref), describe(err))
		}
		e.settle(listed.ID)
		if left, err := e.f.Leftovers(e.ctx, nameA); err == nil && len(left) == 0 {
			break
		}
	}
	for _, l := range e.list(e.installation) {
		if l.Name == nameA {
			e.t.Errorf("List(%q) after the leftovers were deleted still reports %q (%v)", e.installation, nameA, l.Leftovers)
		}
	}
}

// TidyKeepsWhatInstancesUse: a driver that tidies shared pieces
// (proxy.Tidier) never removes what an instance uses: after Tidy, twice,
// the instance still runs and a new instance in the same placement comes
// up. A driver that is no Tidier passes.
func checkTidy(e *env) {
	t, ok := e.f.Driver.(proxy.Tidier)
	if !ok {
		return
	}
	req, inst := e.createSettled()
	for range 2 {
		if _, err := t.Tidy(e.ctx); err != nil {
			e.t.Fatalf("Tidy = %s; want nil", describe(err))
		}
	}
	if got := e.mustGet(refTo(inst, req)); got.State != proxy.StateRunning {
		e.t.Errorf("after Tidy, Get(%s) = %s (%s); want Running", inst.ID, got.State, got.Progress)
	}
	b := e.create(e.f.Request(nameB, uidB))
	e.settle(b.ID)
	if got := e.mustGet(refTo(b, e.f.Request(nameB, uidB))); got.State != proxy.StateRunning {
		e.t.Errorf("after Tidy, a new instance is %s (%s); want Running", got.State, got.Progress)
	}
}

// MalformedIDsArePermanent: Get and Delete with a syntactically invalid ID
// are Permanent, and do not fall back to the Ref's name.
func checkMalformedIDs(e *env) {
	if len(e.f.MalformedIDs) == 0 {
		e.skipf("proxytest: fixture lists no MalformedIDs; cannot check that malformed IDs are Permanent")
	}
	req := e.f.Request(nameA, uidA)
	inst := e.create(req)
	for _, id := range e.f.MalformedIDs {
		if id == "" {
			e.t.Fatalf("proxytest: Fixture.MalformedIDs holds \"\", which means \"resolve by name\", not a malformed ID")
		}
		r := proxy.Ref{ID: id, Name: req.Name, Placement: req.Placement}
		if got, err := e.get(r); !proxy.IsPermanent(err) {
			e.t.Errorf("Get(ID %q) = instance %q, %s; want Permanent", id, got.ID, describe(err))
		}
		if err := e.f.Driver.Delete(e.ctx, r); !proxy.IsPermanent(err) {
			e.t.Errorf("Delete(ID %q) = %s; want Permanent", id, describe(err))
		}
	}
	if _, err := e.get(refTo(inst, req)); err != nil {
		e.t.Errorf("after Delete with malformed IDs naming %q, Get(%s) = %s; Delete must not fall back to the name",
			req.Name, describeRef(refTo(inst, req)), describe(err))
	}
}

// UnknownBackendStateReadsAsStopped: a state the driver does not know is
// Stopped.
func checkUnknownState(e *env) {
	e.need("SetUnknownState", e.f.SetUnknownState != nil)
	req, inst := e.createSettled()
	if err := e.f.SetUnknownState(e.ctx, inst.ID); err != nil {
		e.t.Fatalf("proxytest: SetUnknownState(%q): %v", inst.ID, err)
	}
	if got := e.mustGet(refTo(inst, req)); got.State != proxy.StateStopped {
		e.t.Errorf("Get in an unknown backend state: State %q; want %q", got.State, proxy.StateStopped)
	}
	for _, l := range e.list(e.installation) {
		if l.ID == inst.ID && l.State != "" && l.State != proxy.StateStopped {
			e.t.Errorf("List in an unknown backend state: State %q; want %q (or none)", l.State, proxy.StateStopped)
		}
	}
}

// RunningRequiresAddress: every instance the driver reports is in a known
// state, and Running ones have an IP, before and after Settle; after Settle
// the instance is Running.
func checkRunningRequiresAddress(e *env) {
	req := e.f.Request(nameA, uidA)
	inst := e.create(req)
	e.checkState("Create", inst, false)
	for i := range 3 {
		e.checkState(fmt.Sprintf("Get #%d before Settle", i+1), e.mustGet(refTo(inst, req)), false)
	}
	for _, l := range e.list(e.installation) {
		e.checkState("List before Settle", l, true)
	}
	if e.f.Settle == nil {
		e.t.Logf("proxytest: fixture has no Settle poke; checked only before provisioning finished")
		return
	}
	e.settle(inst.ID)
	got := e.mustGet(refTo(inst, req))
	e.checkState("Get after Settle", got, false)
	if got.State != proxy.StateRunning || got.IP == "" {
		e.t.Errorf("Get after Settle: State %q, IP %q; want Running with an address", got.State, got.IP)
	}
	for _, l := range e.list(e.installation) {
		e.checkState("List after Settle", l, true)
	}
}

// NeverStartedIsProvisioningNotStopped: right after Create the instance is
// Provisioning (when the fixture controls provisioning with Settle) and
// never Stopped or Terminated.
func checkNeverStarted(e *env) {
	req := e.f.Request(nameA, uidA)
	inst := e.create(req)
	seen := []struct {
		where string
		inst  proxy.Instance
	}{
		{"Create", inst},
		{"Get by ID", e.mustGet(refTo(inst, req))},
		{"Get by name", e.mustGet(nameRef(req))},
	}
	for _, s := range seen {
		switch {
		case e.f.Settle != nil && s.inst.State != proxy.StateProvisioning:
			e.t.Errorf("%s right after Create: State %q; want %q (the backend has not finished provisioning before Settle)",
				s.where, s.inst.State, proxy.StateProvisioning)
		case s.inst.State == proxy.StateStopped || s.inst.State == proxy.StateTerminated:
			e.t.Errorf("%s right after Create: a never-started instance reads as %q; want %q",
				s.where, s.inst.State, proxy.StateProvisioning)
		}
	}
}

// MarkAndCreatedAtReadBack: Get and List return the Mark written by Create
// and a CreatedAt from the time of the Create, stable across reads.
func checkMarkAndCreatedAt(e *env) {
	req := e.f.Request(nameA, uidA)
	before := time.Now()
	inst := e.create(req)
	after := time.Now()

	byID := e.mustGet(refTo(inst, req))
	byName := e.mustGet(nameRef(req))
	for _, g := range []struct {
		where string
		inst  proxy.Instance
	}{{"Get by ID", byID}, {"Get by name", byName}} {
		if g.inst.Name != req.Name {
			e.t.Errorf("%s: Name %q; want %q", g.where, g.inst.Name, req.Name)
		}
		if diff := cmp.Diff(req.Mark, g.inst.Mark); diff != "" {
			e.t.Errorf("%s: Mark (-want +got):\n%s", g.where, diff)
		}
		e.checkCreatedAt(g.where, g.inst.CreatedAt, before, after)
	}
	if !byID.CreatedAt.Equal(byName.CreatedAt) {
		e.t.Errorf("CreatedAt differs between reads: %v, then %v", byID.CreatedAt, byName.CreatedAt)
	}

	listed, ok := find(e.list(e.installation), inst.ID)
	if !ok {
		e.t.Fatalf("List(%q) does not hold the created instance %q", e.installation, inst.ID)
	}
	if listed.Name != req.Name {
		e.t.Errorf("List: Name %q; want %q", listed.Name, req.Name)
	}
	if diff := cmp.Diff(req.Mark, listed.Mark); diff != "" {
		e.t.Errorf("List: Mark (-want +got):\n%s", diff)
	}
	e.checkCreatedAt("List", listed.CreatedAt, before, after)
}

// ListIncludesOursAndExcludesOtherInstallations: List returns exactly the
// instances marked with the installation asked for, whoever made them.
func checkListInstallations(e *env) {
	e.create(e.f.Request(nameA, uidA))
	e.create(e.f.Request(nameB, uidB))
	other := e.f.Request(nameC, uidC)
	other.Mark.InstallationID = otherInstallation
	e.create(other)
	want := map[string]string{nameA: uidA, nameB: uidB}
	if e.f.ForeignMarked != nil {
		if err := e.f.ForeignMarked(e.ctx, nameD, uidC); err != nil {
			e.t.Fatalf("proxytest: ForeignMarked(%q, %q): %v", nameD, uidC, err)
		}
		want[nameD] = uidC
	} else {
		e.t.Logf("proxytest: fixture has no ForeignMarked poke; not checking that instances others made with our mark are listed")
	}

	for _, l := range []struct {
		installation string
		want         map[string]string
	}{
		{e.installation, want},
		{otherInstallation, map[string]string{nameC: uidC}},
		{unusedInstallation, map[string]string{}},
	} {
		got := map[string]string{}
		for _, inst := range e.list(l.installation) {
			got[inst.Name] = inst.Mark.UID
			if inst.Mark.InstallationID != l.installation {
				e.t.Errorf("List(%q) holds %q marked %+v", l.installation, inst.Name, inst.Mark)
			}
		}
		if diff := cmp.Diff(l.want, got); diff != "" {
			e.t.Errorf("List(%q), name to UID (-want +got):\n%s", l.installation, diff)
		}
	}
}

// ListExcludesUnmarkedInstances: instances without a mark are never listed.
func checkListExcludesUnmarked(e *env) {
	e.need("Foreign", e.f.Foreign != nil)
	if err := e.f.Foreign(e.ctx, nameD); err != nil {
		e.t.Fatalf("proxytest: Foreign(%q): %v", nameD, err)
	}
	e.create(e.f.Request(nameA, uidA))
	if diff := cmp.Diff([]string{nameA}, names(e.list(e.installation))); diff != "" {
		e.t.Errorf("List(%q) with an unmarked instance %q present (-want +got):\n%s", e.installation, nameD, diff)
	}
}

// adoptCase is an instance named nameA that is not ours (as uidA in the
// fixture's installation), made in some way. Each case is checked three
// times: Create over it, Update of it and Delete of it, all as uidA with
// the instance's name (and, for Update and Delete, its ID too), must leave
// it exactly as it was. An external name is a name, not a key to someone
// else's instance.
type adoptCase struct {
	// name is what the instance is, as the check names end.
	name string
	// poke names the fixture poke setup needs ("" for none).
	poke string
	// byDriver: the driver under test made the instance (so Settle may be
	// used on it).
	byDriver bool
	has      func(Fixture) bool
	// setup makes the instance and returns the installation it is listed
	// under ("" when unmarked) and the mark it carries.
	setup func(e *env) (string, proxy.Mark)
}

func adoptCases() []adoptCase {
	return []adoptCase{
		{
			name: "UnmarkedInstance",
			poke: "Foreign",
			has:  func(f Fixture) bool { return f.Foreign != nil },
			setup: func(e *env) (string, proxy.Mark) {
				if err := e.f.Foreign(e.ctx, nameA); err != nil {
					e.t.Fatalf("proxytest: Foreign(%q): %v", nameA, err)
				}
				return "", proxy.Mark{}
			},
		},
		{
			name:     "InstanceOfAnotherUID",
			byDriver: true,
			setup: func(e *env) (string, proxy.Mark) {
				req := e.f.Request(nameA, uidB)
				e.create(req)
				return e.installation, req.Mark
			},
		},
		{
			name:     "InstanceOfAnotherInstallation",
			byDriver: true,
			setup: func(e *env) (string, proxy.Mark) {
				req := e.f.Request(nameA, uidA)
				req.Mark.InstallationID = otherInstallation
				e.create(req)
				return otherInstallation, req.Mark
			},
		},
		{
			name: "ForeignMarkedInstance",
			poke: "ForeignMarked",
			has:  func(f Fixture) bool { return f.ForeignMarked != nil },
			setup: func(e *env) (string, proxy.Mark) {
				if err := e.f.ForeignMarked(e.ctx, nameA, uidB); err != nil {
					e.t.Fatalf("proxytest: ForeignMarked(%q, %q): %v", nameA, uidB, err)
				}
				return e.installation, proxy.Mark{UID: uidB, InstallationID: e.installation}
			},
		},
	}
}

// takeoverChecks are the three checks of every adoptCase.
func takeoverChecks() []check {
	var cs []check
	for _, a := range adoptCases() {
		cs = append(cs,
			check{"CreateRefusesToAdopt" + a.name, func(e *env) { a.run(e, "Create") }},
			check{"UpdateRefuses" + a.name, func(e *env) { a.run(e, "Update") }},
			check{"DeleteRefuses" + a.name, func(e *env) { a.run(e, "Delete") }},
		)
	}
	return cs
}

// run makes the instance, checks that Get reports its mark as it is (what
// the controller refuses an import by), then tries op on it as uidA:
// Create must be Permanent, Update Permanent (or NotFound), Delete
// Permanent or nil (nothing of uidA's was there), and none may change,
// adopt or remove the instance.
func (a adoptCase) run(e *env, op string) {
	if a.has != nil {
		e.need(a.poke, a.has(e.f))
	}
	listedUnder, mark := a.setup(e)
	req := e.f.Request(nameA, uidA)
	// Another's instance is read as an import reads it.
	imported := nameRef(req)
	imported.Live = true
	before, err := e.get(imported)
	if err != nil {
		e.t.Fatalf("Get(%s, Live) of the existing instance = %s; Get must read instances it does not own when asked to read live", describeRef(imported), describe(err))
	}
	if before.Mark != mark {
		e.t.Errorf("Get(%s, Live) of an instance marked %+v reports mark %+v; an import is refused by the mark Get reports, so it must be the instance's own",
			describeRef(imported), mark, before.Mark)
	}

	switch op {
	case "Create":
		got, err := e.f.Driver.Create(e.ctx, req)
		if !proxy.IsPermanent(err) {
			e.t.Errorf("Create over an instance marked %+v = instance %q (mark %+v), %s; want Permanent",
				before.Mark, got.ID, got.Mark, describe(err))
		}
	case "Update":
		for _, r := range ownRefs(before, req) {
			got, err := e.f.Driver.Update(e.ctx, r, changedRequest(req))
			// NotFound is fine too: a driver reading through a cache of its
			// own instances does not see it.
			if !proxy.IsPermanent(err) && !proxy.IsNotFound(err) {
				e.t.Errorf("Update(%s) of an instance marked %+v as UID %q = instance %q (mark %+v), %s; want Permanent (or NotFound)",
					describeRef(r), before.Mark, uidA, got.ID, got.Mark, describe(err))
			}
		}
	case "Delete":
		for _, r := range ownRefs(before, req) {
			if err := e.f.Driver.Delete(e.ctx, r); err != nil && !proxy.IsPermanent(err) {
				e.t.Errorf("Delete(%s) of an instance marked %+v as UID %q = %s; want Permanent, or nil leaving it alone",
					describeRef(r), before.Mark, uidA, describe(err))
			}
		}
		if a.byDriver {
			// A deletion the driver started would finish now.
			e.settle(before.ID)
		}
	}
	after, err := e.get(imported)
	if err != nil {
		e.t.Fatalf("Get(%s, Live) after the refused %s = %s; the instance must be left as it was", describeRef(imported), op, describe(err))
	}
	was, is := identityOf(before), identityOf(after)
	if op == "Delete" {
		// Settle may have finished the owner's own provisioning.
		was.SpecHash, is.SpecHash = "", ""
	}
	if diff := cmp.Diff(was, is); diff != "" {
		e.t.Errorf("the refused %s changed the existing instance (-before +after):\n%s", op, diff)
	}
	for _, inst := range []string{e.installation, otherInstallation} {
		want := 0
		if inst == listedUnder {
			want = 1
		}
		var found []proxy.Instance
		for _, l := range e.list(inst) {
			if l.Name == nameA {
				found = append(found, l)
			}
		}
		if len(found) != want {
			e.t.Errorf("List(%q) after the refused %s holds %d instances named %q; want %d", inst, op, len(found), nameA, want)
		}
		for _, l := range found {
			if l.Mark != before.Mark {
				e.t.Errorf("List(%q) after the refused %s: %q marked %+v; want %+v", inst, op, nameA, l.Mark, before.Mark)
			}
		}
	}
}

// ownRefs are the Refs a resource of req's mark would use for inst: by its
// name (an external name set to it) and by its ID.
func ownRefs(inst proxy.Instance, req proxy.Request) []proxy.Ref {
	byName := nameRef(req)
	byName.Mark = req.Mark
	byID := refTo(inst, req)
	byID.Mark = req.Mark
	return []proxy.Ref{byName, byID}
}

// GetDuringDeleteIsNeverNotFound: an instance in the middle of being deleted
// is still found (or the error is not NotFound), and goes away once the
// deletion finished.
func checkGetDuringDelete(e *env) {
	e.need("HoldDelete", e.f.HoldDelete != nil)
	req, inst := e.createSettled()
	release := e.f.HoldDelete(e.ctx, inst.ID)
	defer release()
	for _, r := range []proxy.Ref{refTo(inst, req), nameRef(req)} {
		got, err := e.get(r)
		switch {
		case proxy.IsNotFound(err):
			e.t.Errorf("Get(%s) while being deleted = %s; want not NotFound", describeRef(r), describe(err))
		case err == nil && got.ID != inst.ID:
			e.t.Errorf("Get(%s) while being deleted returned ID %q; want %q", describeRef(r), got.ID, inst.ID)
		}
	}
	release()
	e.deleteSettled(inst, req)
	if _, err := e.get(refTo(inst, req)); !proxy.IsNotFound(err) {
		e.t.Errorf("Get(%s) after the held deletion finished = %s; want NotFound", describeRef(refTo(inst, req)), describe(err))
	}
}

// BusyBackendIsTransientNeverNotFound: while the backend answers busy, Get
// is never NotFound, what must reach the backend fails Transient, and
// nothing is lost.
func checkBusy(e *env) {
	e.need("SetBusy", e.f.SetBusy != nil)
	d := e.f.Driver
	req, inst := e.createSettled()
	byID := refTo(inst, req)
	changed := changedRequest(req)

	e.f.SetBusy(e.ctx, true)
	defer e.f.SetBusy(e.ctx, false)

	// Reads may be answered from a cache; they must never say NotFound.
	reads := []struct {
		call string
		r    proxy.Ref
	}{
		{"Get by ID", byID},
		{"Get by name", nameRef(req)},
		{"Get of a never-created instance", nameRef(e.f.Request(nameNever, uidA))},
	}
	for _, rd := range reads {
		got, err := e.get(rd.r)
		switch {
		case err == nil && rd.r.Name == nameNever:
			e.t.Errorf("%s while busy returned instance %q; want Transient", rd.call, got.ID)
		case err == nil && got.ID != inst.ID:
			e.t.Errorf("%s while busy returned ID %q; want %q", rd.call, got.ID, inst.ID)
		case err != nil && !proxy.IsTransient(err):
			e.t.Errorf("%s while busy = %s; want Transient", rd.call, describe(err))
		}
	}
	// Work that must reach the backend cannot have succeeded.
	writes := []struct {
		call string
		fn   func() error
	}{
		{"Create of a new instance", func() error { _, err := d.Create(e.ctx, e.f.Request(nameB, uidB)); return err }},
		{"Update with changed settings", func() error { _, err := d.Update(e.ctx, byID, changed); return err }},
		{"Delete", func() error { return d.Delete(e.ctx, byID) }},
	}
	for _, w := range writes {
		if err := w.fn(); err == nil || !proxy.IsTransient(err) {
			e.t.Errorf("%s while busy = %s; want Transient", w.call, describe(err))
		}
	}
	if got, err := d.Create(e.ctx, req); err == nil && got.ID != inst.ID {
		e.t.Errorf("repeat Create while busy returned ID %q; want %q or a Transient error", got.ID, inst.ID)
	} else if err != nil && !proxy.IsTransient(err) {
		e.t.Errorf("repeat Create while busy = %s; want Transient", describe(err))
	}
	if l, err := d.List(e.ctx, e.installation); err != nil && !proxy.IsTransient(err) {
		e.t.Errorf("List while busy = %s; want Transient", describe(err))
	} else if _, ok := find(l, inst.ID); err == nil && !ok {
		e.t.Errorf("List while busy returned %v without error and without %q; want a Transient error", ids(l), inst.ID)
	}

	e.f.SetBusy(e.ctx, false)
	if got := e.mustGet(byID); got.ID != inst.ID {
		e.t.Errorf("Get after the backend recovered returned ID %q; want %q", got.ID, inst.ID)
	}
}

// CancelledContextReturnsPromptly: with a cancelled or expired context
// every method returns well under a second, with an error that is not
// NotFound.
func checkCancelled(e *env) {
	d := e.f.Driver
	req, inst := e.createSettled()
	byID := refTo(inst, req)
	changed := changedRequest(req)

	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Minute))
	defer cancel2()

	for _, c := range []struct {
		kind string
		ctx  context.Context
	}{{"cancelled", cancelled}, {"expired", expired}} {
		ops := []struct {
			op string
			fn func() error
		}{
			{"Create", func() error { _, err := d.Create(c.ctx, e.f.Request(nameB, uidB)); return err }},
			{"Get", func() error { _, err := d.Get(c.ctx, byID); return err }},
			{"Update", func() error { _, err := d.Update(c.ctx, byID, changed); return err }},
			{"Delete", func() error { return d.Delete(c.ctx, byID) }},
			{"List", func() error { _, err := d.List(c.ctx, e.installation); return err }},
			{"Check", func() error { d.Check(c.ctx); return nil }},
		}
		for _, o := range ops {
			took, done, err := timed(o.fn)
			switch {
			case !done:
				e.t.Errorf("%s with a %s context did not return within %v", o.op, c.kind, hung)
				continue
			case took > promptly:
				e.t.Errorf("%s with a %s context took %v; want under %v", o.op, c.kind, took, promptly)
			}
			if o.op == "Check" {
				continue
			}
			if err == nil || proxy.IsNotFound(err) {
				e.t.Errorf("%s with a %s context = %s; want an error that is not NotFound", o.op, c.kind, describe(err))
			}
		}
	}
}

// SecretsNeverLeak: the request's password and cloud-init and the fixture's
// secrets appear in no error, instance, health report or log, whatever the
// call and however it fails.
func checkSecrets(e *env) {
	outs := e.exercise()
	secrets := map[string]string{
		"Proxy.Auth.Password":         sentinelPassword1,
		"updated Proxy.Auth.Password": sentinelPassword2,
		"CloudInit":                   sentinelCloudInit1,
		"updated CloudInit":           sentinelCloudInit2,
	}
	for i, s := range e.f.Secrets {
		if s != "" {
			secrets[fmt.Sprintf("Fixture.Secrets[%d]", i)] = s
		}
	}
	labels := make([]string, 0, len(secrets))
	for l := range secrets {
		labels = append(labels, l)
	}
	sort.Strings(labels)
	scan := func(where, text string) {
		e.t.Helper()
		for _, l := range labels {
			if form, ok := leaks(text, secrets[l]); ok {
				e.t.Errorf("%s leaks the %s (as %q): %s", where, l, form, excerpt(text, form))
			}
		}
	}
	for _, o := range outs {
		if o.err != nil {
			scan(o.call+": error %v", fmt.Sprintf("%v", o.err))
			scan(o.call+": error %+v", fmt.Sprintf("%+v", o.err))
		}
		for _, inst := range o.insts {
			scan(o.call+": instance", fmt.Sprintf("%+v", inst))
		}
		if o.health != nil {
			scan(o.call+": health", fmt.Sprintf("%+v", *o.health))
		}
	}
	if e.f.LogOutput == nil {
		e.t.Logf("proxytest: fixture has no LogOutput; logs not checked for secrets")
		return
	}
	scan("the driver's log", e.f.LogOutput())
}

// UpdateRewritesSpecHash: on a backend that stores SpecHash, it is
// proxy.Hash of the Request the instance was last created or updated from.
func checkUpdateSpecHash(e *env) {
	req, inst := e.createSettled()
	byID := refTo(inst, req)
	got := e.mustGet(byID)
	if got.SpecHash == "" {
		e.skipf("proxytest: the backend does not store SpecHash (empty after Create)")
	}
	if want := proxy.Hash(req); got.SpecHash != want {
		e.t.Errorf("Get after Create: SpecHash %q; want proxy.Hash(request) %q", got.SpecHash, want)
	}
	changed := changedRequest(req)
	want := proxy.Hash(changed)
	updated, err := e.f.Driver.Update(e.ctx, byID, changed)
	if err != nil {
		e.t.Fatalf("Update(%s) with changed settings: %s", describeRef(byID), describe(err))
	}
	if updated.SpecHash != "" && updated.SpecHash != want {
		e.t.Errorf("Update returned SpecHash %q; want proxy.Hash(new request) %q", updated.SpecHash, want)
	}
	e.settle(inst.ID)
	got = e.mustGet(byID)
	if got.SpecHash != want {
		e.t.Errorf("Get after Update: SpecHash %q; want proxy.Hash(new request) %q", got.SpecHash, want)
	}
	if got.ID != inst.ID || got.Mark != req.Mark {
		e.t.Errorf("Get after Update: ID %q, Mark %+v; want %q, %+v unchanged", got.ID, got.Mark, inst.ID, req.Mark)
	}
}

// CheckReturnsTargets: Check reports at least one named target, and an
// unhealthy target says why.
func checkCheck(e *env) {
	h := e.f.Driver.Check(e.ctx)
	if len(h.Targets) == 0 {
		e.t.Errorf("Check returned no targets; want at least one")
	}
	for i, t := range h.Targets {
		if t.Target == "" {
			e.t.Errorf("Check: target %d has no name: %+v", i, t)
		}
		if !t.Healthy && t.Reason == "" {
			e.t.Errorf("Check: unhealthy target %q has no Reason", t.Target)
		}
	}
}

// ErrorsAreClassifiedWithProvider: every error leaving the driver, from
// every method and failure, is a *proxy.Error with a known class, the
// configured provider and the operation.
func checkErrorsClassified(e *env) {
	n := 0
	for _, o := range e.exercise() {
		if o.err == nil {
			continue
		}
		n++
		var pe *proxy.Error
		if !errors.As(o.err, &pe) {
			e.t.Errorf("%s: error %q (%T) is not a *proxy.Error", o.call, o.err, o.err)
			continue
		}
		switch pe.Class {
		case proxy.ClassNotFound, proxy.ClassTransient, proxy.ClassPermanent, proxy.ClassQuota:
		default:
			e.t.Errorf("%s: error %q has unknown class %q", o.call, o.err, pe.Class)
		}
		switch {
		case pe.Provider == "":
			e.t.Errorf("%s: error %q has no Provider", o.call, o.err)
		case e.f.Provider != "" && pe.Provider != e.f.Provider:
			e.t.Errorf("%s: error %q has Provider %q; want %q", o.call, o.err, pe.Provider, e.f.Provider)
		}
		if pe.Op == "" {
			e.t.Errorf("%s: error %q has no Op", o.call, o.err)
		}
	}
	if n == 0 {
		e.t.Fatalf("proxytest: exercising the driver produced no errors to check")
	}
}

// outcome is what one call of exercise returned.
type outcome struct {
	call   string
	insts  []proxy.Instance
	health *proxy.Health
	err    error
}

// exercise calls every method with requests holding sentinel secrets, in
// ways that succeed and in every way the fixture can make them fail.
func (e *env) exercise() []outcome {
	e.t.Helper()
	d := e.f.Driver
	var outs []outcome
	add := func(call string, err error, insts ...proxy.Instance) {
		outs = append(outs, outcome{call: call, insts: insts, err: err})
	}
	check := func(call string, ctx context.Context) {
		h := d.Check(ctx)
		outs = append(outs, outcome{call: call, health: &h})
	}

	req := secretRequest(e.f.Request(nameA, uidA), 1)
	inst, err := d.Create(e.ctx, req)
	add("Create", err, inst)
	if err != nil {
		e.t.Fatalf("Create(%q) with a password and cloud-init: %s", req.Name, describe(err))
	}
	byID := refTo(inst, req)
	updated := secretRequest(changedRequest(req), 2)
	never := nameRef(e.f.Request(nameNever, uidA))
	other := secretRequest(e.f.Request(nameB, uidB), 1)

	got, err := d.Create(e.ctx, req)
	add("repeat Create", err, got)
	got, err = d.Get(e.ctx, byID)
	add("Get by ID", err, got)
	got, err = d.Get(e.ctx, nameRef(req))
	add("Get by name", err, got)
	l, err := d.List(e.ctx, e.installation)
	add("List", err, l...)
	check("Check", e.ctx)
	e.settle(inst.ID)
	got, err = d.Update(e.ctx, byID, updated)
	add("Update", err, got)
	e.settle(inst.ID)
	got, err = d.Get(e.ctx, byID)
	add("Get after Update", err, got)

	got, err = d.Create(e.ctx, secretRequest(e.f.Request(nameA, uidB), 2))
	add("Create over another UID's instance", err, got)
	// The refusals of Update and Delete by another resource name the
	// instance and whose it is, never the request's secrets.
	thief := secretRequest(e.f.Request(nameA, uidB), 2)
	for _, r := range ownRefs(inst, thief) {
		got, err = d.Update(e.ctx, r, thief)
		add("Update of another UID's instance ("+describeRef(r)+")", err, got)
		add("Delete of another UID's instance ("+describeRef(r)+")", d.Delete(e.ctx, r))
	}
	got, err = d.Get(e.ctx, never)
	add("Get of a never-created instance", err, got)
	got, err = d.Update(e.ctx, never, updated)
	add("Update of a never-created instance", err, got)
	for _, id := range e.f.MalformedIDs {
		r := proxy.Ref{ID: id, Name: req.Name, Placement: req.Placement}
		got, err = d.Get(e.ctx, r)
		add(fmt.Sprintf("Get(ID %q)", id), err, got)
		got, err = d.Update(e.ctx, r, updated)
		add(fmt.Sprintf("Update(ID %q)", id), err, got)
		add(fmt.Sprintf("Delete(ID %q)", id), d.Delete(e.ctx, r))
	}

	failing := func(when string, ctx context.Context) {
		got, err := d.Create(ctx, other)
		add("Create "+when, err, got)
		got, err = d.Get(ctx, byID)
		add("Get "+when, err, got)
		got, err = d.Update(ctx, byID, updated)
		add("Update "+when, err, got)
		l, err := d.List(ctx, e.installation)
		add("List "+when, err, l...)
		check("Check "+when, ctx)
		add("Delete "+when, d.Delete(ctx, byID))
	}
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	failing("with a cancelled context", cancelled)
	if e.f.SetBusy != nil {
		e.f.SetBusy(e.ctx, true)
		failing("while busy", e.ctx)
		e.f.SetBusy(e.ctx, false)
	}

	add("Delete", d.Delete(e.ctx, byID))
	e.settle(inst.ID)
	add("repeat Delete", d.Delete(e.ctx, byID))
	got, err = d.Get(e.ctx, byID)
	add("Get after Delete", err, got)
	return outs
}

// --- helpers ---

func (e *env) need(poke string, ok bool) {
	e.t.Helper()
	if !ok {
		e.skipf("proxytest: fixture has no %s poke", poke)
	}
}

// skipf skips the check, or fails it where the harness says its fixture
// is complete.
func (e *env) skipf(format string, args ...any) {
	e.t.Helper()
	if e.complete {
		e.t.Fatalf(format+" (the harness is Complete: every check must run)", args...)
	}
	e.t.Skipf(format, args...)
}

func (e *env) create(req proxy.Request) proxy.Instance {
	e.t.Helper()
	inst, err := e.f.Driver.Create(e.ctx, req)
	if err != nil {
		e.t.Fatalf("Create(%q, UID %q, installation %q): %s", req.Name, req.Mark.UID, req.Mark.InstallationID, describe(err))
	}
	if inst.ID == "" {
		e.t.Fatalf("Create(%q) returned an instance without ID: %+v", req.Name, inst)
	}
	return inst
}

// createSettled creates the instance nameA of uidA and lets the backend
// settle it.
func (e *env) createSettled() (proxy.Request, proxy.Instance) {
	e.t.Helper()
	req := e.f.Request(nameA, uidA)
	inst := e.create(req)
	e.settle(inst.ID)
	return req, inst
}

// deleteSettled deletes inst by its ID and lets the backend settle.
func (e *env) deleteSettled(inst proxy.Instance, req proxy.Request) {
	e.t.Helper()
	e.mustDelete(refTo(inst, req))
	e.settle(inst.ID)
}

// settle calls the fixture's Settle, if it has one.
func (e *env) settle(id string) {
	e.t.Helper()
	if e.f.Settle == nil {
		return
	}
	if err := e.f.Settle(e.ctx, id); err != nil {
		e.t.Fatalf("proxytest: Settle(%q): %v", id, err)
	}
}

func (e *env) get(r proxy.Ref) (proxy.Instance, error) {
	return e.f.Driver.Get(e.ctx, r)
}

func (e *env) mustGet(r proxy.Ref) proxy.Instance {
	e.t.Helper()
	inst, err := e.get(r)
	if err != nil {
		e.t.Fatalf("Get(%s): %s", describeRef(r), describe(err))
	}
	return inst
}

func (e *env) mustDelete(r proxy.Ref) {
	e.t.Helper()
	if err := e.f.Driver.Delete(e.ctx, r); err != nil {
		e.t.Fatalf("Delete(%s): %s", describeRef(r), describe(err))
	}
}

func (e *env) list(installation string) []proxy.Instance {
	e.t.Helper()
	l, err := e.f.Driver.List(e.ctx, installation)
	if err != nil {
		e.t.Fatalf("List(%q): %s", installation, describe(err))
	}
	return l
}

// checkState reports an unknown state, and Running without an address.
// List need not report a state (emptyOK).
func (e *env) checkState(where string, inst proxy.Instance, emptyOK bool) {
	e.t.Helper()
	switch inst.State {
	case proxy.StateProvisioning, proxy.StateRunning, proxy.StateStopped, proxy.StateTerminated:
	case "":
		if !emptyOK {
			e.t.Errorf("%s: instance %q has no State", where, inst.ID)
		}
	default:
		e.t.Errorf("%s: instance %q has State %q, which is not a proxy.State", where, inst.ID, inst.State)
	}
	if inst.State == proxy.StateRunning && inst.IP == "" {
		e.t.Errorf("%s: instance %q is Running without an IP", where, inst.ID)
	}
}

func (e *env) checkCreatedAt(where string, at, before, after time.Time) {
	e.t.Helper()
	switch {
	case at.IsZero():
		e.t.Errorf("%s: CreatedAt is zero; want the creation time", where)
	case at.Before(before.Add(-createdAtSlack)) || at.After(after.Add(createdAtSlack)):
		e.t.Errorf("%s: CreatedAt %v is not within %v of the Create call (%v to %v)", where, at, createdAtSlack, before, after)
	}
}

// refTo is the Ref the controller would use for inst, carrying req's mark
// and the operation inst reported.
func refTo(inst proxy.Instance, req proxy.Request) proxy.Ref {
	return proxy.Ref{ID: inst.ID, Name: req.Name, Mark: req.Mark, Placement: req.Placement, Operation: inst.Operation}
}

// nameRef is a Ref without ID, resolved by name within the placement.
func nameRef(req proxy.Request) proxy.Ref {
	return proxy.Ref{Name: req.Name, Placement: req.Placement}
}

func describeRef(r proxy.Ref) string {
	if r.ID != "" {
		return fmt.Sprintf("ID %q", r.ID)
	}
	return fmt.Sprintf("name %q", r.Name)
}

// describe renders an error with its class.
func describe(err error) string {
	if err == nil {
		return "nil error"
	}
	return fmt.Sprintf("%s error %q", proxy.ClassOf(err), err.Error())
}

// ids and names return the instances' IDs or names, sorted.
func ids(l []proxy.Instance) []string {
	return sorted(l, func(i proxy.Instance) string { return i.ID })
}
func names(l []proxy.Instance) []string {
	return sorted(l, func(i proxy.Instance) string { return i.Name })
}

func sorted(l []proxy.Instance, field func(proxy.Instance) string) []string {
	out := []string{}
	for _, i := range l {
		out = append(out, field(i))
	}
	sort.Strings(out)
	return out
}

func find(l []proxy.Instance, id string) (proxy.Instance, bool) {
	for _, i := range l {
		if i.ID == id {
			return i, true
		}
	}
	return proxy.Instance{}, false
}

// identity is what a refused Create must leave alone.
type identity struct {
	ID, Name  string
	Mark      proxy.Mark
	SpecHash  string
	CreatedAt time.Time
}

func identityOf(i proxy.Instance) identity {
	return identity{ID: i.ID, Name: i.Name, Mark: i.Mark, SpecHash: i.SpecHash, CreatedAt: i.CreatedAt}
}

// changedRequest is req with different proxy settings (and so a different
// Hash), sharing no slices with req. The added client CIDR is a small IPv6
// one, so that a request without auth stays within the clients' limit
// (at most a /8 of IPv4 together) whatever its own CIDRs.
func changedRequest(req proxy.Request) proxy.Request {
	req.Proxy.AllowedClientCIDRs = append(slices.Clone(req.Proxy.AllowedClientCIDRs), "2001:db8:ffff::/48")
	req.Proxy.AllowedDestinations = append(slices.Clone(req.Proxy.AllowedDestinations), ".example.org")
	return req
}

// secretRequest sets sentinel set n (1 or 2) as the proxy password and in
// the cloud-init.
func secretRequest(req proxy.Request, n int) proxy.Request {
	pw, ci := sentinelPassword1, sentinelCloudInit1
	if n == 2 {
		pw, ci = sentinelPassword2, sentinelCloudInit2
	}
	req.Proxy.Auth = proxy.Auth{Enabled: true, Username: "proxytest", Password: pw}
	req.CloudInit = "#cloud-config\nbootcmd:\n  - echo " + ci + "\n"
	return req
}

// timed runs fn, giving up after hung.
func timed(fn func() error) (took time.Duration, done bool, err error) {
	start := time.Now()
	ch := make(chan error, 1)
	go func() { ch <- fn() }()
	select {
	case err := <-ch:
		return time.Since(start), true, err
	case <-time.After(hung):
		return time.Since(start), false, nil
	}
}

// leaks reports whether text holds secret, as is or base64-encoded (as in
// user-data or metadata) at any alignment.
func leaks(text, secret string) (string, bool) {
	if strings.Contains(text, secret) {
		return secret, true
	}
	if len(secret) < 12 {
		return "", false // too short for a base64 core without false alarms
	}
	for k := range 3 {
		b := []byte(secret[k:])
		b = b[:len(b)/3*3]
		for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
			if form := enc.EncodeToString(b); strings.Contains(text, form) {
				return form, true
			}
		}
	}
	return "", false
}

// excerpt is the text around form, so a report shows where a leak is.
func excerpt(text, form string) string {
	i := strings.Index(text, form)
	from, to := max(0, i-60), min(len(text), i+len(form)+60)
	return "…" + text[from:to] + "…"
}
