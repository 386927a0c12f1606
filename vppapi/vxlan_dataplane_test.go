package vppapi_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// labTopology starts a routed two-node lab topology whose node VPPs have the vxlan plugin, or skips
// the test without VPP_TEST_BACKEND=real and VPP_LAB_PKG.
func labTopology(t *testing.T, ctx context.Context) *vpptopo.Topology {
	t.Helper()
	bin, err := vpptopo.FindLab()
	switch {
	case !vpptest.Real():
		t.Skip("needs real VPP: " + vpptest.EnvBackend + "=real and " + vpptopo.EnvLabPackage)
	case errors.Is(err, vpptopo.ErrNoLab):
		t.Skip(err.Error())
	case err != nil:
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("", "tv")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	topo, err := vpptopo.Start(ctx, bin, vpptopo.Config{Kind: vpptopo.Routed, Nodes: 2, Dir: dir, VXLAN: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Stop)
	return topo
}

// TestVXLANDataPlane: two lab VPPs in different subnets behind a router that knows no pod block; with
// an L2 VXLAN tunnel each way (EnsureVXLANTunnel: VNI 4096, port 4789, the node's Calico-generated VTEP
// MAC, unnumbered to the memif uplink), a static neighbour for the peer's VTEP (the first address of its
// block, as Calico allocates it) and the peer's block routed via that VTEP, pods ping each other both
// ways, over IPv4 and over IPv6 (an IPv6 underlay and VTEPs); without the routes they do not. Needs
// VPP_TEST_BACKEND=real and VPP_LAB_PKG (make test-vpp); skipped otherwise.
func TestVXLANDataPlane(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	topo := labTopology(t, ctx)
	a, b := topo.Nodes[0], topo.Nodes[1]
	if a.Addr4.Masked() == b.Addr4.Masked() {
		t.Fatalf("nodes share a subnet: %v %v", a.Addr4, b.Addr4)
	}

	type side struct {
		node   *vpptopo.Node
		c      *vppapi.Client
		uplink uint32
		routes []vppapi.Route
	}
	sides := []*side{{node: a}, {node: b}}
	for _, s := range sides {
		h := start(t, s.node.VPP.Socket(), func(c *vppapi.Config) { c.ReplyTimeout = vppapi.DefaultReplyTimeout })
		h.expect(vppapi.Connected)
		s.c = h.c
		if !s.c.HasVXLAN() {
			t.Fatalf("%s: the lab VPP has no vxlan plugin", s.node.Name)
		}
		uplink, err := s.c.LookupUplink(ctx, vppapi.Uplink{Name: vpptopo.UplinkInterface})
		if err != nil {
			t.Fatal(err)
		}
		s.uplink = uplink
	}
	for i, s := range sides {
		peer := sides[1-i].node
		for _, ipv6 := range []bool{false, true} {
			src, dst, block := s.node.Addr4.Addr(), peer.Addr4.Addr(), peer.Block4
			if ipv6 {
				src, dst, block = s.node.Addr6.Addr(), peer.Addr6.Addr(), peer.Block6
			}
			tun, err := s.c.EnsureVXLANTunnel(ctx, vppapi.VXLANSpec{Src: src, Dst: dst, VNI: vppapi.DefaultVXLANVNI,
				Port: vppapi.DefaultVXLANPort, MAC: vppapi.MAC(calico.GeneratedVTEPMAC(s.node.Name, ipv6)),
				Unnumbered: s.uplink, MTU: 1450, Tag: "vpp-route-agent"})
			if err != nil {
				t.Fatal(err)
			}
			vtep := block.Addr() // the peer's VTEP: its block's first address
			if err := s.c.EnsureNeighbor(ctx, tun, vtep, vppapi.MAC(calico.GeneratedVTEPMAC(peer.Name, ipv6))); err != nil {
				t.Fatal(err)
			}
			s.routes = append(s.routes, vppapi.Route{Prefix: block, NextHop: vtep, SwIfIndex: tun})
		}
	}

	ping := func(from, to *vpptopo.Node, ipv6, want bool) {
		t.Helper()
		rounds := 5
		if !want {
			rounds = 1
		}
		dst := to.Pod(ipv6)
		results, ok, err := vpptopo.PingUntil(ctx, from.VPP, vpptopo.PodInterface, dst, 3, 2, rounds)
		switch {
		case err != nil:
			t.Fatal(err)
		case want && !ok:
			t.Errorf("%s -> %s pod %v: %v, want replies", from.Name, to.Name, dst, results)
		case !want && results[len(results)-1].Received > 0:
			t.Errorf("%s -> %s pod %v without the routes: %v, want none", from.Name, to.Name, dst, results)
		}
	}
	ping(a, b, false, false) // the tunnels alone route nothing

	for _, s := range sides {
		if res := s.c.Apply(ctx, s.routes, nil); res.Err() != nil {
			t.Fatal(res.Err())
		}
	}
	for _, ipv6 := range []bool{false, true} {
		ping(a, b, ipv6, true)
		ping(b, a, ipv6, true)
	}

	for _, s := range sides {
		if res := s.c.Apply(ctx, nil, s.routes); res.Err() != nil {
			t.Fatal(res.Err())
		}
	}
	ping(a, b, false, false)
	ping(b, a, true, false)
}
