package vppapi_test

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/ethernet_types"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_neighbor"
	"go.fd.io/govpp/binapi/vlib"
	"go.fd.io/govpp/binapi/vxlan"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// These tests run against the simulator and, with VPP_TEST_BACKEND=real, a real VPP 26.06: with the lab
// build (VPP_PKG=/opt/vpp-v26.06-lab) VPP loads the vxlan plugin, with the minimal build it has none and
// the tests that need it are skipped, while TestVXLANAbsent runs on every backend. The simulator's vxlan
// model (test/vppsim/vxlan.go) is held to what they assert.

var (
	ourMAC   = vppapi.MAC{0x66, 0xaa, 0xaa, 0xaa, 0xaa, 0x01}
	theirMAC = vppapi.MAC{0x66, 0xbb, 0xbb, 0xbb, 0xbb, 0x02}
)

// remoteVTEP is the remote node's VTEP IP: the first address of its block, as Calico allocates it.
const remoteVTEP = "10.244.2.0"

// vxlanSetup connects a client to a fresh VPP with the vxlan plugin whose uplink (sw_if_index 1) has
// nodeIP/24 and 2001:db8::1/64; it skips the test when the VPP package has no vxlan plugin.
func vxlanSetup(t *testing.T) (*vpptest.VPP, *harness, uint32) {
	t.Helper()
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName, VXLAN: true})
	if !v.HasVXLAN() {
		t.Skip("the VPP package has no vxlan plugin (VPP_PKG=/opt/vpp-v26.06-lab has it)")
	}
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	uplink, err := h.c.SetupUplink(ctxT(t), vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx(nodeIP + "/24"), pfx("2001:db8::1/64")}})
	if err != nil {
		t.Fatal(err)
	}
	return v, h, uplink
}

func vxlanSpec(dst string, uplink uint32) vppapi.VXLANSpec {
	src := nodeIP
	if addr(dst).Is6() {
		src = "2001:db8::1"
	}
	return vppapi.VXLANSpec{Src: addr(src), Dst: addr(dst), VNI: vppapi.DefaultVXLANVNI, MAC: ourMAC, Unnumbered: uplink}
}

// TestVXLANTunnel: EnsureVXLANTunnel makes an L2 tunnel decapsulating to ethernet-input (next 2 on a
// fresh VPP), with our VTEP MAC, unnumbered, the MTU and tag asked for, admin up, idempotently (VPP's -75
// carries no index: found in the dump, and not counted as an API error); VPP resolves its destination
// at once. A static neighbour for the remote VTEP is idempotent, replaced with a new MAC, adds the
// VTEP's /32; a route through the tunnel without a next hop is refused before it is sent, one via the
// remote VTEP IP forwards. IPv6 tunnels decapsulate through vxlan6-input.
func TestVXLANTunnel(t *testing.T) {
	v, h, uplink := vxlanSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	if st := h.c.Status(); !st.VXLAN || !h.c.HasVXLAN() {
		t.Fatalf("Status().VXLAN = %v, HasVXLAN = %v with the plugin", st.VXLAN, h.c.HasVXLAN())
	}
	spec := vxlanSpec(peerIP, uplink)
	spec.MTU, spec.Tag = 1450, "vpp-route-agent"
	idx, err := h.c.EnsureVXLANTunnel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	again, err := h.c.EnsureVXLANTunnel(ctx, spec)
	if err != nil || again != idx {
		t.Fatalf("EnsureVXLANTunnel again = %d, %v; want %d", again, err, idx)
	}
	if n := apiErrors(t, h.reg, "vxlan_add_del_tunnel_v3"); n != 0 {
		t.Errorf("an existing tunnel counted as %v API errors", n)
	}
	tunnels, err := h.c.DumpVXLANTunnels(ctx)
	want := vppapi.VXLANTunnel{SwIfIndex: idx, Src: addr(nodeIP), Dst: addr(peerIP), SrcPort: 4789, DstPort: 4789,
		VNI: 4096, DecapNext: 2, MAC: ourMAC, Tag: "vpp-route-agent", MTU: 1450}
	if err != nil || !slices.Equal(tunnels, []vppapi.VXLANTunnel{want}) {
		t.Errorf("DumpVXLANTunnels = %v, %v; want [%+v]", tunnels, err, want)
	}
	if tunnels[0].Name() != "vxlan_tunnel0" || tunnels[0].Spec().Port != 4789 {
		t.Errorf("tunnel name %q, spec %+v", tunnels[0].Name(), tunnels[0].Spec())
	}
	switch d := ifaceDetails(t, ch, idx); {
	case d == nil:
		t.Fatalf("sw_interface_dump has no sw_if_index %d", idx)
	case d.InterfaceName != "vxlan_tunnel0" || d.InterfaceDevType != "VXLAN":
		t.Errorf("tunnel interface %q (%q), want vxlan_tunnel0 (VXLAN)", d.InterfaceName, d.InterfaceDevType)
	case d.Flags&interface_types.IF_STATUS_API_FLAG_ADMIN_UP == 0:
		t.Errorf("tunnel not admin up: %v", d.Flags)
	case !slices.Equal(d.Mtu, []uint32{1450, 1450, 0, 0}):
		t.Errorf("tunnel MTU %v, want [1450 1450 0 0]", d.Mtu)
	case vppapi.MAC(d.L2Address) != ourMAC:
		t.Errorf("tunnel MAC %v, want %v", d.L2Address, ourMAC)
	}
	if got := unnumbered(t, ch); got[idx] != uplink {
		t.Errorf("ip_unnumbered_dump = %v, want %d borrowing from %d", got, idx, uplink)
	}
	fib, err := h.c.DumpRoutes(ctx, 0)
	if err != nil || !slices.ContainsFunc(fib, func(e vppapi.FIBEntry) bool {
		return e.Prefix == pfx(peerIP+"/32") && slices.Equal(e.Paths, []vppapi.Path{{NextHop: addr(peerIP), SwIfIndex: uplink}})
	}) {
		t.Errorf("the tunnel's destination not resolved on the uplink (%v): %v", err, fib)
	}

	vtep := addr(remoteVTEP)
	for _, mac := range []vppapi.MAC{ourMAC, theirMAC, theirMAC} {
		if err := h.c.EnsureNeighbor(ctx, idx, vtep, mac); err != nil {
			t.Fatal(err)
		}
	}
	wantN := []vppapi.Neighbor{{SwIfIndex: idx, IP: vtep, MAC: theirMAC, Static: true}}
	if got, err := h.c.DumpNeighbors(ctx, idx); err != nil || !slices.Equal(got, wantN) {
		t.Errorf("DumpNeighbors = %v, %v; want %v", got, err, wantN)
	}
	if fib, err = h.c.DumpRoutes(ctx, 0); err != nil || !slices.ContainsFunc(fib, func(e vppapi.FIBEntry) bool {
		return e.Prefix == pfx(remoteVTEP+"/32") && slices.Equal(e.Paths, []vppapi.Path{{NextHop: vtep, SwIfIndex: idx}})
	}) {
		t.Errorf("no adjacency /32 for the neighbour (%v): %v", err, fib)
	}

	block := pfx("10.244.2.0/26")
	res := h.c.Apply(ctx, []vppapi.Route{{Prefix: block, SwIfIndex: idx}}, nil)
	if len(res.Failed) != 1 || !errors.Is(res.Failed[0].Err, vppapi.ErrNoNextHop) || res.Added != 0 {
		t.Errorf("route through the VXLAN tunnel without next hop: %+v, want ErrNoNextHop", res)
	}
	if api, err := h.c.DumpAPIRoutes(ctx, 0); err != nil || slices.ContainsFunc(api, func(e vppapi.FIBEntry) bool { return e.Prefix == block }) {
		t.Fatalf("the refused route reached VPP (%v): %v", err, api)
	}
	r := vppapi.Route{Prefix: block, NextHop: vtep, SwIfIndex: idx}
	if res := h.c.Apply(ctx, []vppapi.Route{r}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	api, err := h.c.DumpAPIRoutes(ctx, 0)
	if err != nil || !slices.ContainsFunc(api, func(e vppapi.FIBEntry) bool {
		return e.Prefix == block && slices.Equal(e.Paths, []vppapi.Path{{NextHop: vtep, SwIfIndex: idx}})
	}) {
		t.Errorf("route via the VTEP not dumped (%v): %v", err, api)
	}
	if !forwards(t, v, block) {
		t.Errorf("route via the VTEP does not forward")
	}

	for range 2 {
		if err := h.c.DeleteNeighbor(ctx, idx, vtep); err != nil {
			t.Fatal(err)
		}
	}
	if n := apiErrors(t, h.reg, "ip_neighbor_add_del"); n != 0 {
		t.Errorf("a neighbour already gone counted as %v API errors", n)
	}
	if got, err := h.c.DumpNeighbors(ctx, idx); err != nil || len(got) != 0 {
		t.Errorf("DumpNeighbors after the delete = %v, %v", got, err)
	}

	// IPv6 underlay: vxlan6-input gets its own arc to ethernet-input.
	idx6, err := h.c.EnsureVXLANTunnel(ctx, vxlanSpec("2001:db8::2", uplink))
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.EnsureNeighbor(ctx, idx6, addr("fd00:244:0:2::"), theirMAC); err != nil {
		t.Fatal(err)
	}
	if got, err := h.c.DumpNeighbors(ctx, vppapi.AllInterfaces); err != nil ||
		!slices.Equal(got, []vppapi.Neighbor{{SwIfIndex: idx6, IP: addr("fd00:244:0:2::"), MAC: theirMAC, Static: true}}) {
		t.Errorf("DumpNeighbors of every interface = %v, %v", got, err)
	}
	tunnels, err = h.c.DumpVXLANTunnels(ctx)
	if err != nil || len(tunnels) != 2 || tunnels[1].SwIfIndex != idx6 || tunnels[1].DecapNext != 2 || tunnels[1].Src != addr("2001:db8::1") {
		t.Errorf("DumpVXLANTunnels with the IPv6 one = %v, %v", tunnels, err)
	}
}

// TestVXLANTunnelDelete: deleting by the key twice succeeds (VPP's -6 counts as gone); the tunnel and its
// neighbours leave the dumps; a route through it stays, dropping; the next tunnel takes the freed index.
// Once the index is an IPIP tunnel's, a route through it without a next hop is no longer refused.
func TestVXLANTunnelDelete(t *testing.T) {
	v, h, uplink := vxlanSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	keep, err := h.c.EnsureVXLANTunnel(ctx, vxlanSpec(peerIP, uplink))
	if err != nil {
		t.Fatal(err)
	}
	spec := vxlanSpec("192.0.2.9", uplink)
	spec.Tag = "vpp-route-agent"
	idx, err := h.c.EnsureVXLANTunnel(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.c.EnsureNeighbor(ctx, idx, addr("10.244.9.0"), theirMAC); err != nil {
		t.Fatal(err)
	}
	r := vppapi.Route{Prefix: pfx("10.244.9.0/26"), NextHop: addr("10.244.9.0"), SwIfIndex: idx}
	if res := h.c.Apply(ctx, []vppapi.Route{r}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	for range 2 {
		if err := h.c.DeleteVXLANTunnel(ctx, spec); err != nil {
			t.Fatalf("DeleteVXLANTunnel: %v", err)
		}
	}
	if n := apiErrors(t, h.reg, "vxlan_add_del_tunnel_v3"); n != 0 {
		t.Errorf("a tunnel already gone counted as %v API errors", n)
	}
	if tunnels, err := h.c.DumpVXLANTunnels(ctx); err != nil || len(tunnels) != 1 || tunnels[0].SwIfIndex != keep {
		t.Errorf("DumpVXLANTunnels after the delete = %v, %v; want only sw_if_index %d", tunnels, err, keep)
	}
	if d := ifaceDetails(t, ch, idx); d != nil {
		t.Errorf("sw_interface_dump still has the deleted tunnel: %+v", d)
	}
	if got, err := h.c.DumpNeighbors(ctx, vppapi.AllInterfaces); err != nil || len(got) != 0 {
		t.Errorf("the deleted tunnel's neighbours stayed: %v, %v", got, err)
	}
	if all, err := h.c.DumpRoutes(ctx, 0); err != nil || slices.ContainsFunc(all, func(e vppapi.FIBEntry) bool {
		return e.Prefix == pfx("192.0.2.9/32") || e.Prefix == pfx("10.244.9.0/32")
	}) {
		t.Errorf("the deleted tunnel's destination or neighbour still in the FIB (%v): %v", err, all)
	}
	if fib, err := h.c.DumpAPIRoutes(ctx, 0); err != nil || !slices.ContainsFunc(fib, func(e vppapi.FIBEntry) bool { return e.Prefix == r.Prefix }) {
		t.Errorf("route through the deleted tunnel not dumped (%v): %v", err, fib)
	}
	if forwards(t, v, r.Prefix) {
		t.Errorf("route through the deleted tunnel still forwards")
	}
	next, err := h.c.EnsureVXLANTunnel(ctx, vxlanSpec("192.0.2.3", uplink))
	if err != nil || next != idx {
		t.Fatalf("the next tunnel: sw_if_index %d, %v; want the freed %d", next, err, idx)
	}
	if tunnels, err := h.c.DumpVXLANTunnels(ctx); err != nil || len(tunnels) != 2 || tunnels[1].Tag != "" {
		t.Errorf("the new tunnel at the freed index: %v, %v; want no tag", tunnels, err)
	}
	if err := h.c.DeleteVXLANTunnel(ctx, vxlanSpec("192.0.2.3", uplink)); err != nil {
		t.Fatal(err)
	}
	ipip, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr("192.0.2.4"), Unnumbered: uplink})
	if err != nil || ipip != idx {
		t.Fatalf("IPIP tunnel: %d, %v; want the freed %d", ipip, err, idx)
	}
	if res := h.c.Apply(ctx, []vppapi.Route{{Prefix: pfx("10.244.4.0/26"), SwIfIndex: ipip}}, nil); res.Err() != nil {
		t.Errorf("route without next hop through the IPIP tunnel at a former VXLAN index: %v", res.Err())
	}
}

// TestEnsureVXLANTunnelRejects: a spec that cannot make a tunnel fails with a clear error and sends
// nothing; an existing tunnel of the same key that decapsulates elsewhere (VPP's default l2-input) is
// reported, with its index, not adopted.
func TestEnsureVXLANTunnelRejects(t *testing.T) {
	v, h, uplink := vxlanSetup(t)
	ctx := ctxT(t)
	good := vxlanSpec(peerIP, uplink)
	for name, mutate := range map[string]func(*vppapi.VXLANSpec){
		"no source":          func(s *vppapi.VXLANSpec) { s.Src = netip.Addr{} },
		"same address":       func(s *vppapi.VXLANSpec) { s.Dst = s.Src },
		"mixed families":     func(s *vppapi.VXLANSpec) { s.Dst = addr("2001:db8::2") },
		"destination 0":      func(s *vppapi.VXLANSpec) { s.Dst = addr("0.0.0.0") },
		"multicast":          func(s *vppapi.VXLANSpec) { s.Dst = addr("239.1.1.1") },
		"VNI over 24 bits":   func(s *vppapi.VXLANSpec) { s.VNI = 1 << 24 },
		"no MAC":             func(s *vppapi.VXLANSpec) { s.MAC = vppapi.MAC{} },
		"multicast MAC":      func(s *vppapi.VXLANSpec) { s.MAC = vppapi.MAC{1, 0, 0x5e, 0, 0, 1} },
		"tag over 63 bytes:": func(s *vppapi.VXLANSpec) { s.Tag = strings.Repeat("x", 64) },
	} {
		spec := good
		mutate(&spec)
		if _, err := h.c.EnsureVXLANTunnel(ctx, spec); err == nil {
			t.Errorf("%s: EnsureVXLANTunnel(%+v) succeeded", name, spec)
		}
	}
	if tunnels, err := h.c.DumpVXLANTunnels(ctx); err != nil || len(tunnels) != 0 {
		t.Errorf("tunnels after rejected specs: %v, %v", tunnels, err)
	}
	if err := h.c.EnsureNeighbor(ctx, uplink, netip.Addr{}, theirMAC); err == nil {
		t.Errorf("EnsureNeighbor without an address succeeded")
	}
	if err := h.c.EnsureNeighbor(ctx, uplink, addr("192.0.2.7"), vppapi.MAC{}); err == nil {
		t.Errorf("EnsureNeighbor with a zero MAC succeeded")
	}
	if err := h.c.EnsureNeighbor(ctx, 99, addr("192.0.2.7"), theirMAC); !errors.Is(err, api.INVALID_SW_IF_INDEX) {
		t.Errorf("EnsureNeighbor on an unknown interface: %v, want -2", err)
	}

	// A tunnel of the key made by someone else with VPP's default decap (l2-input, 1).
	ch := rawChannel(t, v)
	reply := new(vxlan.VxlanAddDelTunnelV3Reply)
	if rv := retval(t, ch, &vxlan.VxlanAddDelTunnelV3{IsAdd: true, Instance: ^uint32(0), SrcAddress: apiAddr(nodeIP), DstAddress: apiAddr(peerIP),
		Vni: 4096, DecapNextIndex: 1}, reply); rv != 0 {
		t.Fatalf("vxlan_add_del_tunnel_v3: %d", rv)
	}
	idx, err := h.c.EnsureVXLANTunnel(ctx, good)
	if err == nil || idx != uint32(reply.SwIfIndex) || !strings.Contains(err.Error(), "decap_next 1") {
		t.Errorf("EnsureVXLANTunnel over an l2-input tunnel = %d, %v; want its index %d and an error", idx, err, reply.SwIfIndex)
	}
}

// TestVXLANCodes holds the simulator to the codes and defaults VPP 26.06's vxlan plugin, add_node_next,
// sw_interface_set_mac_address and ip_neighbor_add_del answer with.
func TestVXLANCodes(t *testing.T) {
	v, h, uplink := vxlanSetup(t)
	ctx := ctxT(t)
	ch := rawChannel(t, v)
	ipip, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr("192.0.2.99"), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	add := func(src, dst string, port uint16, vni, decap, vrf, instance uint32) *vxlan.VxlanAddDelTunnelV3 {
		return &vxlan.VxlanAddDelTunnelV3{IsAdd: true, Instance: instance, SrcAddress: apiAddr(src), DstAddress: apiAddr(dst),
			SrcPort: port, DstPort: port, Vni: vni, DecapNextIndex: decap, EncapVrfID: vrf, McastSwIfIndex: ^interface_types.InterfaceIndex(0)}
	}
	const auto = ^uint32(0)
	r := new(vxlan.VxlanAddDelTunnelV3Reply)
	if rv := retval(t, ch, add(nodeIP, peerIP, 0, 4096, 1, 0, auto), r); rv != 0 {
		t.Fatalf("add: %d", rv)
	}
	tun := uint32(r.SwIfIndex)
	switch d := ifaceDetails(t, ch, tun); {
	case d == nil:
		t.Fatalf("no interface %d", tun)
	case d.Flags != interface_types.IF_STATUS_API_FLAG_ADMIN_UP|interface_types.IF_STATUS_API_FLAG_LINK_UP:
		t.Errorf("a new tunnel's flags %v, want admin and link up", d.Flags)
	case !slices.Equal(d.Mtu, []uint32{9000, 0, 0, 0}) || d.LinkMtu != 9000:
		t.Errorf("a new tunnel's MTU %v link %d, want 9000/0/0/0 and 9000", d.Mtu, d.LinkMtu)
	case d.L2Address[0] != 0x02 || d.L2Address[1] != 0xfe:
		t.Errorf("a new tunnel's MAC %v, want 02:fe:..", d.L2Address)
	}
	mac := ethernet_types.MacAddress(ourMAC)
	neighMAC := func(isAdd bool, idx uint32, ip string, static bool, mac ethernet_types.MacAddress) *ip_neighbor.IPNeighborAddDel {
		m := &ip_neighbor.IPNeighborAddDel{IsAdd: isAdd, Neighbor: ip_neighbor.IPNeighbor{SwIfIndex: interface_types.InterfaceIndex(idx), MacAddress: mac, IPAddress: apiAddr(ip)}}
		if static {
			m.Neighbor.Flags = ip_neighbor.IP_API_NEIGHBOR_FLAG_STATIC
		}
		return m
	}
	neigh := func(isAdd bool, idx uint32, ip string, static bool) *ip_neighbor.IPNeighborAddDel {
		return neighMAC(isAdd, idx, ip, static, mac)
	}
	for _, tc := range []struct {
		name  string
		req   api.Message
		reply api.Message
		want  int32
	}{
		{"add again", add(nodeIP, peerIP, 4789, 4096, 1, 0, auto), new(vxlan.VxlanAddDelTunnelV3Reply), -75},
		{"add again, other decap", add(nodeIP, peerIP, 0, 4096, 0, 0, auto), new(vxlan.VxlanAddDelTunnelV3Reply), -75},
		{"add: mixed families", add(nodeIP, "2001:db8::2", 0, 4096, 1, 0, auto), new(vxlan.VxlanAddDelTunnelV3Reply), -7},
		{"add: same src and dst", add(nodeIP, nodeIP, 0, 4096, 1, 0, auto), new(vxlan.VxlanAddDelTunnelV3Reply), -82},
		{"add: unknown table", add(nodeIP, "192.0.2.5", 0, 4096, 1, 77, auto), new(vxlan.VxlanAddDelTunnelV3Reply), -3},
		{"add: decap without its arc", add(nodeIP, "192.0.2.5", 0, 4096, 2, 0, auto), new(vxlan.VxlanAddDelTunnelV3Reply), -76},
		{"add: instance in use", add(nodeIP, "192.0.2.5", 0, 4096, 1, 0, 0), new(vxlan.VxlanAddDelTunnelV3Reply), -147},
		{"add: multicast without interface", add(nodeIP, "239.1.1.1", 0, 4096, 1, 0, auto), new(vxlan.VxlanAddDelTunnelV3Reply), -2},
		{"add_node_next: unknown node", &vlib.AddNodeNext{NodeName: "nope-input", NextName: "ethernet-input"}, new(vlib.AddNodeNextReply), -63},
		{"add_node_next: unknown next", &vlib.AddNodeNext{NodeName: "vxlan4-input", NextName: "nope"}, new(vlib.AddNodeNextReply), -64},
		{"set mac: unknown interface", &interfaces.SwInterfaceSetMacAddress{SwIfIndex: 99, MacAddress: mac}, new(interfaces.SwInterfaceSetMacAddressReply), -2},
		{"set mac: local0", &interfaces.SwInterfaceSetMacAddress{SwIfIndex: 0, MacAddress: mac}, new(interfaces.SwInterfaceSetMacAddressReply), -9},
		{"set mac: IPIP tunnel", &interfaces.SwInterfaceSetMacAddress{SwIfIndex: interface_types.InterfaceIndex(ipip), MacAddress: mac}, new(interfaces.SwInterfaceSetMacAddressReply), -9},
		{"set mac: uplink", &interfaces.SwInterfaceSetMacAddress{SwIfIndex: interface_types.InterfaceIndex(uplink), MacAddress: mac}, new(interfaces.SwInterfaceSetMacAddressReply), 0},
		{"neighbour: unknown interface", neigh(true, 99, remoteVTEP, true), new(ip_neighbor.IPNeighborAddDelReply), -2},
		{"neighbour: add", neigh(true, tun, remoteVTEP, true), new(ip_neighbor.IPNeighborAddDelReply), 0},
		{"neighbour: add again", neigh(true, tun, remoteVTEP, true), new(ip_neighbor.IPNeighborAddDelReply), 0},
		{"neighbour: dynamic over static, same MAC", neigh(true, tun, remoteVTEP, false), new(ip_neighbor.IPNeighborAddDelReply), 0},
		{"neighbour: dynamic over static, other MAC", neighMAC(true, tun, remoteVTEP, false, ethernet_types.MacAddress(theirMAC)), new(ip_neighbor.IPNeighborAddDelReply), -2},
		{"neighbour: IPv6 on an IPv4 tunnel", neigh(true, tun, "fd00::1", true), new(ip_neighbor.IPNeighborAddDelReply), 0},
		{"neighbour: delete unknown", neigh(false, tun, "10.244.2.9", true), new(ip_neighbor.IPNeighborAddDelReply), -6},
		{"delete unknown tunnel", &vxlan.VxlanAddDelTunnelV3{IsAdd: false, SrcAddress: apiAddr(nodeIP), DstAddress: apiAddr("192.0.2.50"), Vni: 7}, new(vxlan.VxlanAddDelTunnelV3Reply), -6},
	} {
		if got := retval(t, ch, tc.req, tc.reply); got != tc.want {
			t.Errorf("%s: retval %d, want %d", tc.name, got, tc.want)
		}
		if r, ok := tc.reply.(*vxlan.VxlanAddDelTunnelV3Reply); ok && tc.want != 0 && r.SwIfIndex != ^interface_types.InterfaceIndex(0) {
			t.Errorf("%s: sw_if_index %d, want ~0", tc.name, r.SwIfIndex)
		}
	}
	for range 2 {
		r := new(vlib.AddNodeNextReply)
		if rv := retval(t, ch, &vlib.AddNodeNext{NodeName: "vxlan4-input", NextName: "ethernet-input"}, r); rv != 0 || r.NextIndex != 2 {
			t.Errorf("add_node_next vxlan4-input -> ethernet-input: %d, next %d; want 0 and 2", rv, r.NextIndex)
		}
	}
	// A VNI over 24 bits is accepted and dumped as given (vppapi refuses it).
	if rv := retval(t, ch, add(nodeIP, "192.0.2.8", 8472, 1<<24, 2, 0, auto), r); rv != 0 {
		t.Errorf("add with VNI 1<<24: %d", rv)
	}
	tunnels, err := h.c.DumpVXLANTunnels(ctx)
	if err != nil || len(tunnels) != 2 || tunnels[1].VNI != 1<<24 || tunnels[1].SrcPort != 8472 || tunnels[1].DecapNext != 2 ||
		tunnels[0].SrcPort != 4789 || tunnels[0].DstPort != 4789 || tunnels[0].DecapNext != 1 {
		t.Errorf("DumpVXLANTunnels = %v, %v", tunnels, err)
	}
	d := new(vxlan.VxlanAddDelTunnelV3Reply)
	if rv := retval(t, ch, &vxlan.VxlanAddDelTunnelV3{IsAdd: false, SrcAddress: apiAddr(nodeIP), DstAddress: apiAddr(peerIP), Vni: 4096}, d); rv != 0 || uint32(d.SwIfIndex) != tun {
		t.Errorf("delete by key with ports 0: %d, sw_if_index %d; want 0 and %d", rv, d.SwIfIndex, tun)
	}
}

// TestVXLANAbsent: a VPP without the vxlan plugin (the minimal build; the simulator without its
// messages) is compatible: the client connects, says VXLAN is unavailable, and every VXLAN tunnel
// operation fails with ErrNoVXLANPlugin; neighbours, core messages, still work.
func TestVXLANAbsent(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	if st := h.c.Status(); st.VXLAN || h.c.HasVXLAN() || !st.Connected {
		t.Errorf("Status = %+v, HasVXLAN %v; want connected without VXLAN", st, h.c.HasVXLAN())
	}
	uplink, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx(nodeIP + "/24")}})
	if err != nil {
		t.Fatal(err)
	}
	spec := vxlanSpec(peerIP, uplink)
	if _, err := h.c.EnsureVXLANTunnel(ctx, spec); !errors.Is(err, vppapi.ErrNoVXLANPlugin) {
		t.Errorf("EnsureVXLANTunnel = %v, want ErrNoVXLANPlugin", err)
	}
	if _, err := h.c.DumpVXLANTunnels(ctx); !errors.Is(err, vppapi.ErrNoVXLANPlugin) {
		t.Errorf("DumpVXLANTunnels = %v, want ErrNoVXLANPlugin", err)
	}
	if err := h.c.DeleteVXLANTunnel(ctx, spec); !errors.Is(err, vppapi.ErrNoVXLANPlugin) {
		t.Errorf("DeleteVXLANTunnel = %v, want ErrNoVXLANPlugin", err)
	}
	if rv := retval(t, rawChannel(t, v), &vlib.AddNodeNext{NodeName: "vxlan4-input", NextName: "ethernet-input"}, new(vlib.AddNodeNextReply)); rv != -63 {
		t.Errorf("add_node_next vxlan4-input without the plugin: %d, want -63", rv)
	}
	if err := h.c.EnsureNeighbor(ctx, uplink, addr(peerIP), theirMAC); err != nil {
		t.Fatal(err)
	}
	if got, err := h.c.DumpNeighbors(ctx, uplink); err != nil || !slices.Equal(got, []vppapi.Neighbor{{SwIfIndex: uplink, IP: addr(peerIP), MAC: theirMAC, Static: true}}) {
		t.Errorf("DumpNeighbors = %v, %v", got, err)
	}
}
