package agent_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// vtepOf is node index i's VXLAN tunnel address, inside its own block 10.244.<i+1>.0/26 (as calico-node
// allocates it).
func vtepOf(i int) netip.Addr { return netip.AddrFrom4([4]byte{10, 244, byte(i + 1), 0}) }

// putNode writes a Calico Node resource for name with node IP addr/24 and VXLAN tunnel address vtep;
// extra is added to the spec as it is (`,"vxlanTunnelMACAddr":"..."`).
func (c *cluster) putNode(name string, addr, vtep netip.Addr, extra string) {
	c.t.Helper()
	spec := fmt.Sprintf(`{"bgp":{"ipv4Address":"%s/24"},"ipv4VXLANTunnelAddr":"%s"%s}`, addr, vtep, extra)
	c.put(calico.NodeKey(name), `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"`+name+`"},"spec":`+spec+`}`)
}

// putNodes writes the Calico Node of every node of the cluster: node IP its peer IP, VTEP vtepOf.
func (c *cluster) putNodes() {
	for _, n := range c.nodes {
		c.putNode(n.name, n.peerV4, vtepOf(n.index), "")
	}
}

// putFelixConfig writes FelixConfiguration default with the given spec JSON.
func (c *cluster) putFelixConfig(spec string) {
	c.t.Helper()
	c.put("/calico/resources/v3/projectcalico.org/felixconfigurations/default",
		`{"kind":"FelixConfiguration","apiVersion":"projectcalico.org/v3","metadata":{"name":"default"},"spec":`+spec+`}`)
}

// vxlanOf returns node name's VXLAN tunnels by destination.
func (c *cluster) vxlanOf(name string) map[netip.Addr]vppsim.VXLANTunnel {
	out := map[netip.Addr]vppsim.VXLANTunnel{}
	for _, t := range c.nodes[name].sim.VXLANTunnels() {
		out[t.Dst] = t
	}
	return out
}

// neighborsOf returns node name's neighbours as "ip mac@sw_if_index", sorted.
func (c *cluster) neighborsOf(name string) []string {
	var out []string
	for _, n := range c.nodes[name].sim.Neighbors() {
		out = append(out, fmt.Sprintf("%s %s@%d", n.IP, calico.MAC(n.MAC), n.SwIfIndex))
	}
	slices.Sort(out)
	return out
}

func vxRoute(block string, underlay, vtep netip.Addr) string {
	return block + " vxlan " + underlay.String() + " via " + vtep.String()
}

// TestVXLANAlways: with vxlanMode Always on the IPv4 pool, the agent routes each remote IPv4 block via
// the owner's VTEP address through one L2 VXLAN tunnel per node, as felix does: tunnel source its
// uplink address, destination the node IP of the owner's Calico Node, VNI 4096, port 4789, MAC this
// node's generated VTEP MAC, unnumbered, MTU the uplink's less 50, tagged, up; a static neighbour for the
// remote VTEP with its MAC. A node with a Calico Node but no registration (a Linux node felix runs) is
// routed the same way. IPv6 stays flat. When a node's last block goes: its route, then its tunnel (with
// its neighbour).
func TestVXLANAlways(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b", "c")
	c.putNodes()
	linuxIP, linuxVTEP := netip.MustParseAddr("192.168.100.50"), netip.MustParseAddr("10.244.9.0")
	c.putNode("linux", linuxIP, linuxVTEP, `,"vxlanTunnelMACAddr":"66:bb:bb:bb:bb:02"`)
	c.putPoolModes(calico.EncapNever, calico.EncapAlways)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "c", nil)
	c.putBlock("10.244.9.0/26", "linux", nil)
	c.putBlock("fd00:10:244::80/122", "b", nil)
	a, b, cc := c.nodes["a"], c.nodes["b"], c.nodes["c"]
	c.eventuallyEncap("a", []string{
		vxRoute("10.244.2.0/26", b.peerV4, vtepOf(b.index)),
		vxRoute("10.244.3.0/26", cc.peerV4, vtepOf(cc.index)),
		vxRoute("10.244.9.0/26", linuxIP, linuxVTEP),
		"fd00:10:244::80/122 via " + b.peerV6.String() + "@1",
	})
	tunnels := c.vxlanOf("a")
	if len(tunnels) != 3 {
		t.Fatalf("VXLAN tunnels %+v, want one to each of b, c and linux", tunnels)
	}
	ownMAC := calico.GeneratedVTEPMAC("a", false)
	var wantNbrs []string
	for _, peer := range []struct {
		ip, vtep netip.Addr
		mac      calico.MAC
	}{{b.peerV4, vtepOf(b.index), calico.GeneratedVTEPMAC("b", false)}, {cc.peerV4, vtepOf(cc.index), calico.GeneratedVTEPMAC("c", false)},
		{linuxIP, linuxVTEP, calico.MAC{0x66, 0xbb, 0xbb, 0xbb, 0xbb, 0x02}}} {
		tun := tunnels[peer.ip]
		want := vppsim.VXLANTunnel{SwIfIndex: tun.SwIfIndex, Name: tun.Name, Src: a.peerV4, Dst: peer.ip, SrcPort: 4789, DstPort: 4789,
			VNI: 4096, DecapNext: tun.DecapNext, MAC: ownMAC, Unnumbered: 1, MTU: [4]uint32{8950, 8950, 0, 0}, AdminUp: true, Tag: agent.TunnelTag}
		if tun != want || tun.DecapNext < 2 {
			t.Errorf("tunnel to %s:\n got %+v\nwant %+v (decap to ethernet-input, not 0 drop or 1 l2-input)", peer.ip, tun, want)
		}
		wantNbrs = append(wantNbrs, fmt.Sprintf("%s %s@%d", peer.vtep, peer.mac, tun.SwIfIndex))
	}
	slices.Sort(wantNbrs)
	if got := c.neighborsOf("a"); !slices.Equal(got, wantNbrs) {
		t.Errorf("neighbours %q, want %q", got, wantNbrs)
	}
	if n := c.metric("a", "vpp_route_agent_tunnels", "encap", "vxlan"); n != 3 {
		t.Errorf("vpp_route_agent_tunnels{encap=vxlan} = %v, want 3", n)
	}
	c.waitFor("pod MTU and routes by encapsulation", settle, func() bool {
		return c.metric("a", "vpp_route_agent_pod_mtu_bytes") == 8950 &&
			c.metric("a", "vpp_route_agent_routes_programmed_by_encap", "encap", "vxlan") == 3
	})
	d := c.debug("a")
	for _, r := range d.Programmed {
		if r.Prefix.Addr().Is4() && (r.Encap != calico.EncapVXLAN || !strings.HasPrefix(r.Tunnel, "vxlan_tunnel") || !r.NextHop.IsValid()) {
			t.Errorf("programmed %+v: want vxlan via the VTEP through a vxlan_tunnel", r)
		}
	}

	c.del(calico.BlockKey(netip.MustParsePrefix("10.244.3.0/26")))
	c.eventuallyEncap("a", []string{
		vxRoute("10.244.2.0/26", b.peerV4, vtepOf(b.index)),
		vxRoute("10.244.9.0/26", linuxIP, linuxVTEP),
		"fd00:10:244::80/122 via " + b.peerV6.String() + "@1",
	})
	c.waitFor("the tunnel to c and its neighbour deleted", settle, func() bool {
		_, still := c.vxlanOf("a")[cc.peerV4]
		return !still && len(c.neighborsOf("a")) == 2
	})
	if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete", "result", "error"); n != 0 {
		t.Errorf("route delete errors %v, want 0", n)
	}
}

// TestVXLANAgentRestart: a restarted agent adopts its VXLAN tunnels and neighbours by the tag: no
// write at all.
func TestVXLANAgentRestart(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 200 * time.Millisecond}, "a", "b")
	c.putNodes()
	c.putPoolModes(calico.EncapNever, calico.EncapAlways)
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	want := []string{vxRoute("10.244.2.0/26", b.peerV4, vtepOf(b.index))}
	c.eventuallyEncap("a", want)
	before, nbrs := c.vxlanOf("a"), c.neighborsOf("a")

	c.stop("a")
	sim := c.nodes["a"].sim
	sim.ResetRequests()
	c.start("a")
	c.waitFor("two periodic resyncs after the restart", settle, func() bool {
		return c.metric("a", "vpp_route_agent_syncs_total", "kind", "periodic", "result", "ok") >= 2
	})
	c.eventuallyEncap("a", want)
	for _, msg := range []string{"ip_route_add_del", "vxlan_add_del_tunnel_v3", "ip_neighbor_add_del", "sw_interface_set_unnumbered",
		"sw_interface_set_flags", "sw_interface_set_mtu", "sw_interface_tag_add_del", "sw_interface_set_mac_address"} {
		if n := sim.CountRequests(msg); n != 0 {
			t.Errorf("the restarted agent sent %d %s: a restart must not touch what is in place", n, msg)
		}
	}
	if after := c.vxlanOf("a"); !mapsEqual(before, after) || !slices.Equal(nbrs, c.neighborsOf("a")) {
		t.Errorf("tunnels or neighbours changed across the restart:\nbefore %+v %q\n after %+v %q", before, nbrs, after, c.neighborsOf("a"))
	}
	if n := c.metric("a", "vpp_route_agent_tunnels", "encap", "vxlan"); n != 1 {
		t.Errorf("vpp_route_agent_tunnels{encap=vxlan} = %v, want 1", n)
	}
}

// TestVXLANConfigChange: FelixConfiguration's vxlanVNI and vxlanPort changed: new tunnels with them
// (VPP keys a tunnel by both), each route replaced in place onto the new one (no route deleted: no
// gap), and the old tunnels deleted.
func TestVXLANConfigChange(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putNodes()
	c.putPoolModes(calico.EncapNever, calico.EncapAlways)
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	want := []string{vxRoute("10.244.2.0/26", b.peerV4, vtepOf(b.index))}
	c.eventuallyEncap("a", want)
	c.putFelixConfig(`{"vxlanVNI":5000,"vxlanPort":8472}`)
	c.waitFor("the tunnel with the new VNI and port, the old one gone", settle, func() bool {
		tun := c.nodes["a"].sim.VXLANTunnels() // both lead to b: not by destination
		return len(tun) == 1 && tun[0].VNI == 5000 && tun[0].SrcPort == 8472 && tun[0].DstPort == 8472
	})
	c.eventuallyEncap("a", want)
	if got, idx := c.neighborsOf("a"), c.vxlanOf("a")[b.peerV4].SwIfIndex; len(got) != 1 || !strings.HasSuffix(got[0], fmt.Sprintf("@%d", idx)) {
		t.Errorf("neighbours %q, want one on the new tunnel %d", got, idx)
	}
	if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); n != 0 {
		t.Errorf("%v route deletes; moving to a new tunnel must replace the route in place", n)
	}
}

// TestVXLANModeEdit: IPIP Always -> VXLAN Always -> IPIP Always: each route replaced in place, the
// tunnels of the other encapsulation deleted once unused.
func TestVXLANModeEdit(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putNodes()
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	ipipRoute := []string{"10.244.2.0/26 tunnel " + b.peerV4.String()}
	vxlan := []string{vxRoute("10.244.2.0/26", b.peerV4, vtepOf(b.index))}
	for i, step := range []struct {
		ipip, vxlan calico.EncapMode
		want        []string
	}{{calico.EncapAlways, calico.EncapNever, ipipRoute}, {calico.EncapNever, calico.EncapAlways, vxlan}, {calico.EncapAlways, calico.EncapNever, ipipRoute}} {
		c.putPoolModes(step.ipip, step.vxlan)
		c.eventuallyEncap("a", step.want)
		c.waitFor(fmt.Sprintf("step %d: only the tunnel of the mode", i), settle, func() bool {
			nIPIP, nVXLAN := len(c.tunnelsOf("a")), len(c.vxlanOf("a"))
			return step.ipip == calico.EncapAlways && nIPIP == 1 && nVXLAN == 0 || step.vxlan == calico.EncapAlways && nIPIP == 0 && nVXLAN == 1
		})
		if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); n != 0 {
			t.Fatalf("step %d: %v route deletes; a mode change must replace routes in place", i, n)
		}
	}
}

// TestVXLANNoPlugin: a VPP without the vxlan plugin (the minimal build), a pool switched to VXLAN: the
// routes VPP has are kept (never withdrawn for it), a new block's route is not programmed, /readyz
// names the plugin, the gauge counts the routes and the log says it once; every other route (the IPv6
// pool's, flat) is programmed.
func TestVXLANNoPlugin(t *testing.T) {
	c := newCluster(t, clusterOpts{sim: func(cfg *vppsim.Config) { cfg.NoVXLAN = true }}, "a", "b")
	c.putNodes()
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	kept := "10.244.2.0/26 via " + b.peerV4.String() + "@1"
	c.eventuallyEncap("a", []string{kept})
	c.putPoolModes(calico.EncapNever, calico.EncapAlways)
	c.waitFor("the gauge at 1", settle, func() bool { return c.metric("a", "vpp_route_agent_routes_without_vxlan_plugin") == 1 })
	c.putBlock("10.244.3.0/26", "b", nil)
	c.putBlock("fd00:10:244::80/122", "b", nil)
	c.eventuallyEncap("a", []string{kept, "fd00:10:244::80/122 via " + b.peerV6.String() + "@1"})
	c.waitFor("the gauge at 2", settle, func() bool { return c.metric("a", "vpp_route_agent_routes_without_vxlan_plugin") == 2 })
	var missing []string
	c.waitFor("/readyz naming the plugin", settle, func() bool {
		_, missing = c.nodes["a"].agent.Ready()
		return slices.ContainsFunc(missing, func(m string) bool { return strings.Contains(m, "no vxlan plugin") && strings.Contains(m, "2 routes") })
	})
	if n := c.nodes["a"].logs.count("VPP has no vxlan plugin"); n != 1 {
		t.Errorf("%d log lines about the plugin, want 1", n)
	}
	if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); n != 0 {
		t.Errorf("%v route deletes, want none", n)
	}
	c.eventuallyEncap("a", []string{kept, "fd00:10:244::80/122 via " + b.peerV6.String() + "@1"})
}

// TestVXLANBadNode: a Calico Node whose VTEP MAC does not parse, then one whose address does not: the
// node's routes stay as they are (never withdrawn for it), blockwatch logs and counts the field; a
// good value again puts the route on the new VTEP.
func TestVXLANBadNode(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putNodes()
	c.putPoolModes(calico.EncapNever, calico.EncapAlways)
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	want := []string{vxRoute("10.244.2.0/26", b.peerV4, vtepOf(b.index))}
	c.eventuallyEncap("a", want)
	bad := func(spec string) {
		c.put(calico.NodeKey("b"), `{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"b"},"spec":`+spec+`}`)
	}
	before := c.metric("a", "vpp_route_agent_field_problems_total")
	for i, spec := range []string{
		fmt.Sprintf(`{"bgp":{"ipv4Address":"%s/24"},"ipv4VXLANTunnelAddr":"10.244.2.1","vxlanTunnelMACAddr":"not-a-mac"}`, b.peerV4),
		`{"bgp":{"ipv4Address":"192.168.100.300/24"},"ipv4VXLANTunnelAddr":"10.244.2.1"}`,
	} {
		bad(spec)
		// Each bad value is counted once seen; the route was held already in case 1, so wait for the
		// count before looking at the route.
		c.waitFor(fmt.Sprintf("case %d: the field problem counted", i), settle, func() bool {
			return c.metric("a", "vpp_route_agent_field_problems_total") >= before+float64(i+1)
		})
		c.waitFor(fmt.Sprintf("case %d: the held route in /debug/routes", i), settle, func() bool {
			d := c.debug("a")
			return len(d.Desired) == 1 && d.Desired[0].Hold
		})
		// A resync settles it: the route is the same, nothing was deleted.
		c.eventuallyEncap("a", want)
		if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); n != 0 {
			t.Fatalf("case %d: %v route deletes, want none", i, n)
		}
	}
	if after := c.metric("a", "vpp_route_agent_field_problems_total"); after < before+2 {
		t.Errorf("field problems counted %v -> %v, want 2 more", before, after)
	}
	// Good again, on another VTEP address: the route moves to it.
	c.putNode("b", b.peerV4, netip.MustParseAddr("10.244.2.1"), "")
	c.eventuallyEncap("a", []string{vxRoute("10.244.2.0/26", b.peerV4, netip.MustParseAddr("10.244.2.1"))})
	c.waitFor("the old neighbour deleted", settle, func() bool {
		n := c.neighborsOf("a")
		return len(n) == 1 && strings.HasPrefix(n[0], "10.244.2.1 ")
	})
}

// TestVXLANMTU: FelixConfiguration's vxlanMTU sets a new VXLAN tunnel's MTU and the pod MTU; when it
// changes, the tunnel made for the old value follows (as IPIP tunnels do); one that does not fit in the
// uplink's MTU (9000) with VXLAN's 50 bytes is warned about and counted, and the pod MTU stays what fits.
func TestVXLANMTU(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putNodes()
	felix := func(mtu int) {
		c.put(calico.FelixConfigurationKey("default"), fmt.Sprintf(
			`{"kind":"FelixConfiguration","apiVersion":"projectcalico.org/v3","metadata":{"name":"default"},"spec":{"vxlanMTU":%d}}`, mtu))
	}
	felix(1400)
	c.putPoolModes(calico.EncapNever, calico.EncapAlways)
	c.waitFor("pod MTU 1400", settle, func() bool { return c.metric("a", "vpp_route_agent_pod_mtu_bytes") == 1400 })
	b := c.nodes["b"]
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventuallyEncap("a", []string{vxRoute("10.244.2.0/26", b.peerV4, vtepOf(b.index))})
	if tun := c.vxlanOf("a")[b.peerV4]; tun.MTU != [4]uint32{1400, 1400, 0, 0} {
		t.Errorf("VXLAN tunnel MTU %v, want vxlanMTU 1400", tun.MTU)
	}
	felix(1300) // the tunnel made for 1400 follows
	c.waitFor("VXLAN tunnel MTU 1300", settle, func() bool {
		return c.vxlanOf("a")[b.peerV4].MTU == [4]uint32{1300, 1300, 0, 0} && c.metric("a", "vpp_route_agent_pod_mtu_bytes") == 1300
	})
	if n := c.metric("a", "vpp_route_agent_encap_mtu_too_large"); n != 0 {
		t.Errorf("vpp_route_agent_encap_mtu_too_large = %v for an MTU that fits", n)
	}
	felix(8960) // 8960 + 50 > 9000
	c.waitFor("the warning", settle, func() bool {
		return c.nodes["a"].logs.count("vxlanMTU) plus its 50 bytes exceeds the uplink's MTU 9000") == 1
	})
	c.waitFor("pod MTU 8950 and the problem counted", settle, func() bool {
		return c.metric("a", "vpp_route_agent_pod_mtu_bytes") == 8950 && c.metric("a", "vpp_route_agent_encap_mtu_too_large") == 1
	})
}
