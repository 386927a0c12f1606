package vppsim

import (
	"errors"
	"testing"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_neighbor"
	"go.fd.io/govpp/binapi/vlib"
	"go.fd.io/govpp/binapi/vxlan"
)

// The vxlan behaviours measured on a real VPP are asserted on both backends by vppapi's TestVXLAN*;
// these cover what only the simulator's own API shows.

// TestNoVXLAN: without the plugin (NoVXLAN) the vxlan messages are not in the message table, and
// vxlan4-input is no graph node; the core messages the VXLAN form uses are there.
func TestNoVXLAN(t *testing.T) {
	for _, noVXLAN := range []bool{false, true} {
		s := startSim(t, Config{NoVXLAN: noVXLAN})
		ch := channel(t, connect(t, s))
		err := ch.CheckCompatiblity((*vxlan.VxlanAddDelTunnelV3)(nil), (*vxlan.VxlanTunnelV2Dump)(nil))
		var cerr *api.CompatibilityError
		if noVXLAN != errors.As(err, &cerr) {
			t.Errorf("NoVXLAN %v: vxlan messages: %v", noVXLAN, err)
		}
		if err := ch.CheckCompatiblity((*vlib.AddNodeNext)(nil), (*ip_neighbor.IPNeighborAddDel)(nil)); err != nil {
			t.Errorf("NoVXLAN %v: core messages: %v", noVXLAN, err)
		}
		r := &vlib.AddNodeNextReply{}
		err = ch.SendRequest(&vlib.AddNodeNext{NodeName: "vxlan4-input", NextName: "ethernet-input"}).ReceiveReply(r)
		if want := map[bool]int32{false: 0, true: -63}[noVXLAN]; r.Retval != want {
			t.Errorf("NoVXLAN %v: add_node_next vxlan4-input: %d (%v), want %d", noVXLAN, r.Retval, err, want)
		}
	}
}

// TestVXLANGoneAfterRestart: a restart leaves no VXLAN tunnel, no neighbour and no added decap arc; the
// freed index is the next tunnel's.
func TestVXLANGoneAfterRestart(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	next := &vlib.AddNodeNextReply{}
	if err := ch.SendRequest(&vlib.AddNodeNext{NodeName: "vxlan4-input", NextName: "ethernet-input"}).ReceiveReply(next); err != nil || next.NextIndex != 2 {
		t.Fatalf("add_node_next: %d, %v", next.NextIndex, err)
	}
	req := &vxlan.VxlanAddDelTunnelV3{IsAdd: true, Instance: ^uint32(0), SrcAddress: addr4("192.0.2.1"), DstAddress: addr4("192.0.2.2"),
		Vni: 4096, DecapNextIndex: 2}
	add := &vxlan.VxlanAddDelTunnelV3Reply{}
	if err := ch.SendRequest(req).ReceiveReply(add); err != nil {
		t.Fatal(err)
	}
	neigh := &ip_neighbor.IPNeighborAddDel{IsAdd: true, Neighbor: ip_neighbor.IPNeighbor{SwIfIndex: add.SwIfIndex,
		Flags: ip_neighbor.IP_API_NEIGHBOR_FLAG_STATIC, MacAddress: [6]byte{0x66, 1, 2, 3, 4, 5}, IPAddress: addr4("10.244.2.0")}}
	if err := ch.SendRequest(neigh).ReceiveReply(&ip_neighbor.IPNeighborAddDelReply{}); err != nil {
		t.Fatal(err)
	}
	if got := s.VXLANTunnels(); len(got) != 1 || got[0].Name != "vxlan_tunnel0" || got[0].SrcPort != 4789 || !got[0].AdminUp {
		t.Fatalf("VXLANTunnels() = %+v", got)
	}
	if got := s.Neighbors(); len(got) != 1 || !got[0].Static {
		t.Fatalf("Neighbors() = %+v", got)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got, n := s.VXLANTunnels(), s.Neighbors(); len(got) != 0 || len(n) != 0 {
		t.Errorf("after a restart: tunnels %+v, neighbours %+v", got, n)
	}
	if got := s.Interfaces(); len(got) != 2 {
		t.Errorf("Interfaces() after a restart = %+v", got)
	}
	ch = channel(t, connect(t, s))
	r := &vxlan.VxlanAddDelTunnelV3Reply{}
	if err := ch.SendRequest(req).ReceiveReply(r); !errors.Is(err, api.INVALID_DECAP_NEXT) {
		t.Errorf("decap next 2 after a restart: %v, want -76 (the arc is gone)", err)
	}
	req.DecapNextIndex = 1
	if err := ch.SendRequest(req).ReceiveReply(r); err != nil || r.SwIfIndex != interface_types.InterfaceIndex(2) {
		t.Errorf("tunnel after a restart: sw_if_index %d, %v; want 2", r.SwIfIndex, err)
	}
}
