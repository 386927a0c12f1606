package vppsim

import (
	"encoding/binary"
	"errors"
	"strings"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/memclnt"
	"go.fd.io/govpp/binapi/vpe"
	"go.fd.io/govpp/codec"
	"go.fd.io/govpp/core"
)

// handshake performs sockclnt_create on a raw connection and returns the
// decoded reply and its raw payload.
func (r *rawClient) handshake() (*memclnt.SockclntCreateReply, []byte) {
	r.t.Helper()
	data, err := codec.DefaultCodec.EncodeMsg(&memclnt.SockclntCreate{Name: "rawtest"}, 15)
	if err != nil {
		r.t.Fatal(err)
	}
	data[5] = 123 // GoVPP's context for the handshake
	r.writeFrame(data)
	p := r.readFrame(3 * time.Second)
	if p == nil {
		r.t.Fatal("no sockclnt_create_reply")
	}
	reply := new(memclnt.SockclntCreateReply)
	if err := codec.DefaultCodec.DecodeMsg(p, reply); err != nil {
		r.t.Fatalf("decode sockclnt_create_reply: %v", err)
	}
	r.index = reply.Index
	return reply, p
}

func TestHandshakeMessageTable(t *testing.T) {
	s := startSim(t, Config{})
	r := dialRaw(t, s)
	reply, p := r.handshake()

	if id := binary.BigEndian.Uint16(p); id != 16 {
		t.Errorf("reply id = %d, want 16", id)
	}
	// sockclnt_create_reply is request-shaped: the context is at offset 6.
	if ctx := binary.BigEndian.Uint32(p[6:10]); ctx != 123 {
		t.Errorf("reply context = %d, want 123", ctx)
	}
	if reply.Response != 0 || reply.Index == 0 {
		t.Errorf("response %d index %d", reply.Response, reply.Index)
	}
	if int(reply.Count) != len(reply.MessageTable) {
		t.Errorf("count %d, table %d", reply.Count, len(reply.MessageTable))
	}
	byName := map[string]uint16{}
	ids := map[uint16]bool{}
	for _, e := range reply.MessageTable {
		if ids[e.Index] {
			t.Errorf("duplicate id %d", e.Index)
		}
		ids[e.Index] = true
		byName[e.Name] = e.Index
	}
	for i := 1; i <= len(byName); i++ {
		if !ids[uint16(i)] {
			t.Errorf("id %d missing: ids are not contiguous", i)
		}
	}
	fixed := map[string]uint16{
		"memclnt_create_9c5e1c2f":         1,
		"sockclnt_create_455fb9c4":        15,
		"sockclnt_create_reply_35166268":  16,
		"sockclnt_delete_8ac76db6":        17,
		"sockclnt_delete_reply_8f38b1ee":  18,
		"control_ping_51077d14":           23,
		"control_ping_reply_f6b0b8ca":     24,
		"get_api_json_reply_ea715b59":     28,
		"ip_route_add_del_b8ecfe0d":       0,
		"ip_route_dump_b9d2e09e":          0,
		"ip_table_add_del_0ffdaec0":       0,
		"sw_interface_dump_aa610c27":      0,
		"sw_interface_set_flags_f5aec1b8": 0,
		"ip_address_dump_2d033de4":        0,
		"show_version_51077d14":           0,
		"want_interface_events_476f5a08":  0,
	}
	for name, want := range fixed {
		got, ok := byName[name]
		switch {
		case !ok:
			t.Errorf("%s missing from the table", name)
		case want != 0 && got != want:
			t.Errorf("%s has id %d, want %d", name, got, want)
		case want == 0 && got < firstDynamicID:
			t.Errorf("%s has id %d, want >= 29", name, got)
		}
	}
	for _, pkg := range [][]api.Message{memclnt.AllMessages(), vpe.AllMessages(), ip.AllMessages(), interfaces.AllMessages()} {
		for _, m := range pkg {
			if _, ok := byName[m.GetMessageName()+"_"+m.GetCrcString()]; !ok {
				t.Errorf("%s_%s missing from the table", m.GetMessageName(), m.GetCrcString())
			}
		}
	}
	for name, id := range byName {
		if id <= 28 && name[:len(name)-9] != memclntOrder[id-1] {
			t.Errorf("id %d is %s, want %s", id, name, memclntOrder[id-1])
		}
	}
}

func TestMessageOrderSeed(t *testing.T) {
	a, err := buildMsgTable(nil, 0, true)
	if err != nil {
		t.Fatal(err)
	}
	b, err := buildMsgTable(nil, 42, true)
	if err != nil {
		t.Fatal(err)
	}
	if a.id("control_ping") != 23 || b.id("control_ping") != 23 {
		t.Error("memclnt ids must not move")
	}
	moved := 0
	for name, mi := range a.byName {
		if b.byName[name].id != mi.id {
			moved++
		}
	}
	if moved == 0 {
		t.Error("seed did not change any id")
	}
	// GoVPP works against a shuffled build.
	s := startSim(t, Config{MessageOrderSeed: 7})
	ch := channel(t, connect(t, s))
	reply := new(ip.IPRouteAddDelReply)
	if err := ch.SendRequest(routeReq(true, false, 0, "10.9.0.0/24", nhPath("172.16.0.2", 1))).ReceiveReply(reply); err != nil {
		t.Fatalf("route add: %v", err)
	}
	if len(s.APIRoutes(0)) != 1 {
		t.Errorf("API routes: %v", s.APIRoutes(0))
	}
}

func TestConnectPingVersion(t *testing.T) {
	s := startSim(t, Config{Version: "24.02-rc0~1"})
	conn := connect(t, s)
	ch := channel(t, conn)

	ping := new(memclnt.ControlPingReply)
	if err := ch.SendRequest(&memclnt.ControlPing{}).ReceiveReply(ping); err != nil {
		t.Fatalf("control_ping: %v", err)
	}
	if ping.VpePID != s.PID() || ping.VpePID == 0 {
		t.Errorf("vpe_pid = %d, want %d", ping.VpePID, s.PID())
	}
	ver := new(vpe.ShowVersionReply)
	if err := ch.SendRequest(&vpe.ShowVersion{}).ReceiveReply(ver); err != nil {
		t.Fatalf("show_version: %v", err)
	}
	if ver.Version != "24.02-rc0~1" || ver.Program != "vpe" {
		t.Errorf("show_version = %+v", ver)
	}
	if n := s.CountRequests("sockclnt_create"); n != 1 {
		t.Errorf("sockclnt_create count = %d", n)
	}
	if n := s.CountRequests("control_ping"); n != 1 {
		t.Errorf("control_ping count = %d", n)
	}
}

var usedMessages = []api.Message{
	&ip.IPRouteAddDel{}, &ip.IPRouteAddDelReply{}, &ip.IPRouteDump{}, &ip.IPRouteDetails{},
	&ip.IPTableAddDel{}, &ip.IPTableAddDelReply{}, &ip.IPAddressDump{}, &ip.IPAddressDetails{},
	&interfaces.SwInterfaceDump{}, &interfaces.SwInterfaceDetails{},
	&interfaces.SwInterfaceSetFlags{}, &interfaces.SwInterfaceSetFlagsReply{},
	&interfaces.SwInterfaceAddDelAddress{}, &interfaces.SwInterfaceAddDelAddressReply{},
	&interfaces.WantInterfaceEvents{}, &interfaces.WantInterfaceEventsReply{}, &interfaces.SwInterfaceEvent{},
	&vpe.ShowVersion{}, &vpe.ShowVersionReply{}, &memclnt.ControlPing{}, &memclnt.ControlPingReply{},
}

func TestCheckCompatibility(t *testing.T) {
	s := startSim(t, Config{})
	if err := channel(t, connect(t, s)).CheckCompatiblity(usedMessages...); err != nil {
		t.Errorf("CheckCompatiblity against the real CRCs: %v", err)
	}

	old := startSim(t, Config{CRCOverrides: map[string]string{"ip_route_add_del": "DEADBEEF"}})
	ch := channel(t, connect(t, old)) // Connect succeeds against an incompatible VPP
	err := ch.CheckCompatiblity(usedMessages...)
	var cerr *api.CompatibilityError
	if !errors.As(err, &cerr) {
		t.Fatalf("CheckCompatiblity = %v, want *api.CompatibilityError", err)
	}
	if len(cerr.IncompatibleMessages) != 1 || cerr.IncompatibleMessages[0] != "ip_route_add_del_b8ecfe0d" {
		t.Errorf("incompatible = %v", cerr.IncompatibleMessages)
	}
	// The send fails locally: GoVPP has no id for its version of the message.
	err = ch.SendRequest(routeReq(true, false, 0, "10.9.0.0/24", nhPath("172.16.0.2", 1))).ReceiveReply(&ip.IPRouteAddDelReply{})
	if err == nil || !strings.Contains(err.Error(), "unknown message") {
		t.Errorf("send of an incompatible message: %v", err)
	}
	if old.CountRequests("ip_route_add_del") != 0 {
		t.Error("the incompatible message reached the simulator")
	}

	if _, err := New(Config{CRCOverrides: map[string]string{"no_such_message": "deadbeef"}}); err == nil {
		t.Error("override of an unknown message accepted")
	}
	if _, err := New(Config{CRCOverrides: map[string]string{"ip_route_add_del": "xyz"}}); err == nil {
		t.Error("override with a bad CRC accepted")
	}
}

func TestContextEchoAndHeaderShapes(t *testing.T) {
	s := startSim(t, Config{})
	r := dialRaw(t, s)
	r.handshake()
	for _, ctx := range []uint32{0xdeadbeef, 1, 0x7fff0001} {
		r.send(&memclnt.ControlPing{}, ctx)
		p := r.readFrame(2 * time.Second)
		if p == nil {
			t.Fatal("no control_ping_reply")
		}
		if id := binary.BigEndian.Uint16(p); id != 24 {
			t.Errorf("reply id %d, want 24", id)
		}
		// control_ping_reply is reply-shaped: context right after the id.
		if got := binary.BigEndian.Uint32(p[2:6]); got != ctx {
			t.Errorf("context %#x, want %#x", got, ctx)
		}
		reply := r.decode(p).(*memclnt.ControlPingReply)
		if reply.VpePID != s.PID() || reply.Retval != 0 {
			t.Errorf("reply %+v", reply)
		}
	}
}

func TestDumpDetailsThenPingReply(t *testing.T) {
	s := startSim(t, Config{Interfaces: []string{"eth0", "eth1"}})
	r := dialRaw(t, s)
	r.handshake()
	r.send(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0)}, 77)
	r.send(&memclnt.ControlPing{}, 77)
	var names []string
	for {
		p := r.readFrame(2 * time.Second)
		if p == nil {
			t.Fatal("dump did not end with control_ping_reply")
		}
		if ctx := binary.BigEndian.Uint32(p[2:6]); ctx != 77 {
			t.Errorf("context %d, want 77", ctx)
		}
		m := r.decode(p)
		if _, ok := m.(*memclnt.ControlPingReply); ok {
			break
		}
		names = append(names, m.(*interfaces.SwInterfaceDetails).InterfaceName)
	}
	if strings.Join(names, ",") != "local0,eth0,eth1" {
		t.Errorf("interfaces %v", names)
	}

	// A dump of something absent: zero details, then the ping reply.
	r.send(&ip.IPRouteDump{Table: ip.IPTable{TableID: 99}}, 78)
	r.send(&memclnt.ControlPing{}, 78)
	p := r.readFrame(2 * time.Second)
	if p == nil {
		t.Fatal("no reply")
	}
	if _, ok := r.decode(p).(*memclnt.ControlPingReply); !ok {
		t.Errorf("empty dump sent %T before the ping reply", r.decode(p))
	}
}

func TestUnknownMessagesGetNoReply(t *testing.T) {
	s := startSim(t, Config{})
	r := dialRaw(t, s)

	// Before the handshake nothing request-shaped is answered.
	r.send(&memclnt.ControlPing{}, 1)
	if p := r.readFrame(200 * time.Millisecond); p != nil {
		t.Fatalf("reply before the handshake: % x", p)
	}
	r.handshake()
	// Unknown message id.
	r.writeFrame([]byte{0xff, 0xf0, 0, 0, 0, 1, 0, 0, 0, 2})
	// Known id without a handler.
	r.send(&ip.SetIPFlowHash{}, 3)
	// Unknown client index.
	r.writeFrame(r.encode(&memclnt.ControlPing{}, r.index+1000, 4))
	// Too short to carry a header, and empty.
	r.writeFrame([]byte{0})
	r.writeFrame(nil)
	// A well-formed ping is still answered, and it is the only reply.
	r.send(&memclnt.ControlPing{}, 5)
	p := r.readFrame(2 * time.Second)
	if p == nil {
		t.Fatal("no reply to a valid ping")
	}
	if ctx := binary.BigEndian.Uint32(p[2:6]); ctx != 5 {
		t.Errorf("got a reply with context %d: only context 5 should be answered", ctx)
	}

	// Through GoVPP: a message without handler times out.
	ch := channel(t, connect(t, s))
	ch.SetReplyTimeout(300 * time.Millisecond)
	err := ch.SendRequest(&ip.SetIPFlowHash{}).ReceiveReply(&ip.SetIPFlowHashReply{})
	if !errors.Is(err, core.ErrReplyTimeout) {
		t.Errorf("set_ip_flow_hash: %v, want a reply timeout", err)
	}
}

func TestSockclntDelete(t *testing.T) {
	s := startSim(t, Config{})
	r := dialRaw(t, s)
	r.handshake()
	r.send(&memclnt.SockclntDelete{Index: r.index}, 124)
	p := r.readFrame(2 * time.Second)
	if p == nil {
		t.Fatal("no sockclnt_delete_reply")
	}
	if rep, ok := r.decode(p).(*memclnt.SockclntDeleteReply); !ok || rep.Response != 1 {
		t.Errorf("reply %+v, want response 1", r.decode(p))
	}
	if p := r.readFrame(time.Second); p != nil {
		t.Error("connection still open after sockclnt_delete")
	}

	// GoVPP's Disconnect sends sockclnt_delete with whatever id the table
	// listed last for the prefix "sockclnt_delete_" (18 in id order).
	conn := connect(t, s)
	conn.Disconnect()
	deadline := time.Now().Add(2 * time.Second)
	for s.CountRequests("sockclnt_delete_reply")+s.CountRequests("sockclnt_delete") < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if s.CountRequests("sockclnt_delete_reply") != 1 {
		t.Errorf("GoVPP sent sockclnt_delete as id 17 (%d) / 18 (%d)", s.CountRequests("sockclnt_delete"), s.CountRequests("sockclnt_delete_reply"))
	}
}
