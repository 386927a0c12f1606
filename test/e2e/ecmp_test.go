package e2e

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// TestECMPTwoUplinks runs the daemon with two uplinks (the uplink and loop1: loopbacks will do, VPP
// accepts attached next hops on them) against remote nodes that registered a peer IP on each uplink's
// subnet (/1 and /2), one older node with /1 only: VPP gets one route per block with a path per
// uplink, listed in its dump like every ECMP route. A node losing its /2 has its route replaced by one
// path, never deleted; /debug/routes and the metrics show the paths.
func TestECMPTwoUplinks(t *testing.T) {
	c := newCluster(t)
	c.putPool("default-ipv4-ippool", pool.String(), 26)
	v := vpptest.New(t, vpptest.Options{Loopbacks: []int{1}})
	second := netip.MustParsePrefix("172.31.0.254/16")
	const nodes = 3
	peer2 := func(i int) netip.Addr { return netip.AddrFrom4([4]byte{172, 31, 0, byte(1 + i)}) }
	var blocks []netip.Prefix
	for i := range nodes {
		c.putPeer(remoteNode(i), remotePeer(i))
		if i > 0 { // node 0 is an older agent: /1 only
			c.put(blockwatch.PeerKeyAt(hostsPrefix, remoteNode(i), netaddr.V4, 2), peer2(i).String())
		}
		blocks = append(blocks, c.putBlock(i, remoteNode(i)))
	}
	a := startAgent(t, agentConfig{node: "node-self", etcd: c.etcd.Endpoint(), socket: v.Socket(), uplink: selfAddr,
		uplinkIf: v.Uplink(), extra: []string{"--uplink-interface", "loop1", "--uplink-address", second.String()}})
	a.waitReady(30 * time.Second)
	up1, up2 := uint32(1), uint32(2)
	paths := func(i int, withSecond bool) string {
		ps := []string{fmt.Sprintf("%s@%d", remotePeer(i), up1)}
		if withSecond {
			ps = append(ps, fmt.Sprintf("%s@%d", peer2(i), up2))
		}
		slices.Sort(ps)
		return strings.Join(ps, ",")
	}
	fib := func() map[netip.Prefix]string {
		out := map[netip.Prefix]string{}
		for _, r := range v.Routes(vppsim.SourceAPI) {
			if !pool.Contains(r.Prefix.Addr()) {
				continue
			}
			var ps []string
			for _, p := range r.Paths {
				ps = append(ps, fmt.Sprintf("%s@%d", p.NextHop, p.SwIfIndex))
			}
			slices.Sort(ps)
			out[r.Prefix] = strings.Join(ps, ",")
		}
		return out
	}
	want := map[netip.Prefix]string{blocks[0]: paths(0, false), blocks[1]: paths(1, true), blocks[2]: paths(2, true)}
	check := func(step string) {
		eventually(t, 30*time.Second, func() string {
			if got := fib(); fmt.Sprint(got) != fmt.Sprint(want) {
				return fmt.Sprintf("%s: VPP has %v, want %v", step, got, want)
			}
			return ""
		})
	}
	check("start")
	eventually(t, 10*time.Second, func() string {
		if n := a.metrics().value(t, "vpp_route_agent_routes_programmed_ecmp"); n != 2 {
			return fmt.Sprintf("routes_programmed_ecmp = %v, want 2", n)
		}
		return ""
	})

	if _, err := c.cli.Delete(c.ctx(), blockwatch.PeerKeyAt(hostsPrefix, remoteNode(1), netaddr.V4, 2)); err != nil {
		t.Fatal(err)
	}
	want[blocks[1]] = paths(1, false)
	check("node 1 lost its /2")
	if n := a.metrics().value(t, "vpp_route_agent_route_operations_total", "op", "delete"); n != 0 {
		t.Errorf("%v routes deleted: a path-set change must be one replace", n)
	}
	if _, body := a.get("/debug/routes"); !strings.Contains(body, fmt.Sprintf(`"via %s sw_if_index %d"`, peer2(2), up2)) {
		t.Errorf("/debug/routes does not show the second path of %s:\n%s", blocks[2], body)
	}
}
