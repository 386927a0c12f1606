package dataplane

import (
	"context"
	"fmt"
	"maps"
	"net/netip"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/vxlan"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vppproc"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
)

// setVXLANMode rewrites both pools with vxlanMode mode (ipipMode Never).
func (c *cluster) setVXLANMode(mode calico.EncapMode) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, p := range []calico.IPPool{{Name: "default-ipv4-ippool", CIDR: pool4, BlockSize: 26, VXLANMode: mode},
		{Name: "default-ipv6-ippool", CIDR: pool6, BlockSize: 122, VXLANMode: mode}} {
		if err := calicotest.PutPool(ctx, c.cli, p); err != nil {
			c.t.Fatal(err)
		}
	}
}

// vtep returns node n's VXLAN tunnel address of a family: its block's first address, as calico-node
// allocates it from a block affine to the node.
func vtep(n *vpptopo.Node, ipv6 bool) netip.Addr {
	if ipv6 {
		return n.Block6.Addr()
	}
	return n.Block4.Addr()
}

// putCalicoNodes writes each node's Calico Node resource as calico-node does: its uplink addresses in
// spec.bgp, its VXLAN tunnel addresses; no MAC (felix's generated one).
func (c *cluster) putCalicoNodes(topo *vpptopo.Topology) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, n := range topo.Nodes {
		v := fmt.Sprintf(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":%q},"spec":{"bgp":{"ipv4Address":%q,"ipv6Address":%q},"ipv4VXLANTunnelAddr":%q,"ipv6VXLANTunnelAddr":%q}}`,
			n.Name, n.Addr4.String(), n.Addr6.String(), vtep(n, false).String(), vtep(n, true).String())
		if _, err := c.cli.Put(ctx, calico.NodeKey(n.Name), v); err != nil {
			c.t.Fatal(err)
		}
	}
}

// vxlanTunnels returns node n's VXLAN tunnels' destinations by sw_if_index.
func vxlanTunnels(t *testing.T, n *vpptopo.Node) map[uint32]netip.Addr {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out := map[uint32]netip.Addr{}
	err := n.VPP.Call(ctx, func(ch api.Channel) error {
		req := ch.SendMultiRequest(&vxlan.VxlanTunnelV2Dump{SwIfIndex: ^interface_types.InterfaceIndex(0)})
		for {
			d := new(vxlan.VxlanTunnelV2Details)
			last, err := req.ReceiveReply(d)
			if err != nil || last {
				return err
			}
			out[uint32(d.SwIfIndex)] = addr4(d.DstAddress)
		}
	})
	if err != nil {
		t.Fatalf("%s: dump VXLAN tunnels: %v", n.Name, err)
	}
	return out
}

// vxlanRoutes returns node n's API routes inside the pools as "vxlan <dst> via <next hop>" (through a
// VXLAN tunnel) or "via <next hop>".
func vxlanRoutes(t *testing.T, n *vpptopo.Node) map[netip.Prefix]string {
	t.Helper()
	dst := vxlanTunnels(t, n)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	routes, err := n.VPP.Routes(ctx, vppproc.SourceAPI)
	if err != nil {
		t.Fatalf("%s: %v", n.Name, err)
	}
	out := map[netip.Prefix]string{}
	for _, r := range routes {
		if !pool4.Contains(r.Prefix.Addr()) && !pool6.Contains(r.Prefix.Addr()) || len(r.Paths) == 0 {
			continue
		}
		p := r.Paths[0]
		if d, ok := dst[p.SwIfIndex]; ok {
			out[r.Prefix] = "vxlan " + d.String() + " via " + p.NextHop.String()
		} else {
			out[r.Prefix] = "via " + p.NextHop.String()
		}
	}
	return out
}

// wantVXLAN is what node n's agent programs with both pools in vxlanMode Always: every other node's
// block via its VTEP through a tunnel to its uplink address of the family.
func wantVXLAN(topo *vpptopo.Topology, n *vpptopo.Node) map[netip.Prefix]string {
	want := map[netip.Prefix]string{}
	for _, m := range topo.Nodes {
		if m != n {
			want[m.Block4] = "vxlan " + m.Addr4.Addr().String() + " via " + vtep(m, false).String()
			want[m.Block6] = "vxlan " + m.Addr6.Addr().String() + " via " + vtep(m, true).String()
		}
	}
	return want
}

func waitVXLAN(t *testing.T, topo *vpptopo.Topology, want func(*vpptopo.Node) map[netip.Prefix]string) {
	t.Helper()
	for _, n := range topo.Nodes {
		w := want(n)
		deadline := time.Now().Add(60 * time.Second)
		for {
			got := vxlanRoutes(t, n)
			if maps.Equal(got, w) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s's routes after 60s:\n got %v\nwant %v", n.Name, got, w)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// TestRoutedVXLAN: the routed topology (node-1 and node-3 in one subnet, node-2 behind the router), the
// Calico Nodes as calico-node writes them, both pools switched from Never to vxlanMode Always while
// node-1's pod pings node-3's: every route goes via the owner's VTEP through an L2 VXLAN tunnel to its
// uplink address, and every pod pair answers, IPv4 and IPv6, across the router too (flat IPv6 does
// not). The pings lost during the switch are logged. Back to Never: flat routes, no tunnel left.
func TestRoutedVXLAN(t *testing.T) {
	requireLab(t)
	topo := startTopologyWith(t, vpptopo.Config{Kind: vpptopo.Routed, Nodes: 3, VXLAN: true})
	c := newCluster(t, topo)
	c.putCalicoNodes(topo)
	for _, n := range topo.Nodes {
		startAgent(t, c.etcd.Endpoint(), n)
	}
	n1, n3 := topo.Nodes[0], topo.Nodes[2]
	waitEncap(t, topo, calico.EncapNever)

	loss := lossDuring(t, n1, n3, func() { c.setVXLANMode(calico.EncapAlways) })
	t.Logf("ping loss %s -> %s (same subnet) while vxlanMode went Never -> Always: %d of %d lost (%s)",
		n1.Name, n3.Name, loss.Sent-loss.Received, loss.Sent, loss)
	waitVXLAN(t, topo, func(n *vpptopo.Node) map[netip.Prefix]string { return wantVXLAN(topo, n) })
	for _, from := range topo.Nodes {
		for _, to := range topo.Nodes {
			if from == to {
				continue
			}
			for _, ipv6 := range []bool{false, true} {
				results, ok := pingPods(t, from, to, ipv6)
				t.Logf("%s -> %s %s pod %s (same subnet %v), VXLAN: %v", from.Name, to.Name, family(ipv6), to.Pod(ipv6), sameSubnet(from, to), results)
				if !ok {
					t.Errorf("%s's pod gets no answer from %s's %s pod %s through VXLAN: %v", from.Name, to.Name, family(ipv6), to.Pod(ipv6), results)
				}
			}
		}
	}
	loss = lossDuring(t, n1, n3, func() { c.setVXLANMode(calico.EncapNever) })
	t.Logf("ping loss %s -> %s (same subnet) while vxlanMode went Always -> Never: %d of %d lost (%s)",
		n1.Name, n3.Name, loss.Sent-loss.Received, loss.Sent, loss)
	waitEncap(t, topo, calico.EncapNever)
	for _, n := range topo.Nodes {
		deadline := time.Now().Add(60 * time.Second)
		for len(vxlanTunnels(t, n)) != 0 {
			if time.Now().After(deadline) {
				t.Fatalf("%s: VXLAN tunnels %v left with no pool using VXLAN", n.Name, vxlanTunnels(t, n))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}
