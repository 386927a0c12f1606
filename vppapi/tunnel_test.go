package vppapi_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/fib_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/binapi/teib"
	"go.fd.io/govpp/binapi/tunnel_types"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// These tests run against the simulator and, with VPP_TEST_BACKEND=real, a real VPP 26.06: the
// simulator's tunnel model (test/vppsim/tunnel.go) is held to what they assert.

const (
	nodeIP = "192.0.2.1"
	peerIP = "192.0.2.2"
)

// rawChannel opens a GoVPP channel of its own to v, for what vppapi does not expose (VPP's codes,
// ip_unnumbered_dump, the interface MTUs).
func rawChannel(t *testing.T, v *vpptest.VPP) api.Channel {
	t.Helper()
	conn, err := core.Connect(socketclient.NewVppClient(v.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Disconnect)
	ch, err := conn.NewAPIChannel()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(ch.Close)
	return ch
}

// retval sends req and returns VPP's retval (0 when it is not an error).
func retval(t *testing.T, ch api.Channel, req, reply api.Message) int32 {
	t.Helper()
	err := ch.SendRequest(req).ReceiveReply(reply)
	var apiErr api.VPPApiError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &apiErr):
		return int32(apiErr)
	}
	t.Fatalf("%s: %v", req.GetMessageName(), err)
	return 0
}

func apiAddr(s string) ip_types.Address {
	a := addr(s)
	if a.Is4() {
		return ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(a.As4())}
	}
	return ip_types.Address{Af: ip_types.ADDRESS_IP6, Un: ip_types.AddressUnionIP6(a.As16())}
}

// unnumbered returns ip_unnumbered_dump as borrower -> owner.
func unnumbered(t *testing.T, ch api.Channel) map[uint32]uint32 {
	t.Helper()
	out := map[uint32]uint32{}
	req := ch.SendMultiRequest(&ip.IPUnnumberedDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
	for {
		d := new(ip.IPUnnumberedDetails)
		last, err := req.ReceiveReply(d)
		if err != nil {
			t.Fatal(err)
		}
		if last {
			return out
		}
		out[uint32(d.SwIfIndex)] = uint32(d.IPSwIfIndex)
	}
}

// ifaceDetails returns sw_interface_details of idx, nil if VPP has no such interface.
func ifaceDetails(t *testing.T, ch api.Channel, idx uint32) *interfaces.SwInterfaceDetails {
	t.Helper()
	var found *interfaces.SwInterfaceDetails
	req := ch.SendMultiRequest(&interfaces.SwInterfaceDump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
	for {
		d := new(interfaces.SwInterfaceDetails)
		last, err := req.ReceiveReply(d)
		if err != nil {
			t.Fatal(err)
		}
		if last {
			return found
		}
		if uint32(d.SwIfIndex) == idx {
			found = d
		}
	}
}

// tunnelSetup connects a client to a fresh VPP whose uplink (sw_if_index 1) has nodeIP/24.
func tunnelSetup(t *testing.T) (*vpptest.VPP, *harness, uint32) {
	t.Helper()
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	uplink, err := h.c.SetupUplink(ctxT(t), vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx(nodeIP + "/24")}})
	if err != nil {
		t.Fatal(err)
	}
	return v, h, uplink
}

// TestIPIPTunnel: EnsureIPIPTunnel creates a p2p tunnel, unnumbered to the uplink, with the MTU asked
// for, admin up, and is idempotent (same index); the dump reports it; a route through it has no next
// hop and dumps as such.
func TestIPIPTunnel(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	spec := vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr(peerIP), Unnumbered: uplink, MTU: 1480}
	idx, err := h.c.EnsureIPIPTunnel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	again, err := h.c.EnsureIPIPTunnel(ctx, spec)
	if err != nil || again != idx {
		t.Fatalf("EnsureIPIPTunnel again = %d, %v; want %d (VPP's -79 carries the existing index)", again, err, idx)
	}
	if n := apiErrors(t, h.reg, "ipip_add_tunnel"); n != 0 {
		t.Errorf("an existing tunnel counted as %v API errors", n)
	}

	tunnels, err := h.c.DumpIPIPTunnels(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := vppapi.IPIPTunnel{SwIfIndex: idx, Instance: 0, Src: addr(nodeIP), Dst: addr(peerIP), Mode: vppapi.TunnelP2P, MTU: 1480}
	if !slices.Equal(tunnels, []vppapi.IPIPTunnel{want}) {
		t.Errorf("DumpIPIPTunnels = %v, want [%v]", tunnels, want)
	}
	d := ifaceDetails(t, ch, idx)
	switch {
	case d == nil:
		t.Fatalf("sw_interface_dump has no sw_if_index %d", idx)
	case d.InterfaceName != "ipip0" || d.InterfaceDevType != "IPIP tunnel device":
		t.Errorf("tunnel interface %q (%q), want ipip0 (IPIP tunnel device)", d.InterfaceName, d.InterfaceDevType)
	case d.Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP == 0:
		t.Errorf("tunnel not admin up: %v", d.Flags)
	case !slices.Equal(d.Mtu, []uint32{1480, 1480, 0, 0}):
		t.Errorf("tunnel MTU %v, want [1480 1480 0 0]", d.Mtu)
	}
	if got := unnumbered(t, ch); got[idx] != uplink {
		t.Errorf("ip_unnumbered_dump = %v, want %d borrowing from %d", got, idx, uplink)
	}

	r := vppapi.Route{Prefix: pfx("10.244.2.0/26"), SwIfIndex: idx}
	if res := h.c.Apply(ctx, []vppapi.Route{r}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	viaTunnel := []vppapi.Path{{SwIfIndex: idx, Type: vppapi.PathNormal}}
	for name, dump := range map[string]func() ([]vppapi.FIBEntry, error){
		"DumpRoutes":    func() ([]vppapi.FIBEntry, error) { return h.c.DumpRoutes(ctx, 0) },
		"DumpAPIRoutes": func() ([]vppapi.FIBEntry, error) { return h.c.DumpAPIRoutes(ctx, 0) },
	} {
		fib, err := dump()
		if err != nil {
			t.Fatal(err)
		}
		i := slices.IndexFunc(fib, func(e vppapi.FIBEntry) bool { return e.Prefix == r.Prefix })
		if i < 0 || !slices.Equal(fib[i].Paths, viaTunnel) {
			t.Errorf("%s: %v not dumped via sw_if_index %d without next hop: %v", name, r.Prefix, idx, fib)
		}
		// VPP resolves the tunnel's destination once a route uses the tunnel: a recursive-resolution /32
		// via the peer on the uplink, which only the dump of every source shows.
		rr := slices.ContainsFunc(fib, func(e vppapi.FIBEntry) bool {
			return e.Prefix == pfx(peerIP+"/32") && slices.Equal(e.Paths, []vppapi.Path{{NextHop: addr(peerIP), SwIfIndex: uplink}})
		})
		if rr != (name == "DumpRoutes") {
			t.Errorf("%s: %s/32 via %s on the uplink dumped: %v, want %v: %v", name, peerIP, peerIP, rr, !rr, fib)
		}
	}
}

// TestIPIPTunnelDelete: deleting a tunnel twice succeeds (VPP's -6 counts as gone); the tunnel leaves
// the dumps; a route through it stays dumped with its index (VPP keeps it, dropping), a new route through
// the deleted index fails with -54; the next tunnel takes the freed index, and the stale route still
// drops until it is deleted (no paths) and added again.
func TestIPIPTunnelDelete(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	keep, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr(peerIP), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	idx, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr("192.0.2.9"), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	r := vppapi.Route{Prefix: pfx("10.244.3.0/26"), SwIfIndex: idx}
	if res := h.c.Apply(ctx, []vppapi.Route{r}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	if !forwards(t, v, r.Prefix) {
		t.Fatalf("route through the tunnel does not forward")
	}
	for range 2 {
		if err := h.c.DeleteIPIPTunnel(ctx, idx); err != nil {
			t.Fatalf("DeleteIPIPTunnel: %v", err)
		}
	}
	if n := apiErrors(t, h.reg, "ipip_del_tunnel"); n != 0 {
		t.Errorf("a tunnel already gone counted as %v API errors", n)
	}
	if rv := retval(t, ch, &ipip.IpipDelTunnel{SwIfIndex: interface_types.InterfaceIndex(idx)}, new(ipip.IpipDelTunnelReply)); rv != -6 {
		t.Errorf("ipip_del_tunnel of a deleted tunnel: %d, want -6", rv)
	}
	if rv := retval(t, ch, &ipip.IpipDelTunnel{SwIfIndex: interface_types.InterfaceIndex(uplink)}, new(ipip.IpipDelTunnelReply)); rv != -6 {
		t.Errorf("ipip_del_tunnel of the uplink: %d, want -6", rv)
	}
	tunnels, err := h.c.DumpIPIPTunnels(ctx)
	if err != nil || len(tunnels) != 1 || tunnels[0].SwIfIndex != keep {
		t.Errorf("DumpIPIPTunnels after the delete = %v, %v; want only sw_if_index %d", tunnels, err, keep)
	}
	if d := ifaceDetails(t, ch, idx); d != nil {
		t.Errorf("sw_interface_dump still has the deleted tunnel: %+v", d)
	}
	if _, ok := unnumbered(t, ch)[idx]; ok {
		t.Errorf("ip_unnumbered_dump still has the deleted tunnel")
	}
	if all, err := h.c.DumpRoutes(ctx, 0); err != nil || slices.ContainsFunc(all, func(e vppapi.FIBEntry) bool { return e.Prefix == pfx("192.0.2.9/32") }) {
		t.Errorf("the deleted tunnel's destination still resolved (%v): %v", err, all)
	}

	fib, err := h.c.DumpAPIRoutes(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(fib, func(e vppapi.FIBEntry) bool {
		return e.Prefix == r.Prefix && slices.Equal(e.Paths, []vppapi.Path{{SwIfIndex: idx}})
	}) {
		t.Errorf("route through the deleted tunnel not dumped as before: %v", fib)
	}
	if forwards(t, v, r.Prefix) {
		t.Errorf("route through the deleted tunnel still forwards")
	}
	res := h.c.Apply(ctx, []vppapi.Route{{Prefix: pfx("10.244.5.0/26"), SwIfIndex: idx}}, nil)
	if len(res.Failed) != 1 || !errors.Is(res.Failed[0].Err, api.NO_MATCHING_INTERFACE) {
		t.Errorf("route through a deleted tunnel: %+v, want -54", res)
	}

	next, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr("192.0.2.3"), Unnumbered: uplink})
	if err != nil || next != idx {
		t.Fatalf("the next tunnel: sw_if_index %d, %v; want the freed %d", next, err, idx)
	}
	if forwards(t, v, r.Prefix) {
		t.Errorf("the stale route forwards through the tunnel that took its index")
	}
	// A delete (no paths) and an add bring it back.
	if res := h.c.Apply(ctx, nil, []vppapi.Route{r}); res.Err() != nil || res.Deleted != 1 {
		t.Errorf("delete the stale route: %+v", res)
	}
	if fib, err = h.c.DumpAPIRoutes(ctx, 0); err != nil || slices.ContainsFunc(fib, func(e vppapi.FIBEntry) bool { return e.Prefix == r.Prefix }) {
		t.Errorf("stale route still there after its delete (%v): %v", err, fib)
	}
	if res := h.c.Apply(ctx, []vppapi.Route{r}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	if !forwards(t, v, r.Prefix) {
		t.Errorf("the route added again through the new tunnel does not forward")
	}
}

// forwards reports whether the API route of p in table 0 forwards (its path resolves) rather than drops:
// the simulator's Route.Unresolved, a real VPP's "show ip fib".
func forwards(t *testing.T, v *vpptest.VPP, p netip.Prefix) bool {
	t.Helper()
	if sim := v.Sim(); sim != nil {
		r, ok := sim.APIRoute(0, p)
		if !ok {
			t.Fatalf("no API route %v", p)
		}
		return !r.Unresolved
	}
	out := v.CLI("show ip fib " + p.String())
	if !strings.Contains(out, p.String()) {
		t.Fatalf("show ip fib %v: %s", p, out)
	}
	return !strings.Contains(out, "dpo-drop")
}

// TestEnsureIPIPTunnelRejects: a spec that cannot make a tunnel fails with a clear error and creates
// nothing; an unknown outer table or unnumbered interface fails with VPP's code, the latter with the
// index of the tunnel it created.
func TestEnsureIPIPTunnelRejects(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	for _, spec := range []vppapi.IPIPSpec{
		{Dst: addr(peerIP), Unnumbered: uplink},
		{Src: addr(nodeIP), Dst: addr(nodeIP), Unnumbered: uplink},
		{Src: addr(nodeIP), Dst: addr("2001:db8::2"), Unnumbered: uplink},
		{Src: addr(nodeIP), Dst: addr("0.0.0.0"), Unnumbered: uplink},
	} {
		if _, err := h.c.EnsureIPIPTunnel(ctx, spec); err == nil {
			t.Errorf("EnsureIPIPTunnel(%+v) succeeded", spec)
		}
	}
	if tunnels, err := h.c.DumpIPIPTunnels(ctx); err != nil || len(tunnels) != 0 {
		t.Errorf("tunnels after rejected specs: %v, %v", tunnels, err)
	}
	if _, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr(peerIP), TableID: 77, Unnumbered: uplink}); !errors.Is(err, api.NO_SUCH_FIB) {
		t.Errorf("unknown outer table: %v, want -3", err)
	}
	idx, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr(peerIP), Unnumbered: 99})
	if !errors.Is(err, api.INVALID_SW_IF_INDEX_2) || idx == 0 {
		t.Errorf("unknown unnumbered interface: %d, %v; want -10 with the tunnel's index", idx, err)
	}
	if d := ifaceDetails(t, rawChannel(t, v), idx); d == nil || d.Flags != 0 {
		t.Errorf("the half-configured tunnel %d: %+v, want it admin down", idx, d)
	}
}

// TestIPIPCodes holds the simulator to the codes VPP 26.06 answers the tunnel messages with.
func TestIPIPCodes(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	tun, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr(peerIP), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	add := func(src, dst string, table, instance uint32, mode tunnel_types.TunnelMode) api.Message {
		return &ipip.IpipAddTunnel{Tunnel: ipip.IpipTunnel{Instance: instance, Src: apiAddr(src), Dst: apiAddr(dst), TableID: table, Mode: mode}}
	}
	const auto = ^uint32(0)
	bad := uint32(99)
	for _, tc := range []struct {
		name  string
		req   api.Message
		reply api.Message
		want  int32
	}{
		{"add: same src and dst", add(nodeIP, nodeIP, 0, auto, 0), new(ipip.IpipAddTunnelReply), -82},
		{"add: unknown table", add(nodeIP, "192.0.2.3", 77, auto, 0), new(ipip.IpipAddTunnelReply), -3},
		{"add: mixed families", add(nodeIP, "2001:db8::1", 0, auto, 0), new(ipip.IpipAddTunnelReply), -153},
		{"add: instance in use", add(nodeIP, "192.0.2.4", 0, 0, 0), new(ipip.IpipAddTunnelReply), -147},
		{"add: p2mp with a destination", add(nodeIP, "192.0.2.6", 0, auto, tunnel_types.TUNNEL_API_MODE_MP), new(ipip.IpipAddTunnelReply), -58},
		{"unnumbered: unknown owner", &interfaces.SwInterfaceSetUnnumbered{SwIfIndex: 99, UnnumberedSwIfIndex: interface_types.InterfaceIndex(tun), IsAdd: true}, new(interfaces.SwInterfaceSetUnnumberedReply), -10},
		{"unnumbered: unknown borrower", &interfaces.SwInterfaceSetUnnumbered{SwIfIndex: interface_types.InterfaceIndex(uplink), UnnumberedSwIfIndex: 99, IsAdd: true}, new(interfaces.SwInterfaceSetUnnumberedReply), -2},
		{"unnumbered: set again", &interfaces.SwInterfaceSetUnnumbered{SwIfIndex: interface_types.InterfaceIndex(uplink), UnnumberedSwIfIndex: interface_types.InterfaceIndex(tun), IsAdd: true}, new(interfaces.SwInterfaceSetUnnumberedReply), 0},
		{"mtu: unknown interface", &interfaces.SwInterfaceSetMtu{SwIfIndex: interface_types.InterfaceIndex(bad), Mtu: []uint32{1480, 1480, 0, 0}}, new(interfaces.SwInterfaceSetMtuReply), -2},
		{"teib: unknown interface", &teib.TeibEntryAddDel{IsAdd: 1, Entry: teib.TeibEntry{SwIfIndex: interface_types.InterfaceIndex(bad), Peer: apiAddr("10.255.0.2"), Nh: apiAddr(peerIP)}}, new(teib.TeibEntryAddDelReply), -2},
		{"teib: delete unknown", &teib.TeibEntryAddDel{IsAdd: 0, Entry: teib.TeibEntry{SwIfIndex: interface_types.InterfaceIndex(tun), Peer: apiAddr("10.255.0.9")}}, new(teib.TeibEntryAddDelReply), -6},
	} {
		if got := retval(t, ch, tc.req, tc.reply); got != tc.want {
			t.Errorf("%s: retval %d, want %d", tc.name, got, tc.want)
		}
	}
	r := new(ipip.IpipAddTunnelReply)
	if rv := retval(t, ch, add(nodeIP, peerIP, 0, auto, 0), r); rv != -79 || uint32(r.SwIfIndex) != tun {
		t.Errorf("add again: retval %d sw_if_index %d, want -79 and %d", rv, r.SwIfIndex, tun)
	}
	if d := ifaceDetails(t, ch, tun); d == nil || !slices.Equal(d.Mtu, []uint32{9000, 0, 0, 0}) || d.LinkMtu != 65516 {
		t.Errorf("a fresh tunnel's MTU: %+v, want 9000/0/0/0, link 65516", d)
	}
	// A tunnel is created admin down.
	r = new(ipip.IpipAddTunnelReply)
	if rv := retval(t, ch, add(nodeIP, "192.0.2.7", 0, auto, 0), r); rv != 0 {
		t.Fatalf("add: %d", rv)
	}
	if d := ifaceDetails(t, ch, uint32(r.SwIfIndex)); d == nil || d.Flags != 0 || d.InterfaceName != "ipip1" {
		t.Errorf("a new tunnel: %+v, want ipip1, admin down", d)
	}
}

// TestIPIPMultipoint: a p2mp tunnel (destination 0.0.0.0) with TEIB entries; adding an entry twice and
// deleting an unknown one succeed (VPP's -116 and -6); the entry's peer/32 appears via the tunnel.
func TestIPIPMultipoint(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	idx, err := h.c.EnsureIPIPMultipoint(ctx, addr(nodeIP), 0, uplink, 0)
	if err != nil {
		t.Fatal(err)
	}
	if again, err := h.c.EnsureIPIPMultipoint(ctx, addr(nodeIP), 0, uplink, 0); err != nil || again != idx {
		t.Fatalf("EnsureIPIPMultipoint again = %d, %v; want %d", again, err, idx)
	}
	tunnels, err := h.c.DumpIPIPTunnels(ctx)
	if want := (vppapi.IPIPTunnel{SwIfIndex: idx, Src: addr(nodeIP), Dst: addr("0.0.0.0"), Mode: vppapi.TunnelMP, MTU: 9000}); err != nil || !slices.Equal(tunnels, []vppapi.IPIPTunnel{want}) {
		t.Errorf("DumpIPIPTunnels = %v, %v; want [%v]", tunnels, err, want)
	}
	e := vppapi.TEIBEntry{SwIfIndex: idx, Peer: addr("10.255.0.2"), NextHop: addr(peerIP)}
	for range 2 {
		if err := h.c.AddTEIBEntry(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if rv := retval(t, ch, &teib.TeibEntryAddDel{IsAdd: 1, Entry: teib.TeibEntry{SwIfIndex: interface_types.InterfaceIndex(idx), Peer: apiAddr("10.255.0.2"), Nh: apiAddr(peerIP)}}, new(teib.TeibEntryAddDelReply)); rv != -116 {
		t.Errorf("teib add again: %d, want -116", rv)
	}
	entries, err := h.c.DumpTEIB(ctx)
	if err != nil || !slices.Equal(entries, []vppapi.TEIBEntry{e}) {
		t.Errorf("DumpTEIB = %v, %v; want [%v]", entries, err, e)
	}
	route := vppapi.Route{Prefix: pfx("10.244.2.0/26"), NextHop: e.Peer, SwIfIndex: idx}
	if res := h.c.Apply(ctx, []vppapi.Route{route}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	fib, err := h.c.DumpRoutes(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []netip.Prefix{pfx("10.255.0.2/32"), route.Prefix} {
		if !slices.ContainsFunc(fib, func(f vppapi.FIBEntry) bool {
			return f.Prefix == p && slices.Equal(f.Paths, []vppapi.Path{{NextHop: e.Peer, SwIfIndex: idx}})
		}) {
			t.Errorf("%v via %v on the tunnel missing: %v", p, e.Peer, fib)
		}
	}
	for range 2 {
		if err := h.c.DeleteTEIBEntry(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if entries, err := h.c.DumpTEIB(ctx); err != nil || len(entries) != 0 {
		t.Errorf("DumpTEIB after the delete = %v, %v", entries, err)
	}

	// The trap: a tunnel deleted before its entries leaves them behind, undeletable (-2), and the next
	// tunnel that takes its index inherits them.
	if err := h.c.AddTEIBEntry(ctx, e); err != nil {
		t.Fatal(err)
	}
	if err := h.c.DeleteIPIPTunnel(ctx, idx); err != nil {
		t.Fatal(err)
	}
	if entries, err := h.c.DumpTEIB(ctx); err != nil || !slices.Equal(entries, []vppapi.TEIBEntry{e}) {
		t.Errorf("DumpTEIB after the tunnel's delete = %v, %v; want the stale [%v]", entries, err, e)
	}
	del := &teib.TeibEntryAddDel{IsAdd: 0, Entry: teib.TeibEntry{SwIfIndex: interface_types.InterfaceIndex(idx), Peer: apiAddr("10.255.0.2")}}
	if rv := retval(t, ch, del, new(teib.TeibEntryAddDelReply)); rv != -2 {
		t.Errorf("delete a stale TEIB entry: %d, want -2", rv)
	}
	again, err := h.c.EnsureIPIPMultipoint(ctx, addr(nodeIP), 0, uplink, 0)
	if err != nil || again != idx {
		t.Fatalf("p2mp tunnel again: %d, %v; want the freed %d", again, err, idx)
	}
	if entries, err := h.c.DumpTEIB(ctx); err != nil || !slices.Equal(entries, []vppapi.TEIBEntry{e}) {
		t.Errorf("DumpTEIB with the new tunnel = %v, %v; want the inherited [%v]", entries, err, e)
	}
	if rv := retval(t, ch, del, new(teib.TeibEntryAddDelReply)); rv != 0 {
		t.Errorf("delete the inherited TEIB entry: %d, want 0", rv)
	}
}

// TestIPIPTunnelTag: a tag given to EnsureIPIPTunnel comes back in DumpIPIPTunnels (VPP keeps it on the
// interface, sw_interface_details.tag); a tunnel made without one has none; deleting the tunnel clears
// the tag, so the next interface to take its index is not taken for the tagger's. VPP refuses an empty
// tag (-7) and an unknown index (-2). InterfaceMTU reads the uplink's L3 MTU.
func TestIPIPTunnelTag(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	tagged, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr(peerIP), Unnumbered: uplink, Tag: "vpp-route-agent"})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr("192.0.2.3"), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	tags := func() map[uint32]string {
		tunnels, err := h.c.DumpIPIPTunnels(ctx)
		if err != nil {
			t.Fatal(err)
		}
		out := map[uint32]string{}
		for _, tun := range tunnels {
			out[tun.SwIfIndex] = tun.Tag
		}
		return out
	}
	if got := tags(); got[tagged] != "vpp-route-agent" || got[plain] != "" || len(got) != 2 {
		t.Errorf("tags = %v, want %d tagged vpp-route-agent and %d untagged", got, tagged, plain)
	}
	if at, ok, err := h.c.IPIPTunnelAt(ctx, tagged); err != nil || !ok || at.Tag != "vpp-route-agent" || at.Dst != addr(peerIP) {
		t.Errorf("IPIPTunnelAt(%d) = %+v, %v, %v; want the tagged tunnel", tagged, at, ok, err)
	}
	if at, ok, err := h.c.IPIPTunnelAt(ctx, uplink); err != nil || ok {
		t.Errorf("IPIPTunnelAt(uplink) = %+v, %v, %v; want no tunnel", at, ok, err)
	}
	if rv := retval(t, ch, &interfaces.SwInterfaceTagAddDel{IsAdd: true, SwIfIndex: interface_types.InterfaceIndex(plain)},
		&interfaces.SwInterfaceTagAddDelReply{}); rv != -7 {
		t.Errorf("an empty tag: retval %d, want -7", rv)
	}
	if rv := retval(t, ch, &interfaces.SwInterfaceTagAddDel{IsAdd: true, SwIfIndex: 999, Tag: "x"},
		&interfaces.SwInterfaceTagAddDelReply{}); rv != -2 {
		t.Errorf("an unknown index: retval %d, want -2", rv)
	}
	if err := h.c.DeleteIPIPTunnel(ctx, tagged); err != nil {
		t.Fatal(err)
	}
	again, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr("192.0.2.4"), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	if again != tagged {
		t.Logf("the new tunnel took index %d, not the freed %d", again, tagged)
	}
	if got := tags(); got[again] != "" {
		t.Errorf("a tunnel made without a tag at index %d has tag %q: the deleted tunnel's tag stayed", again, got[again])
	}
	if err := h.c.SetTunnelMTU(ctx, plain, 1300); err != nil {
		t.Fatal(err)
	}
	if at, _, err := h.c.IPIPTunnelAt(ctx, plain); err != nil || at.MTU != 1300 {
		t.Errorf("after SetTunnelMTU(1300): %+v, %v", at, err)
	}
	mtu, err := h.c.InterfaceMTU(ctx, uplink)
	if err != nil {
		t.Fatal(err)
	}
	if d := ifaceDetails(t, ch, uplink); mtu == 0 || (d.Mtu[0] != 0 && mtu != d.Mtu[0]) {
		t.Errorf("InterfaceMTU(uplink) = %d, sw_interface_details.mtu %v", mtu, d.Mtu)
	}
	if _, err := h.c.InterfaceMTU(ctx, 999); !errors.Is(err, vppapi.ErrNoInterface) {
		t.Errorf("InterfaceMTU(999) = %v, want ErrNoInterface", err)
	}
}

// TestIPIPHostRoutes: VPP gives a host prefix's path out of an interface with no next hop the prefix's
// own address as next hop (a /32 or /128 of a pod borrowed from another node's block, through that
// node's tunnel, dumps as "via 10.244.0.10 ipip0"), a shorter prefix's path has none. Both families;
// the client's dump and the raw one agree (the agent reads such a route as its own: agent.ownedRoute).
func TestIPIPHostRoutes(t *testing.T) {
	v, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	idx, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr(peerIP), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	routes := []vppapi.Route{
		{Prefix: pfx("10.244.0.10/32"), SwIfIndex: idx},
		{Prefix: pfx("fd10::5/128"), SwIfIndex: idx},
		{Prefix: pfx("10.244.0.64/26"), SwIfIndex: idx},
	}
	if res := h.c.Apply(ctx, routes, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	for _, r := range routes {
		fib, err := h.c.DumpAPIRoutes(ctx, 0)
		if err != nil {
			t.Fatal(err)
		}
		wantNH := netip.Addr{}
		if r.Prefix.IsSingleIP() {
			wantNH = r.Prefix.Addr()
		}
		i := slices.IndexFunc(fib, func(e vppapi.FIBEntry) bool { return e.Prefix == r.Prefix })
		if want := []vppapi.Path{{NextHop: wantNH, SwIfIndex: idx, Type: vppapi.PathNormal}}; i < 0 || !slices.Equal(fib[i].Paths, want) {
			t.Errorf("%v read back as %v, want %v", r.Prefix, fib, want)
		}
		var raw []fib_types.FibPath
		req := ch.SendMultiRequest(&ip.IPRouteDump{Table: ip.IPTable{IsIP6: r.Prefix.Addr().Is6()}})
		for {
			d := new(ip.IPRouteDetails)
			last, err := req.ReceiveReply(d)
			if err != nil {
				t.Fatal(err)
			}
			if last {
				break
			}
			if p, err := netip.ParsePrefix(d.Route.Prefix.String()); err == nil && p == r.Prefix {
				raw = d.Route.Paths
			}
		}
		var nh netip.Addr
		if len(raw) == 1 {
			nh = addrOfPath(raw[0])
		}
		if len(raw) != 1 || nh != wantNH {
			t.Errorf("%v: VPP dumps paths %+v (next hop %v), want one via %v", r.Prefix, raw, nh, wantNH)
		}
	}
}

// addrOfPath is a dumped path's next hop, the zero Addr for all zeros.
func addrOfPath(p fib_types.FibPath) netip.Addr {
	var a netip.Addr
	switch p.Proto {
	case fib_types.FIB_API_PATH_NH_PROTO_IP4:
		a = netip.AddrFrom4(p.Nh.Address.GetIP4())
	case fib_types.FIB_API_PATH_NH_PROTO_IP6:
		a = netip.AddrFrom16(p.Nh.Address.GetIP6())
	}
	if a.IsUnspecified() {
		return netip.Addr{}
	}
	return a
}
