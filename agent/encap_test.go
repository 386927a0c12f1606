package agent_test

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/binapi/ipip"
	"go.fd.io/govpp/core"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// putPoolModes writes the IPv4 pool with the given modes (as written: any string).
func (c *cluster) putPoolModes(ipipMode, vxlanMode calico.EncapMode) {
	c.t.Helper()
	p := calico.IPPool{Name: "default-ipv4-ippool", CIDR: poolV4, BlockSize: 26, IPIPMode: ipipMode, VXLANMode: vxlanMode}
	if err := calicotest.PutPool(c.ctx(), c.cli, p); err != nil {
		c.t.Fatal(err)
	}
}

// encapFIB returns node name's API routes in the pools as "prefix via nh" (on the uplink) or "prefix
// tunnel dst" (through a tunnel of the simulator, no next hop), sorted.
func (c *cluster) encapFIB(name string) []string {
	sim := c.nodes[name].sim
	dst := map[uint32]netip.Addr{}
	for _, t := range sim.Tunnels() {
		dst[t.SwIfIndex] = t.Dst
	}
	vxDst := map[uint32]netip.Addr{}
	for _, t := range sim.VXLANTunnels() {
		vxDst[t.SwIfIndex] = t.Dst
	}
	var out []string
	for _, r := range sim.APIRoutes(0) {
		if !poolV4.Contains(r.Prefix.Addr()) && !poolV6.Contains(r.Prefix.Addr()) {
			continue
		}
		var paths []string
		for _, p := range r.Paths {
			// A host prefix through a tunnel is dumped with its own address as next hop (as VPP does).
			if d, ok := dst[p.SwIfIndex]; ok && (!p.NextHop.IsValid() || r.Prefix.IsSingleIP() && p.NextHop == r.Prefix.Addr()) {
				paths = append(paths, "tunnel "+d.String())
			} else if d, ok := vxDst[p.SwIfIndex]; ok {
				paths = append(paths, "vxlan "+d.String()+" via "+p.NextHop.String())
			} else {
				paths = append(paths, fmt.Sprintf("via %s@%d", p.NextHop, p.SwIfIndex))
			}
		}
		out = append(out, r.Prefix.String()+" "+strings.Join(paths, ","))
	}
	slices.Sort(out)
	return out
}

// eventuallyEncap waits until node name's encapFIB equals want (sorted by the caller or not).
func (c *cluster) eventuallyEncap(name string, want []string) {
	c.t.Helper()
	want = slices.Sorted(slices.Values(want))
	var got []string
	deadline := time.Now().Add(settle)
	for got = c.encapFIB(name); !slices.Equal(got, want); got = c.encapFIB(name) {
		if time.Now().After(deadline) {
			c.t.Fatalf("node %s's FIB\n got %q\nwant %q: not within %s", name, got, want, settle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// tunnelsOf returns node name's IPIP tunnels by destination.
func (c *cluster) tunnelsOf(name string) map[netip.Addr]vppsim.Tunnel {
	out := map[netip.Addr]vppsim.Tunnel{}
	for _, t := range c.nodes[name].sim.Tunnels() {
		out[t.Dst] = t
	}
	return out
}

// TestIPIPAlways: with ipipMode Always on the IPv4 pool, the agent routes each remote IPv4 block
// through one p2p tunnel per peer: tagged vpp-route-agent, source its uplink address, unnumbered to the
// uplink, MTU the uplink's less 20, admin up; the route has no next hop. IPv6 stays flat (IPIP is
// IPv4-only). /debug/routes and the metrics name the encapsulation and the tunnel. When a peer's last
// block goes, its route goes and then its tunnel, in the same reconcile.
func TestIPIPAlways(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b", "c")
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "c", nil)
	c.putBlock("fd00:10:244::80/122", "b", nil)
	b, cc := c.nodes["b"], c.nodes["c"]
	c.eventuallyEncap("a", []string{
		"10.244.2.0/26 tunnel " + b.peerV4.String(),
		"10.244.3.0/26 tunnel " + cc.peerV4.String(),
		"fd00:10:244::80/122 via " + b.peerV6.String() + "@1",
	})
	tunnels := c.tunnelsOf("a")
	if len(tunnels) != 2 {
		t.Fatalf("tunnels %v, want one to b and one to c", tunnels)
	}
	for _, peer := range []netip.Addr{b.peerV4, cc.peerV4} {
		tun := tunnels[peer]
		want := vppsim.Tunnel{SwIfIndex: tun.SwIfIndex, Name: tun.Name, Src: c.nodes["a"].peerV4, Dst: peer, Unnumbered: 1,
			MTU: [4]uint32{8980, 8980, 0, 0}, AdminUp: true, Tag: agent.TunnelTag}
		if tun != want {
			t.Errorf("tunnel to %s:\n got %+v\nwant %+v", peer, tun, want)
		}
	}
	if n := c.metric("a", "vpp_route_agent_tunnels", "encap", "ipip"); n != 2 {
		t.Errorf("vpp_route_agent_tunnels{encap=ipip} = %v, want 2", n)
	}
	if n := c.metric("a", "vpp_route_agent_pod_mtu_bytes"); n != 8980 {
		t.Errorf("vpp_route_agent_pod_mtu_bytes = %v, want 8980 (the uplink's 9000 less IPIP's 20)", n)
	}
	c.waitFor("routes by encapsulation in the metrics", settle, func() bool {
		return c.metric("a", "vpp_route_agent_routes_programmed_by_encap", "encap", "ipip") == 2 &&
			c.metric("a", "vpp_route_agent_routes_programmed_by_encap", "encap", "none") == 1
	})
	var d agent.Debug
	c.waitFor("/debug/routes with the tunnels", settle, func() bool {
		d = c.debug("a")
		return len(d.Programmed) == 3 && len(d.Tunnels) == 2
	})
	for _, r := range d.Programmed {
		wantEncap := calico.EncapIPIP
		if r.Prefix.Addr().Is6() {
			wantEncap = calico.EncapNone
		}
		if r.Encap != wantEncap || (wantEncap == calico.EncapIPIP) != (r.Tunnel != "" && r.TunnelIndex != 0) {
			t.Errorf("programmed %+v: want encap %v with a tunnel named for ipip", r, wantEncap)
		}
	}
	for _, r := range d.Desired {
		if r.Prefix.Addr().Is4() && r.Encap != calico.EncapIPIP {
			t.Errorf("desired %+v: want encap ipip", r)
		}
	}

	// c's block goes: its route, then its tunnel (a tunnel deleted first would leave the route dead and
	// undeletable through its path).
	c.del(calico.BlockKey(netip.MustParsePrefix("10.244.3.0/26")))
	c.eventuallyEncap("a", []string{
		"10.244.2.0/26 tunnel " + b.peerV4.String(),
		"fd00:10:244::80/122 via " + b.peerV6.String() + "@1",
	})
	c.waitFor("the tunnel to c deleted", settle, func() bool {
		_, still := c.tunnelsOf("a")[cc.peerV4]
		return !still && len(c.tunnelsOf("a")) == 1
	})
	if n := c.metric("a", "vpp_route_agent_tunnel_operations_total", "op", "delete", "result", "ok"); n != 1 {
		t.Errorf("tunnel deletes %v, want 1", n)
	}
	if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete", "result", "error"); n != 0 {
		t.Errorf("route delete errors %v, want 0", n)
	}
}

// TestIPIPBorrowedAddress: an address c borrowed in b's block is routed as a /32 through the tunnel to
// c, which VPP dumps with the address itself as next hop; the full resyncs that follow read it as the
// agent's own route (before, they took it for another's: routes_conflicting rose and the route was
// never the agent's again).
func TestIPIPBorrowedAddress(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 200 * time.Millisecond}, "a", "b", "c")
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", map[int]string{5: "c"})
	b, cc := c.nodes["b"], c.nodes["c"]
	c.eventuallyEncap("a", []string{
		"10.244.2.0/26 tunnel " + b.peerV4.String(),
		"10.244.2.5/32 tunnel " + cc.peerV4.String(),
	})
	periodic := func() float64 {
		return c.metric("a", "vpp_route_agent_syncs_total", "kind", "periodic", "result", "ok")
	}
	resyncs := periodic()
	c.waitFor("three more full resyncs", settle, func() bool { return periodic() >= resyncs+3 })
	if n := c.metric("a", "vpp_route_agent_routes_conflicting"); n != 0 {
		t.Errorf("vpp_route_agent_routes_conflicting = %v, want 0: the borrowed /32 through the tunnel taken for another's", n)
	}
	if n := c.metric("a", "vpp_route_agent_routes_programmed"); n != 2 {
		t.Errorf("vpp_route_agent_routes_programmed = %v, want 2", n)
	}
	if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "add", "result", "ok"); n != 2 {
		t.Errorf("route adds %v, want 2 (none re-added by the resyncs)", n)
	}
}

// TestIPIPModeEdit: a pool's mode edited at run time reprograms its routes without a restart, each
// route replaced in place (no route deleted: no gap), and the tunnels no route uses any more deleted.
// Never -> Always -> Never -> Always.
func TestIPIPModeEdit(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b", "c")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "c", nil)
	b, cc := c.nodes["b"], c.nodes["c"]
	flat := []string{"10.244.2.0/26 via " + b.peerV4.String() + "@1", "10.244.3.0/26 via " + cc.peerV4.String() + "@1"}
	tunneled := []string{"10.244.2.0/26 tunnel " + b.peerV4.String(), "10.244.3.0/26 tunnel " + cc.peerV4.String()}
	c.eventuallyEncap("a", flat)
	for i, step := range []struct {
		mode calico.EncapMode
		want []string
	}{{calico.EncapAlways, tunneled}, {calico.EncapNever, flat}, {calico.EncapAlways, tunneled}} {
		c.putPoolModes(step.mode, calico.EncapNever)
		c.eventuallyEncap("a", step.want)
		wantTunnels := 2
		if step.mode == calico.EncapNever {
			wantTunnels = 0
		}
		c.waitFor(fmt.Sprintf("step %d: %d tunnels", i, wantTunnels), settle, func() bool { return len(c.tunnelsOf("a")) == wantTunnels })
		if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); n != 0 {
			t.Fatalf("step %d (ipipMode %s): %v route deletes; a mode change must replace routes in place", i, step.mode, n)
		}
	}
	if n := c.metric("a", "vpp_route_agent_tunnel_operations_total", "op", "create", "result", "ok"); n != 4 {
		t.Errorf("tunnel creations %v, want 4 (two per switch to Always)", n)
	}
}

// TestIPIPAgentRestart: an agent restarted over a VPP with its tunnels adopts them by their tag: it
// sends no tunnel or route write at all, so nothing flaps; an operator's tunnel (no tag) is neither
// counted nor touched, even when no pool uses IPIP any more, while the agent's own are deleted.
func TestIPIPAgentRestart(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 200 * time.Millisecond}, "a", "b", "c")
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "c", nil)
	b, cc := c.nodes["b"], c.nodes["c"]
	tunneled := []string{"10.244.2.0/26 tunnel " + b.peerV4.String(), "10.244.3.0/26 tunnel " + cc.peerV4.String()}
	c.eventuallyEncap("a", tunneled)
	// An operator's tunnel, as `create ipip tunnel src ... dst ...` makes it: no tag.
	operatorTunnel(t, c.nodes["a"].sock, c.nodes["a"].peerV4, netip.MustParseAddr("192.168.100.99"))
	before := c.tunnelsOf("a")

	c.stop("a")
	sim := c.nodes["a"].sim
	sim.ResetRequests()
	c.start("a")
	c.waitFor("two periodic resyncs after the restart", settle, func() bool {
		return c.metric("a", "vpp_route_agent_syncs_total", "kind", "periodic", "result", "ok") >= 2
	})
	c.eventuallyEncap("a", tunneled)
	for _, msg := range []string{"ip_route_add_del", "ipip_add_tunnel", "ipip_del_tunnel", "sw_interface_set_unnumbered",
		"sw_interface_set_flags", "sw_interface_set_mtu", "sw_interface_tag_add_del"} {
		if n := sim.CountRequests(msg); n != 0 {
			t.Errorf("the restarted agent sent %d %s: a restart must not touch what is in place", n, msg)
		}
	}
	if after := c.tunnelsOf("a"); !mapsEqual(before, after) {
		t.Errorf("tunnels changed across the restart:\nbefore %+v\n after %+v", before, after)
	}
	if n := c.metric("a", "vpp_route_agent_tunnels", "encap", "ipip"); n != 2 {
		t.Errorf("vpp_route_agent_tunnels{encap=ipip} = %v, want 2 (the operator's is not the agent's)", n)
	}

	if n := c.metric("a", "vpp_route_agent_routes_conflicting"); n != 0 {
		t.Errorf("%v routes taken for another's after the restart, want 0", n)
	}

	c.putPoolModes(calico.EncapNever, calico.EncapNever)
	c.eventuallyEncap("a", []string{"10.244.2.0/26 via " + b.peerV4.String() + "@1", "10.244.3.0/26 via " + cc.peerV4.String() + "@1"})
	c.waitFor("only the operator's tunnel left", settle, func() bool {
		left := c.tunnelsOf("a")
		op, ok := left[netip.MustParseAddr("192.168.100.99")]
		return len(left) == 1 && ok && op.Tag == ""
	})
	if n := c.metric("a", "vpp_route_agent_tunnels", "encap", "ipip"); n != 0 {
		t.Errorf("vpp_route_agent_tunnels{encap=ipip} = %v, want 0", n)
	}
}

func mapsEqual[K comparable, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// operatorTunnel creates a p2p IPIP tunnel on the VPP at sock, as an operator's vppctl does: no tag.
func operatorTunnel(t *testing.T, sock string, src, dst netip.Addr) {
	t.Helper()
	conn, err := core.Connect(socketclient.NewVppClient(sock))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Disconnect()
	ch, err := conn.NewAPIChannel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	req := &ipip.IpipAddTunnel{Tunnel: ipip.IpipTunnel{Instance: ^uint32(0),
		Src: ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(src.As4())},
		Dst: ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(dst.As4())}}}
	if err := ch.SendRequest(req).ReceiveReply(&ipip.IpipAddTunnelReply{}); err != nil {
		t.Fatal(err)
	}
}

// TestIPIPVPPRestart: a restarted VPP has no tunnels and no routes; the agent builds both again.
func TestIPIPVPPRestart(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", nil)
	want := []string{"10.244.2.0/26 tunnel " + c.nodes["b"].peerV4.String()}
	c.eventuallyEncap("a", want)
	if err := c.nodes["a"].sim.Restart(); err != nil {
		t.Fatal(err)
	}
	c.eventuallyEncap("a", want)
	tun := c.tunnelsOf("a")[c.nodes["b"].peerV4]
	if tun.Tag != agent.TunnelTag || tun.Unnumbered != 1 || !tun.AdminUp {
		t.Errorf("tunnel after the VPP restart: %+v", tun)
	}
}

// TestIPIPProblemPool: a pool whose modes Calico's validator would refuse keeps the encapsulation its
// routes have: an unknown ipipMode (Calico reads it as Never) leaves the tunnel routes as they are, and
// both modes set (VXLAN wins in Calico's reading) too; a block new to such a pool follows Calico's
// reading (flat, then VXLAN). A valid mode again decides as usual.
func TestIPIPProblemPool(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b", "c")
	c.putNodes()
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", nil)
	b, cc := c.nodes["b"], c.nodes["c"]
	c.eventuallyEncap("a", []string{"10.244.2.0/26 tunnel " + b.peerV4.String()})
	for i, modes := range [][2]calico.EncapMode{{"Sometimes", calico.EncapNever}, {calico.EncapAlways, calico.EncapAlways}} {
		deletes := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete")
		c.putPoolModes(modes[0], modes[1])
		c.waitFor("the agent to take the pool edit", settle, func() bool {
			return c.nodes["a"].logs.count("encapsulation modes are in question") > i
		})
		c.putBlock("10.244.3.0/26", "c", nil) // after the pool edit: the agent has the edit when it sees it
		newRoute := "10.244.3.0/26 via " + cc.peerV4.String() + "@1"
		if modes[1] == calico.EncapAlways {
			newRoute = vxRoute("10.244.3.0/26", cc.peerV4, vtepOf(cc.index))
		}
		c.eventuallyEncap("a", []string{"10.244.2.0/26 tunnel " + b.peerV4.String(), newRoute})
		if n := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); n != deletes {
			t.Fatalf("modes %v: %v route deletes, want none", modes, n-deletes)
		}
		c.del(calico.BlockKey(netip.MustParsePrefix("10.244.3.0/26")))
		c.eventuallyEncap("a", []string{"10.244.2.0/26 tunnel " + b.peerV4.String()})
		c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	}
	c.putPoolModes(calico.EncapNever, calico.EncapNever)
	c.eventuallyEncap("a", []string{"10.244.2.0/26 via " + b.peerV4.String() + "@1"})
}

// TestIPIPUplinkRebind: the uplink deleted and made again (another interface took its index): the
// tunnels borrow the new uplink's address again (VPP dropped their unnumbered use of the deleted one) and
// the routes through them are in place and alive.
func TestIPIPUplinkRebind(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	want := []string{"10.244.2.0/26 tunnel " + b.peerV4.String()}
	c.eventuallyEncap("a", want)
	sim := c.nodes["a"].sim
	if err := sim.DeleteInterface(uplinkName); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the agent says the uplink is missing", settle, func() bool { return c.metric("a", "vpp_route_agent_uplink_waiting") == 1 })
	if _, err := sim.CreateInterface("loop9"); err != nil {
		t.Fatal(err)
	}
	idx, err := sim.CreateInterface(uplinkName)
	if err != nil {
		t.Fatal(err)
	}
	c.waitFor("the tunnel unnumbered to the new uplink", settle, func() bool {
		tun, ok := c.tunnelsOf("a")[b.peerV4]
		return ok && tun.Unnumbered == idx && tun.AdminUp
	})
	c.eventuallyEncap("a", want)
	for _, r := range sim.APIRoutes(0) {
		if r.Unresolved {
			t.Errorf("%s still drops traffic", r.Prefix)
		}
	}
}

// TestIPIPMTU: a FelixConfiguration ipipMTU sets the tunnels' MTU and the pod MTU; one that does not fit
// in the uplink's MTU (9000) with IPIP's 20 bytes is warned about once, and the pod MTU stays what fits.
func TestIPIPMTU(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	felix := func(mtu int) {
		c.put(calico.FelixConfigurationKey("default"), fmt.Sprintf(
			`{"kind":"FelixConfiguration","apiVersion":"projectcalico.org/v3","metadata":{"name":"default"},"spec":{"ipipMTU":%d}}`, mtu))
	}
	felix(1400)
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	// Both taken before the first tunnel is made (etcd's prefixes are watched on separate streams).
	c.waitFor("pod MTU 1400", settle, func() bool { return c.metric("a", "vpp_route_agent_pod_mtu_bytes") == 1400 })
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventuallyEncap("a", []string{"10.244.2.0/26 tunnel " + c.nodes["b"].peerV4.String()})
	if tun := c.tunnelsOf("a")[c.nodes["b"].peerV4]; tun.MTU != [4]uint32{1400, 1400, 0, 0} {
		t.Errorf("tunnel MTU %v, want ipipMTU 1400", tun.MTU)
	}
	if n := c.nodes["a"].logs.count("exceeds the uplink's MTU"); n != 0 {
		t.Errorf("warned %d times about an MTU that fits", n)
	}
	felix(1300) // the tunnel made for 1400 follows
	c.waitFor("tunnel MTU 1300", settle, func() bool {
		return c.tunnelsOf("a")[c.nodes["b"].peerV4].MTU == [4]uint32{1300, 1300, 0, 0} && c.metric("a", "vpp_route_agent_pod_mtu_bytes") == 1300
	})
	if n := c.metric("a", "vpp_route_agent_encap_mtu_too_large"); n != 0 {
		t.Errorf("vpp_route_agent_encap_mtu_too_large = %v for an MTU that fits", n)
	}
	felix(8990)
	c.waitFor("the warning", settle, func() bool { return c.nodes["a"].logs.count("exceeds the uplink's MTU") == 1 })
	c.waitFor("pod MTU 8980", settle, func() bool { return c.metric("a", "vpp_route_agent_pod_mtu_bytes") == 8980 })
	c.waitFor("the MTU problem counted", settle, func() bool { return c.metric("a", "vpp_route_agent_encap_mtu_too_large") == 1 })
}

// TestIPIPAtStart: an agent started with an IPIP pool and remote blocks already in etcd makes its
// tunnels while it lists etcd (the routes go in before the list is complete), with the MTU of a tunnel
// made later: the uplink's less 20.
func TestIPIPAtStart(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.stop("a")
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.start("a")
	b := c.nodes["b"]
	c.eventuallyEncap("a", []string{"10.244.2.0/26 tunnel " + b.peerV4.String()})
	if tun := c.tunnelsOf("a")[b.peerV4]; tun.MTU != [4]uint32{8980, 8980, 0, 0} || tun.Tag != agent.TunnelTag {
		t.Errorf("tunnel made at start: %+v, want MTU 8980 and the agent's tag", tun)
	}
}

// TestRandomizedEncapConvergence plays a random sequence of block puts and deletes, pool mode edits
// (Never, Always, CrossSubnet, an unknown mode), peer registrations (y in another subnet), agent restarts
// and VPP restarts against three nodes; once the pool has a valid mode again and things are quiet, each
// node's routes are the desired ones with their encapsulation, and its tunnels exactly one per peer its
// IPIP routes go to, all tagged: none leaked, none missing. RANDOM_SEED reproduces a run.
func TestRandomizedEncapConvergence(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	if s, err := strconv.ParseUint(os.Getenv("RANDOM_SEED"), 10, 64); err == nil {
		seed = s
	}
	t.Logf("RANDOM_SEED=%d", seed)
	rng := rand.New(rand.NewPCG(seed, seed^0xe9ca))
	c := newCluster(t, clusterOpts{grace: 100 * time.Millisecond}, "a", "b", "c")
	nodes := []string{"a", "b", "c", "x", "y"}
	peerOf := map[string]string{"x": "192.168.100.50", "y": "192.168.101.51"}
	var cidrs []string
	for i := range 12 {
		cidrs = append(cidrs, fmt.Sprintf("10.244.%d.%d/26", i/4, (i%4)*64))
	}
	cidrs = append(cidrs, "fd00:10:244::/122", "fd00:10:244::40/122")
	modes := []calico.EncapMode{calico.EncapNever, calico.EncapAlways, calico.EncapCrossSubnet, "Sometimes"}
	for range 150 {
		switch k := rng.IntN(100); {
		case k < 45:
			pods := map[int]string{}
			for j := rng.IntN(2); j > 0; j-- {
				pods[rng.IntN(64)] = nodes[rng.IntN(len(nodes))]
			}
			c.putBlock(cidrs[rng.IntN(len(cidrs))], nodes[rng.IntN(len(nodes))], pods)
		case k < 60:
			c.del(calico.BlockKey(netip.MustParsePrefix(cidrs[rng.IntN(len(cidrs))])))
		case k < 80:
			c.putPoolModes(modes[rng.IntN(len(modes))], calico.EncapNever)
		case k < 88:
			n := []string{"x", "y"}[rng.IntN(2)]
			if rng.IntN(2) == 0 {
				c.put(hosts+n+"/peerip/ipv4/1", peerOf[n])
			} else {
				c.del(hosts + n + "/peerip/ipv4/1")
			}
		case k < 94:
			n := []string{"a", "b", "c"}[rng.IntN(3)]
			c.stop(n)
			c.start(n)
		default:
			if err := c.nodes[[]string{"a", "b", "c"}[rng.IntN(3)]].sim.Restart(); err != nil {
				t.Fatal(err)
			}
		}
		if rng.IntN(6) == 0 {
			time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond)
		}
	}
	c.putPoolModes(modes[rng.IntN(3)], calico.EncapNever) // a valid mode decides every route again

	deadline := time.Now().Add(settle)
	for {
		snap := c.snapshot()
		bad := ""
		for name, n := range c.nodes {
			routes, _ := agent.Desired(snap, agent.Options{NodeName: name, UplinkPrefixes: []netip.Prefix{netip.PrefixFrom(n.peerV4, 24)}})
			var want []string
			peers := map[netip.Addr]bool{}
			for _, r := range routes {
				if r.Encap == calico.EncapIPIP {
					want = append(want, r.Prefix.String()+" tunnel "+r.NextHop.String())
					peers[r.NextHop] = true
				} else {
					want = append(want, fmt.Sprintf("%s via %s@1", r.Prefix, r.NextHop))
				}
			}
			slices.Sort(want)
			got := c.encapFIB(name)
			tunnels := c.tunnelsOf(name)
			tagged := len(tunnels) == len(peers)
			for dst, tun := range tunnels {
				tagged = tagged && peers[dst] && tun.Tag == agent.TunnelTag && tun.AdminUp && tun.Unnumbered == 1
			}
			if !slices.Equal(got, want) || !tagged {
				bad = fmt.Sprintf("node %s:\n got %q\nwant %q\ntunnels %+v, want to %v", name, got, want, tunnels, peers)
				break
			}
		}
		if bad == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not converged after %s: %s", settle, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestIPIPMultipathLeftover: a route of the agent's found with two paths, through its tunnel and via the
// peer on the uplink (left by another writer), is replaced by the single tunnel path at the next resync.
func TestIPIPMultipathLeftover(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 200 * time.Millisecond}, "a", "b")
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	want := []string{"10.244.2.0/26 tunnel " + b.peerV4.String()}
	c.eventuallyEncap("a", want)
	tun := c.tunnelsOf("a")[b.peerV4]
	leftover := vppsim.Route{Prefix: netip.MustParsePrefix("10.244.2.0/26"),
		Paths: []vppsim.Path{{SwIfIndex: tun.SwIfIndex}, {NextHop: b.peerV4, SwIfIndex: 1}}}
	if err := c.nodes["a"].sim.AddRoute(leftover); err != nil {
		t.Fatal(err)
	}
	c.eventuallyEncap("a", want)
}

// TestIPIPHalfMadeTunnelFinished: VPP makes the tunnel but its reply is lost (the connection fails
// before the agent tags it), so VPP holds an untagged tunnel the agent asked for. It is not taken for
// another's: once VPP answers again the agent finishes it (tag, unnumbered, MTU, up) and routes through
// it. Before, it was a foreign tunnel for good and the route stayed flat.
func TestIPIPHalfMadeTunnelFinished(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	b := c.nodes["b"]
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventuallyEncap("a", []string{"10.244.2.0/26 via " + b.peerV4.String() + "@1"})
	sim := c.nodes["a"].sim
	sim.SetFaults(vppsim.Faults{HangUpOn: "ipip_add_tunnel"})
	c.putPoolModes(calico.EncapAlways, calico.EncapNever)
	c.waitFor("the tunnel's request lost with the connection", settle, func() bool {
		_, ok := c.tunnelsOf("a")[b.peerV4]
		return ok
	})
	c.eventuallyEncap("a", []string{"10.244.2.0/26 tunnel " + b.peerV4.String()})
	c.waitFor("the tunnel finished", settle, func() bool {
		tun := c.tunnelsOf("a")[b.peerV4]
		return tun.Tag == agent.TunnelTag && tun.AdminUp && tun.Unnumbered == 1
	})
	if n := len(c.tunnelsOf("a")); n != 1 {
		t.Errorf("%d tunnels, want 1", n)
	}
	// The gauge moves by one per creation (putTunnel): finishing an adopted tunnel replaces it, not adds.
	if n := c.metric("a", "vpp_route_agent_tunnels", "encap", "ipip"); n != 1 {
		t.Errorf("vpp_route_agent_tunnels{encap=ipip} = %v, want 1", n)
	}
}
