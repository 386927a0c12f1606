package vppsim

import (
	"net/netip"
	"testing"

	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/binapi/teib"
)

// The tunnel behaviours measured on a real VPP are asserted on both backends by vppapi's TestIPIP*;
// these cover what only the simulator's own API shows.

func addr4(s string) ip_types.Address {
	return ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(netip.MustParseAddr(s).As4())}
}

// TestTunnelsGoneAfterRestart: a restart (new pid, empty FIB) leaves no tunnel, no TEIB entry and no
// tunnel interface; the configured interfaces stay.
func TestTunnelsGoneAfterRestart(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	add := &ipip.IpipAddTunnelReply{}
	req := &ipip.IpipAddTunnel{Tunnel: ipip.IpipTunnel{Instance: ^uint32(0), Src: addr4("192.0.2.1"), Dst: addr4("0.0.0.0"), Mode: 1}}
	if err := ch.SendRequest(req).ReceiveReply(add); err != nil {
		t.Fatal(err)
	}
	entry := &teib.TeibEntryAddDel{IsAdd: 1, Entry: teib.TeibEntry{SwIfIndex: add.SwIfIndex, Peer: addr4("10.255.0.2"), Nh: addr4("192.0.2.2")}}
	if err := ch.SendRequest(entry).ReceiveReply(&teib.TeibEntryAddDelReply{}); err != nil {
		t.Fatal(err)
	}
	if got := s.Tunnels(); len(got) != 1 || got[0].Name != "ipip0" || !got[0].Multipoint || got[0].SwIfIndex != uint32(add.SwIfIndex) {
		t.Fatalf("Tunnels() = %+v", got)
	}
	adj := false
	for _, e := range s.Routes(0, false) {
		adj = adj || e.Prefix == netip.MustParsePrefix("10.255.0.2/32") && e.Source == SourceAdjacency
	}
	if !adj {
		t.Errorf("no adjacency 10.255.0.2/32 for the TEIB entry: %v", s.Routes(0, false))
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if got := s.Tunnels(); len(got) != 0 {
		t.Errorf("Tunnels() after a restart = %+v", got)
	}
	if got := s.Interfaces(); len(got) != 2 || got[1].Name != DefaultInterface {
		t.Errorf("Interfaces() after a restart = %+v, want local0 and %s", got, DefaultInterface)
	}
	ch = channel(t, connect(t, s))
	n := 0
	multi := ch.SendMultiRequest(&teib.TeibDump{})
	for {
		last, err := multi.ReceiveReply(&teib.TeibDetails{})
		if err != nil {
			t.Fatal(err)
		}
		if last {
			break
		}
		n++
	}
	if n != 0 {
		t.Errorf("%d TEIB entries after a restart", n)
	}
	// The freed index is the next tunnel's.
	if err := ch.SendRequest(req).ReceiveReply(add); err != nil || add.SwIfIndex != interface_types.InterfaceIndex(2) {
		t.Errorf("tunnel after a restart: sw_if_index %d, %v; want 2", add.SwIfIndex, err)
	}
}
