package vppapi_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/bfd"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
)

// bfdSpec is a 300ms x 3 session from nodeIP to peer on the uplink.
func bfdSpec(uplink uint32, peer string) vppapi.BFDSession {
	return vppapi.BFDSession{
		BFDKey:       vppapi.BFDKey{SwIfIndex: uplink, Local: addr(nodeIP), Peer: addr(peer)},
		DesiredMinTx: 300 * time.Millisecond, RequiredMinRx: 300 * time.Millisecond, DetectMult: 3,
	}
}

// nextBFD returns the next BFD event, failing the test after eventWait.
func nextBFD(t *testing.T, h *harness) vppapi.BFDEvent {
	t.Helper()
	select {
	case ev := <-h.c.BFDEvents():
		return ev
	case <-time.After(eventWait):
		t.Fatalf("no BFD event within %v", eventWait)
		return vppapi.BFDEvent{}
	}
}

// noBFDEvent fails the test if a BFD event is pending.
func noBFDEvent(t *testing.T, h *harness, when string) {
	t.Helper()
	select {
	case ev := <-h.c.BFDEvents():
		t.Errorf("%s: unexpected BFD event %+v", when, ev)
	default:
	}
}

// TestBFDSessionLifecycle: a session is created Down, with no event, and dumps with its configured
// timers; a duplicate is ErrBFDExists, a modification keeps the state and changes the timers, one of a
// missing session is ErrBFDNotFound; admin down and up give one event each (AdminDown, then Down) with
// the session's key and timers; a delete sends no event and deleting again is no error; an unknown
// interface is ErrNoInterface.
func TestBFDSessionLifecycle(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	_ = v
	ctx := ctxT(t)
	if !h.c.HasBFD() {
		t.Fatal("HasBFD is false: VPP 26.06 has BFD in its core")
	}
	s := bfdSpec(uplink, peerIP)
	if err := h.c.AddBFDSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	got, err := h.c.DumpBFDSessions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []vppapi.BFDSessionState{{BFDSession: s, State: vppapi.BFDDown}}; !slices.Equal(got, want) {
		t.Errorf("dump = %+v, want %+v", got, want)
	}
	err = h.c.AddBFDSession(ctx, s)
	if !errors.Is(err, vppapi.ErrBFDExists) || !errors.Is(err, api.BFD_EEXIST) {
		t.Errorf("second add: %v, want ErrBFDExists (-101)", err)
	}
	if n := apiErrors(t, h.reg, "bfd_udp_add"); n != 0 {
		t.Errorf("an existing session counted as %v API errors", n)
	}

	mod := s
	mod.DesiredMinTx, mod.RequiredMinRx, mod.DetectMult = time.Second, 500*time.Millisecond, 5
	if err := h.c.ModifyBFDSession(ctx, mod); err != nil {
		t.Fatal(err)
	}
	if got, err = h.c.DumpBFDSessions(ctx); err != nil || len(got) != 1 || got[0].BFDSession != mod || got[0].State != vppapi.BFDDown {
		t.Errorf("dump after modify = %+v, %v; want %+v Down", got, err, mod)
	}
	missing := bfdSpec(uplink, "192.0.2.9")
	if err := h.c.ModifyBFDSession(ctx, missing); !errors.Is(err, vppapi.ErrBFDNotFound) || !errors.Is(err, api.BFD_ENOENT) {
		t.Errorf("modify a missing session: %v, want ErrBFDNotFound (-102)", err)
	}
	if err := h.c.SetBFDAdminUp(ctx, missing.BFDKey, false); !errors.Is(err, vppapi.ErrBFDNotFound) {
		t.Errorf("admin down of a missing session: %v, want ErrBFDNotFound", err)
	}
	noBFDEvent(t, h, "after add and modify")

	if err := h.c.SetBFDAdminUp(ctx, s.BFDKey, false); err != nil {
		t.Fatal(err)
	}
	if ev := nextBFD(t, h); ev.BFDSession != mod || ev.State != vppapi.BFDAdminDown || ev.PID != v.PID() {
		t.Errorf("event after admin down = %+v, want %+v admin-down from pid %d", ev, mod, v.PID())
	}
	if got, _ = h.c.DumpBFDSessions(ctx); len(got) != 1 || got[0].State != vppapi.BFDAdminDown {
		t.Errorf("dump after admin down = %+v", got)
	}
	if err := h.c.SetBFDAdminUp(ctx, s.BFDKey, true); err != nil {
		t.Fatal(err)
	}
	if ev := nextBFD(t, h); ev.BFDKey != s.BFDKey || ev.State != vppapi.BFDDown {
		t.Errorf("event after admin up = %+v, want down", ev)
	}

	if err := h.c.DeleteBFDSession(ctx, s.BFDKey); err != nil {
		t.Fatal(err)
	}
	if err := h.c.DeleteBFDSession(ctx, s.BFDKey); err != nil {
		t.Errorf("deleting a missing session: %v, want nil", err)
	}
	if got, err = h.c.DumpBFDSessions(ctx); err != nil || len(got) != 0 {
		t.Errorf("dump after delete = %+v, %v", got, err)
	}
	bad := bfdSpec(99, peerIP)
	if err := h.c.AddBFDSession(ctx, bad); !errors.Is(err, vppapi.ErrNoInterface) || !errors.Is(err, api.INVALID_SW_IF_INDEX) {
		t.Errorf("add on sw_if_index 99: %v, want ErrNoInterface (-2)", err)
	}
	// Events come in order: the next one is another session's, so the delete sent none.
	other := bfdSpec(uplink, "192.0.2.3")
	if err := h.c.AddBFDSession(ctx, other); err != nil {
		t.Fatal(err)
	}
	if err := h.c.SetBFDAdminUp(ctx, other.BFDKey, false); err != nil {
		t.Fatal(err)
	}
	if ev := nextBFD(t, h); ev.BFDKey != other.BFDKey || ev.State != vppapi.BFDAdminDown {
		t.Errorf("next event after the delete = %+v, want %v admin-down", ev, other.BFDKey)
	}
	if n := h.c.BFDEventsLost(); n != 0 {
		t.Errorf("BFDEventsLost = %d", n)
	}
}

// TestBFDRejects: values VPP refuses fail in Validate before anything is sent, with ErrBFDInvalid.
func TestBFDRejects(t *testing.T) {
	ok := bfdSpec(1, peerIP)
	for name, mutate := range map[string]func(*vppapi.BFDSession){
		"mult 0":          func(s *vppapi.BFDSession) { s.DetectMult = 0 },
		"tx 0":            func(s *vppapi.BFDSession) { s.DesiredMinTx = 0 },
		"tx below 1µs":    func(s *vppapi.BFDSession) { s.DesiredMinTx = 999 * time.Nanosecond },
		"rx negative":     func(s *vppapi.BFDSession) { s.RequiredMinRx = -time.Second },
		"tx beyond u32µs": func(s *vppapi.BFDSession) { s.DesiredMinTx = 2 * time.Hour },
	} {
		s := ok
		mutate(&s)
		if err := s.Validate(); !errors.Is(err, vppapi.ErrBFDInvalid) {
			t.Errorf("%s: Validate = %v, want ErrBFDInvalid", name, err)
		}
	}
	for name, k := range map[string]vppapi.BFDKey{
		"no local":       {SwIfIndex: 1, Peer: addr(peerIP)},
		"mixed families": {SwIfIndex: 1, Local: addr(nodeIP), Peer: addr("2001:db8::2")},
		"no interface":   {SwIfIndex: ^uint32(0), Local: addr(nodeIP), Peer: addr(peerIP)},
	} {
		s := ok
		s.BFDKey = k
		if err := s.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, s)
		}
	}
	if err := ok.Validate(); err != nil {
		t.Errorf("Validate(%+v) = %v", ok, err)
	}
}

// TestBFDCodes: VPP's return codes for what the client never sends (Validate catches it) and for a
// second events registration, on the wire: -73 for a zero multiplier or TX and mixed families, -2 for
// an unknown interface, -102 for a missing session's delete, -31 for want_bfd_events twice.
func TestBFDCodes(t *testing.T) {
	v, _, uplink := tunnelSetup(t)
	ch := rawChannel(t, v)
	sw := interface_types.InterfaceIndex(uplink)
	add := func(m bfd.BfdUDPAdd) int32 { return retval(t, ch, &m, new(bfd.BfdUDPAddReply)) }
	base := bfd.BfdUDPAdd{SwIfIndex: sw, DesiredMinTx: 300000, RequiredMinRx: 300000, DetectMult: 3,
		LocalAddr: apiAddr(nodeIP), PeerAddr: apiAddr(peerIP)}
	for name, c := range map[string]struct {
		mutate func(*bfd.BfdUDPAdd)
		want   int32
	}{
		"mult 0":         {func(m *bfd.BfdUDPAdd) { m.DetectMult = 0 }, -73},
		"tx 0":           {func(m *bfd.BfdUDPAdd) { m.DesiredMinTx = 0 }, -73},
		"mixed families": {func(m *bfd.BfdUDPAdd) { m.PeerAddr = apiAddr("2001:db8::2") }, -73},
		"sw_if_index 99": {func(m *bfd.BfdUDPAdd) { m.SwIfIndex = 99 }, -2},
	} {
		m := base
		c.mutate(&m)
		if rv := add(m); rv != c.want {
			t.Errorf("bfd_udp_add %s: retval %d, want %d", name, rv, c.want)
		}
	}
	if rv := add(base); rv != 0 {
		t.Fatalf("bfd_udp_add: %d", rv)
	}
	if rv := add(base); rv != -101 {
		t.Errorf("bfd_udp_add again: %d, want -101", rv)
	}
	del := &bfd.BfdUDPDel{SwIfIndex: sw, LocalAddr: apiAddr(nodeIP), PeerAddr: apiAddr("192.0.2.9")}
	if rv := retval(t, ch, del, new(bfd.BfdUDPDelReply)); rv != -102 {
		t.Errorf("bfd_udp_del of a missing session: %d, want -102", rv)
	}
	want := &bfd.WantBfdEvents{EnableDisable: true, PID: 1}
	if rv := retval(t, ch, want, new(bfd.WantBfdEventsReply)); rv != 0 {
		t.Errorf("want_bfd_events: %d", rv)
	}
	if rv := retval(t, ch, want, new(bfd.WantBfdEventsReply)); rv != -31 {
		t.Errorf("want_bfd_events again: %d, want -31", rv)
	}
}

// setUplinkAdmin sets the uplink admin up or down as an operator would.
func setUplinkAdmin(t *testing.T, ch api.Channel, uplink uint32, up bool) {
	t.Helper()
	var flags interface_types.IfStatusFlags
	if up {
		flags = interface_types.IF_STATUS_API_FLAG_ADMIN_UP
	}
	req := &interfaces.SwInterfaceSetFlags{SwIfIndex: interface_types.InterfaceIndex(uplink), Flags: flags}
	if rv := retval(t, ch, req, new(interfaces.SwInterfaceSetFlagsReply)); rv != 0 {
		t.Fatalf("sw_interface_set_flags: %d", rv)
	}
}

// TestBFDForwarding: a session that never came Up takes its adjacency out of forwarding: a single-path
// route via that peer drops, an ECMP route keeps only its other path; deleting the session gives the
// path back. And VPP's defect (bfd-ecmp.md §5.3): after the uplink goes down and up, the paths over the
// still-Down session forward again, until the session is deleted and added again.
func TestBFDForwarding(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	single, ecmp := pfx("10.244.1.0/26"), pfx("10.244.2.0/26")
	peer, other := addr(peerIP), addr("192.0.2.3")
	v.AddRoute(vppsim.Route{Prefix: single, Paths: []vppsim.Path{{NextHop: peer, SwIfIndex: uplink}}})
	v.AddRoute(vppsim.Route{Prefix: ecmp, Paths: []vppsim.Path{{NextHop: peer, SwIfIndex: uplink}, {NextHop: other, SwIfIndex: uplink}}})
	if got := v.ForwardingVia(ecmp); !slices.Equal(got, []netip.Addr{peer, other}) {
		t.Fatalf("ECMP route forwards via %v before any session, want both", got)
	}

	s := bfdSpec(uplink, peerIP)
	if err := h.c.AddBFDSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	check := func(when string, wantSingle, wantECMP []netip.Addr) {
		t.Helper()
		if got := v.ForwardingVia(single); !slices.Equal(got, wantSingle) {
			t.Errorf("%s: single-path route forwards via %v, want %v", when, got, wantSingle)
		}
		if got := v.ForwardingVia(ecmp); !slices.Equal(got, wantECMP) {
			t.Errorf("%s: ECMP route forwards via %v, want %v", when, got, wantECMP)
		}
	}
	check("session never Up", nil, []netip.Addr{other})

	setUplinkAdmin(t, ch, uplink, false)
	setUplinkAdmin(t, ch, uplink, true)
	check("after uplink down/up (VPP's defect)", []netip.Addr{peer}, []netip.Addr{peer, other})

	if err := h.c.DeleteBFDSession(ctx, s.BFDKey); err != nil {
		t.Fatal(err)
	}
	check("session deleted", []netip.Addr{peer}, []netip.Addr{peer, other})
	if err := h.c.AddBFDSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	check("session added again", nil, []netip.Addr{other})
}

// TestBFDSimPeer: the simulator's peer model. A session to an answering peer goes Init then Up, with an
// event each, and its paths forward; when the peer stops answering the session goes Down after its
// detection time, with one event, and the single-path route drops; the interface down/up defect holds
// until the next state change, which the peer's return brings.
func TestBFDSimPeer(t *testing.T) {
	vpptest.RequireSim(t, "the simulated BFD peer")
	v, h, uplink := tunnelSetup(t)
	sim := v.Sim()
	ctx := ctxT(t)
	route := pfx("10.244.1.0/26")
	v.AddRoute(vppsim.Route{Prefix: route, Paths: []vppsim.Path{{NextHop: addr(peerIP), SwIfIndex: uplink}}})
	s := bfdSpec(uplink, peerIP)
	s.DesiredMinTx, s.RequiredMinRx = 20*time.Millisecond, 20*time.Millisecond
	sim.SetBFDPeerAnswering(addr(peerIP), true)
	if err := h.c.AddBFDSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	for _, want := range []vppapi.BFDState{vppapi.BFDInit, vppapi.BFDUp} {
		if ev := nextBFD(t, h); ev.BFDSession != s || ev.State != want {
			t.Fatalf("event %+v, want %v", ev, want)
		}
	}
	if got := v.ForwardingVia(route); len(got) != 1 {
		t.Errorf("Up session: route forwards via %v", got)
	}
	sim.SetBFDPeerAnswering(addr(peerIP), false)
	if ev := nextBFD(t, h); ev.State != vppapi.BFDDown {
		t.Fatalf("event %+v after the peer stopped, want down", ev)
	}
	if got := v.ForwardingVia(route); got != nil {
		t.Errorf("Down session: route forwards via %v, want drop", got)
	}
	ch := rawChannel(t, v)
	setUplinkAdmin(t, ch, uplink, false)
	setUplinkAdmin(t, ch, uplink, true)
	if got := v.ForwardingVia(route); len(got) != 1 {
		t.Errorf("after uplink down/up: route forwards via %v, want the peer (VPP's defect)", got)
	}
	sim.SetBFDPeerAnswering(addr(peerIP), true)
	for _, want := range []vppapi.BFDState{vppapi.BFDInit, vppapi.BFDUp} {
		if ev := nextBFD(t, h); ev.State != want {
			t.Fatalf("event %+v, want %v", ev, want)
		}
	}
	sim.SetBFDPeerAnswering(addr(peerIP), false)
	nextBFD(t, h)
	if got := v.ForwardingVia(route); got != nil {
		t.Errorf("Down again after a state change: route forwards via %v, want drop (the defect ended)", got)
	}
}

// TestBFDEventsLostAndResync: a consumer that does not read gets, once the BFDEvents channel is full,
// no more events but a count of those dropped and a BFDResync signal; each new connection signals
// BFDResync too, and registers for events again (they flow after a VPP restart).
func TestBFDEventsLostAndResync(t *testing.T) {
	vpptest.RequireSim(t, "thousands of state changes in a second")
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	select {
	case <-h.c.BFDResync():
	case <-time.After(eventWait):
		t.Fatal("no BFDResync after connecting")
	}
	s := bfdSpec(uplink, peerIP)
	if err := h.c.AddBFDSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	const toggles = 2100 // 4200 events, more than the channel holds
	for range toggles {
		if err := h.c.SetBFDAdminUp(ctx, s.BFDKey, false); err != nil {
			t.Fatal(err)
		}
		if err := h.c.SetBFDAdminUp(ctx, s.BFDKey, true); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(eventWait)
	for h.c.BFDEventsLost() == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if h.c.BFDEventsLost() == 0 {
		t.Fatalf("no event counted lost after %d unread events", 2*toggles)
	}
	// The forwarder may still be dropping: the metric read first is at least 1 and at most the count after.
	if got := metricValue(t, h.reg, "vpp_route_agent_bfd_events_lost_total"); got < 1 || got > float64(h.c.BFDEventsLost()) {
		t.Errorf("vpp_route_agent_bfd_events_lost_total = %v, BFDEventsLost %d", got, h.c.BFDEventsLost())
	}
	select {
	case <-h.c.BFDResync():
	default:
		t.Error("no BFDResync signal after events were lost")
	}
	for len(h.c.BFDEvents()) > 0 {
		<-h.c.BFDEvents()
	}

	v.Restart()
	h.expect(vppapi.Disconnected)
	h.expect(vppapi.Connected)
	select {
	case <-h.c.BFDResync():
	case <-time.After(eventWait):
		t.Fatal("no BFDResync after reconnecting")
	}
	for len(h.c.BFDEvents()) > 0 {
		<-h.c.BFDEvents() // stragglers from before the restart
	}
	uplink, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx(nodeIP + "/24")}})
	if err != nil {
		t.Fatal(err)
	}
	s = bfdSpec(uplink, peerIP)
	if err := h.c.AddBFDSession(ctx, s); err != nil {
		t.Fatal(err)
	}
	if err := h.c.SetBFDAdminUp(ctx, s.BFDKey, false); err != nil {
		t.Fatal(err)
	}
	if ev := nextBFD(t, h); ev.State != vppapi.BFDAdminDown || ev.PID != v.PID() {
		t.Errorf("event after the restart = %+v, want admin-down from pid %d", ev, v.PID())
	}
}
