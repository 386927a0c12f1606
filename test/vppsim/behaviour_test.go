package vppsim

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"testing"
	"time"

	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/core"
)

func TestInterfaceEvents(t *testing.T) {
	s := startSim(t, Config{})
	conn := connect(t, s)
	ch := channel(t, conn)

	// Subscribe before enabling, as a client must.
	w, err := conn.WatchEvent(context.Background(), &interfaces.SwInterfaceEvent{})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if rv := do(t, ch, &interfaces.WantInterfaceEvents{EnableDisable: 1, PID: 4242}, new(interfaces.WantInterfaceEventsReply)); rv != 0 {
		t.Fatalf("enable: %d", rv)
	}
	if rv := do(t, ch, &interfaces.WantInterfaceEvents{EnableDisable: 1, PID: 4242}, new(interfaces.WantInterfaceEventsReply)); rv != -31 {
		t.Errorf("double enable: %d, want -31", rv)
	}
	next := func() *interfaces.SwInterfaceEvent {
		t.Helper()
		select {
		case e := <-w.Events():
			return e.(*interfaces.SwInterfaceEvent)
		case <-time.After(2 * time.Second):
			t.Fatal("no sw_interface_event")
			return nil
		}
	}

	if err := s.SetLinkState(1, false); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.SwIfIndex != 1 || e.Flags != 0 || e.PID != 4242 {
		t.Errorf("link down event %+v", e)
	}
	if err := s.SetLinkState(1, true); err != nil {
		t.Fatal(err)
	}
	if e := next(); e.Flags != 0 {
		t.Errorf("carrier up on an admin-down interface: event %+v, want link down", e)
	}
	if err := s.SetLinkState(9, true); err == nil {
		t.Error("SetLinkState of a missing interface succeeded")
	}
	do(t, ch, &interfaces.SwInterfaceSetFlags{SwIfIndex: 1, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}, new(interfaces.SwInterfaceSetFlagsReply))
	if e := next(); e.Flags != interface_types.IF_STATUS_API_FLAG_ADMIN_UP|interface_types.IF_STATUS_API_FLAG_LINK_UP {
		t.Errorf("admin up event %+v", e)
	}
	_ = s.SetLinkState(1, false)
	if e := next(); e.Flags != interface_types.IF_STATUS_API_FLAG_ADMIN_UP {
		t.Errorf("carrier loss event %+v", e)
	}
	if ifs := s.Interfaces(); !ifs[1].AdminUp || ifs[1].LinkUp {
		t.Errorf("Interfaces() after carrier loss: %+v", ifs[1])
	}
	if rv := do(t, ch, &interfaces.WantInterfaceEvents{EnableDisable: 0}, new(interfaces.WantInterfaceEventsReply)); rv != 0 {
		t.Errorf("disable: %d", rv)
	}
	if rv := do(t, ch, &interfaces.WantInterfaceEvents{EnableDisable: 0}, new(interfaces.WantInterfaceEventsReply)); rv != -31 {
		t.Errorf("disable when not enabled: %d, want -31", rv)
	}
	_ = s.SetLinkState(1, false)
	select {
	case e := <-w.Events():
		t.Errorf("event after disable: %+v", e)
	case <-time.After(100 * time.Millisecond):
	}
}

func TestEventAfterTriggeringReply(t *testing.T) {
	s := startSim(t, Config{})
	r := dialRaw(t, s)
	r.handshake()
	r.send(&interfaces.WantInterfaceEvents{EnableDisable: 1, PID: 1}, 1)
	if p := r.readFrame(2 * time.Second); p == nil {
		t.Fatal("no want_interface_events_reply")
	}
	r.send(&interfaces.SwInterfaceSetFlags{SwIfIndex: 1, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}, 2)
	first, second := r.readFrame(2*time.Second), r.readFrame(2*time.Second)
	if first == nil || second == nil {
		t.Fatal("missing reply or event")
	}
	if _, ok := r.decode(first).(*interfaces.SwInterfaceSetFlagsReply); !ok {
		t.Errorf("first frame %T, want the reply", r.decode(first))
	}
	if _, ok := r.decode(second).(*interfaces.SwInterfaceEvent); !ok {
		t.Errorf("second frame %T, want the event", r.decode(second))
	}
	// The event is event-shaped: the client_index follows the id.
	if got := uint32(second[2])<<24 | uint32(second[3])<<16 | uint32(second[4])<<8 | uint32(second[5]); got != r.index {
		t.Errorf("event client_index %d, want %d", got, r.index)
	}

	// On EOF the registration is forgotten.
	_ = r.nc.Close()
	waitFor(t, "registration forgotten", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.eventRegs) == 0 && len(s.clients) == 0
	})
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for: %s", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestFaultNoReply(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	ch.SetReplyTimeout(200 * time.Millisecond)
	s.SetFaults(Faults{NoReply: true})
	err := ch.SendRequest(routeReq(true, false, 0, "10.1.0.0/24", nhPath("172.16.0.2", 1))).ReceiveReply(new(ip.IPRouteAddDelReply))
	if !errors.Is(err, core.ErrReplyTimeout) {
		t.Errorf("route add under NoReply: %v, want a timeout", err)
	}
	if len(s.APIRoutes(0)) != 1 {
		t.Error("request not applied under NoReply")
	}
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); err != nil {
		t.Errorf("ping under NoReply: %v", err)
	}
	s.SetFaults(Faults{})
	// The late reply of the timed-out request is ignored by GoVPP (older seq).
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); err != nil {
		t.Errorf("ping after clearing the fault: %v", err)
	}
}

func TestFaultNoPingReply(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	ch.SetReplyTimeout(200 * time.Millisecond)
	s.SetFaults(Faults{NoPingReply: true})
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); !errors.Is(err, core.ErrReplyTimeout) {
		t.Errorf("ping under NoPingReply: %v, want a timeout", err)
	}
	if rv := do(t, ch, routeReq(true, false, 0, "10.1.0.0/24", nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply)); rv != 0 {
		t.Errorf("route add under NoPingReply: %d", rv)
	}
}

func TestFaultReplyDelay(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	s.SetFaults(Faults{ReplyDelay: 150 * time.Millisecond})
	start := time.Now()
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 150*time.Millisecond {
		t.Errorf("reply after %v, want >= 150ms", d)
	}
	// Close does not wait for a pending slow reply.
	s.SetFaults(Faults{ReplyDelay: time.Hour})
	ch.SendRequest(&memclnt.ControlPing{})
	time.Sleep(50 * time.Millisecond)
	start = time.Now()
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Close took %v with a reply pending", d)
	}
}

func TestFaultHangUpAfter(t *testing.T) {
	s := startSim(t, Config{})
	s.SetFaults(Faults{HangUpAfter: 3})
	r := dialRaw(t, s)
	r.handshake() // message 1
	r.send(&memclnt.ControlPing{}, 2)
	if r.readFrame(2*time.Second) == nil {
		t.Fatal("no reply to message 2")
	}
	r.send(&memclnt.ControlPing{}, 3)
	if r.readFrame(2*time.Second) == nil {
		t.Fatal("no reply to message 3: the last message is answered before the hang-up")
	}
	if p := r.readFrame(2 * time.Second); p != nil {
		t.Fatal("connection still open after 3 messages")
	}

	// With GoVPP: Connect succeeds, the requests after the limit fail.
	s.SetFaults(Faults{HangUpAfter: 2})
	ch := channel(t, connect(t, s))
	ch.SetReplyTimeout(300 * time.Millisecond)
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); err != nil {
		t.Fatalf("message 2: %v", err)
	}
	var err error
	for range 3 {
		if err = ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); err != nil {
			break
		}
	}
	if err == nil {
		t.Error("requests still answered after the hang-up")
	}
}

// TestRestartAsyncReconnect checks that an AsyncConnect client reconnects by
// itself after Restart and sees the new pid and an empty FIB.
func TestRestartAsyncReconnect(t *testing.T) {
	s := startSim(t, Config{})
	conn, events, err := core.AsyncConnect(socketclient.NewVppClient(s.SocketPath()), 10, 100*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Disconnect()
	waitState := func(want core.ConnectionState) {
		t.Helper()
		timeout := time.After(10 * time.Second)
		for {
			select {
			case e := <-events:
				if e.State == want {
					return
				}
			case <-timeout:
				t.Fatalf("no %v event", want)
			}
		}
	}
	waitState(core.Connected)
	ping := func() uint32 {
		t.Helper()
		ch, err := conn.NewAPIChannel()
		if err != nil {
			t.Fatal(err)
		}
		defer ch.Close()
		ch.SetReplyTimeout(time.Second)
		r := new(memclnt.ControlPingReply)
		if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(r); err != nil {
			t.Fatalf("ping: %v", err)
		}
		return r.VpePID
	}
	pid1 := ping()
	if pid1 != s.PID() {
		t.Fatalf("pid %d, sim %d", pid1, s.PID())
	}
	if err := s.AddRoute(Route{Prefix: netip.MustParsePrefix("10.0.0.0/8"), Paths: []Path{{Type: "drop"}}}); err != nil {
		t.Fatal(err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if s.PID() == pid1 {
		t.Fatal("pid unchanged by Restart")
	}
	if len(s.APIRoutes(0)) != 0 {
		t.Error("API routes survived Restart")
	}
	waitState(core.Disconnected)
	waitState(core.Connected)
	if pid2 := ping(); pid2 != s.PID() || pid2 == pid1 {
		t.Errorf("pid after reconnect %d, sim %d, before %d", pid2, s.PID(), pid1)
	}
}

func TestRestartResetsState(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	do(t, ch, &interfaces.SwInterfaceSetFlags{SwIfIndex: 1, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}, new(interfaces.SwInterfaceSetFlagsReply))
	do(t, ch, addrReq(1, true, "172.16.0.1/24"), new(interfaces.SwInterfaceAddDelAddressReply))
	do(t, ch, &ip.IPTableAddDel{IsAdd: true, Table: ip.IPTable{TableID: 5}}, new(ip.IPTableAddDelReply))
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	ifs := s.Interfaces()
	if len(ifs) != 2 || ifs[1].AdminUp || len(ifs[1].Addresses) != 0 {
		t.Errorf("interfaces after restart: %+v", ifs)
	}
	if got := len(s.Routes(0, false)); got != 5 {
		t.Errorf("%d IPv4 routes after restart, want the 5 specials", got)
	}
	if s.Routes(5, false) != nil {
		t.Error("table 5 survived restart")
	}
	// The old connection is gone; a new one works.
	ch.SetReplyTimeout(200 * time.Millisecond)
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); err == nil {
		t.Error("old connection still answered after restart")
	}
	ch2 := channel(t, connect(t, s))
	if err := ch2.SendRequest(&memclnt.ControlPing{}).ReceiveReply(new(memclnt.ControlPingReply)); err != nil {
		t.Error(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
	if err := s.Restart(); err == nil {
		t.Error("Restart after Close succeeded")
	}
}

// TestPipelinedStream pushes 20k ip_route_add_del through one GoVPP Stream
// with a window below the reply buffer, checking every reply.
func TestPipelinedStream(t *testing.T) {
	s := startSim(t, Config{MaxRequestLog: -1})
	conn := connect(t, s)
	const n, window = 20000, 256
	stream, err := conn.NewStream(context.Background(), core.WithRequestSize(window), core.WithReplySize(2*window), core.WithReplyTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = stream.Close() }()
	start := time.Now()
	inFlight, sent, recvd := 0, 0, 0
	for recvd < n {
		for inFlight < window && sent < n {
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(sent >> 8), byte(sent), 0}), 24)
			if err := stream.SendMsg(routeReq(true, false, 0, p.String(), nhPath("172.16.0.2", 1))); err != nil {
				t.Fatalf("send %d: %v", sent, err)
			}
			sent++
			inFlight++
		}
		m, err := stream.RecvMsg()
		if err != nil {
			t.Fatalf("recv %d: %v", recvd, err)
		}
		if r, ok := m.(*ip.IPRouteAddDelReply); !ok || r.Retval != 0 {
			t.Fatalf("reply %d: %#v", recvd, m)
		}
		recvd++
		inFlight--
	}
	d := time.Since(start)
	t.Logf("%d routes in %v: %.0f routes/s (race detector: %v)", n, d, float64(n)/d.Seconds(), raceEnabled)
	if got := len(s.APIRoutes(0)); got != n {
		t.Errorf("%d API routes, want %d", got, n)
	}
	if s.CountRequests("ip_route_add_del") != n || len(s.Requests()) != 0 {
		t.Errorf("count %d, log %d", s.CountRequests("ip_route_add_del"), len(s.Requests()))
	}
}

func TestRequestLog(t *testing.T) {
	s := startSim(t, Config{MaxRequestLog: 10})
	ch := channel(t, connect(t, s))
	for i := range 25 {
		do(t, ch, routeReq(true, false, 0, fmt.Sprintf("10.%d.0.0/16", i), nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply))
	}
	reqs := s.Requests()
	if len(reqs) == 0 || len(reqs) > 10 {
		t.Fatalf("%d requests logged, cap 10", len(reqs))
	}
	last := reqs[len(reqs)-1]
	m, ok := last.Msg.(*ip.IPRouteAddDel)
	if !ok || last.Name != "ip_route_add_del" || last.Client == 0 || last.Time.IsZero() {
		t.Fatalf("last request %+v", last)
	}
	if p, _, _ := prefixFromAPI(m.Route.Prefix); p.String() != "10.24.0.0/16" {
		t.Errorf("last logged prefix %v", p)
	}
	if s.CountRequests("ip_route_add_del") != 25 {
		t.Errorf("count %d, want 25", s.CountRequests("ip_route_add_del"))
	}
	if s.RequestCounts()["sockclnt_create"] != 1 {
		t.Errorf("counts %v", s.RequestCounts())
	}
	s.ResetRequests()
	if len(s.Requests()) != 0 || s.CountRequests("ip_route_add_del") != 0 {
		t.Error("ResetRequests left entries")
	}
}

func TestDecodeIsBounded(t *testing.T) {
	s := startSim(t, Config{})
	for name, want := range map[string]bool{
		"ip_route_add_del":      true,  // u8 n_paths
		"sockclnt_create_reply": true,  // u16 count
		"sw_interface_dump":     true,  // string[] (no allocation by count)
		"rpc_call":              false, // u32 data_len
		"api_versions_reply":    false, // u32 count
	} {
		if got := s.table.byName[name].safe; got != want {
			t.Errorf("%s bounded = %v, want %v", name, got, want)
		}
	}
	var _ api.Message = (*memclnt.RPCCall)(nil)
}

// TestDeleteCreateInterface: the index rules of DeleteInterface and CreateInterface, and what a deletion
// takes with it (addresses and their routes, neighbour adjacencies) and leaves (API routes, dead).
func TestDeleteCreateInterface(t *testing.T) {
	s, err := New(Config{Interfaces: []string{"loop0", "loop1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetAddress(1, netip.MustParsePrefix("192.0.2.7/24"), true); err != nil {
		t.Fatal(err)
	}
	if err := s.ResolveNeighbor(1, netip.MustParseAddr("192.0.2.9")); err != nil {
		t.Fatal(err)
	}
	route := Route{Prefix: netip.MustParsePrefix("10.244.3.0/26"), Paths: []Path{{NextHop: netip.MustParseAddr("192.0.2.9"), SwIfIndex: 1}}}
	if err := s.AddRoute(route); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteInterface("nope"); err == nil {
		t.Error("deleting a missing interface succeeded")
	}
	if err := s.DeleteInterface("loop0"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteInterface("loop0"); err == nil {
		t.Error("deleting a deleted interface succeeded")
	}
	var sources []string
	for _, r := range s.Routes(0, false) {
		sources = append(sources, fmt.Sprintf("%v %v unresolved=%v", r.Prefix, r.Source, r.Unresolved))
	}
	if want := "10.244.3.0/26 api unresolved=true"; len(sources) != 6 || !slices.Contains(sources, want) {
		t.Errorf("table 0 after the deletion: %q; want the 5 defaults and %q", sources, want)
	}
	if err := s.AddRoute(Route{Prefix: netip.MustParsePrefix("10.244.4.0/26"), Paths: route.Paths}); err == nil {
		t.Error("a route through the deleted interface was added")
	}
	if _, err := s.CreateInterface("loop1"); err == nil {
		t.Error("creating an existing name succeeded")
	}
	if idx, err := s.CreateInterface("tap0"); err != nil || idx != 1 {
		t.Errorf("tap0 created as %d, %v; want the freed index 1", idx, err)
	}
	if idx, err := s.CreateInterface("loop0"); err != nil || idx != 3 {
		t.Errorf("loop0 created as %d, %v; want the next index 3", idx, err)
	}
	if r, _ := s.APIRoute(0, route.Prefix); !r.Unresolved {
		t.Error("the dead route came back to life with the new interfaces")
	}
	if got := s.Interfaces(); len(got) != 4 || got[1].Name != "tap0" || got[1].AdminUp || len(got[1].Addresses) != 0 {
		t.Errorf("interfaces: %+v", got)
	}
}
