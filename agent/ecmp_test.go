package agent_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// TestECMPOverTwoUplinks: nodes with two uplinks register peerip/<family>/1 and /2, and each routes the
// other's blocks over both, as one route with two paths (uplink 1 via the owner's /1, uplink 2 via its
// /2), in both families. /debug/routes shows the paths.
func TestECMPOverTwoUplinks(t *testing.T) {
	c := newCluster(t, clusterOpts{twoUplinks: true}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("fd00:10:244:0:2::/122", "b", nil)
	b := c.nodes["b"]
	c.eventually("a", []string{
		fmt.Sprintf("10.244.2.0/26 via %s@1,%s@2", b.peerV4, b.peer2V4),
		fmt.Sprintf("fd00:10:244:0:2::/122 via %s@1,%s@2", b.peerV6, b.peer2V6),
	}, settle)
	d := c.debug("a")
	i := slices.IndexFunc(d.Programmed, func(r agent.ProgrammedRoute) bool { return r.Prefix.String() == "10.244.2.0/26" })
	if i < 0 || len(d.Programmed[i].Paths) != 2 || !strings.Contains(d.Programmed[i].Paths[1], "sw_if_index 2") {
		t.Errorf("/debug/routes programmed: %+v", d.Programmed)
	}
	if got := fmt.Sprint(d.Uplinks); got != "[{uplink "+uplinkName+" 1 ready false} {uplink "+uplink2Name+" 2 ready false}]" {
		t.Errorf("/debug/routes uplinks: %s", got)
	}
	c.waitFor("routes_programmed_ecmp 2", 5*time.Second, func() bool {
		return c.metric("a", "vpp_route_agent_routes_programmed_ecmp") == 2
	})
}

// TestECMPPathSetChanges: peers written by hand (no agent) with two peer IPs, one on each uplink's
// subnet. A peer losing its /2 has its route replaced by one path, a peer getting it back by two, each
// as one replace (no route is ever deleted); an older agent's /1 alone gives one path; a registration
// with a gap (/1 and /3) is logged once, counted, and routed over what it has.
func TestECMPPathSetChanges(t *testing.T) {
	c := newCluster(t, clusterOpts{twoUplinks: true}, "a")
	key := func(node string, i int) string { return blockwatch.PeerKeyAt(hosts, node, netaddr.V4, i) }
	c.put(key("p", 1), "192.168.100.20")
	c.put(key("p", 2), "192.168.101.20")
	c.put(key("old", 1), "192.168.100.21")
	c.put(key("gap", 1), "192.168.100.22")
	c.put(key("gap", 3), "192.168.101.22")
	c.putBlock("10.244.20.0/26", "p", nil)
	c.putBlock("10.244.21.0/26", "old", nil)
	c.putBlock("10.244.22.0/26", "gap", nil)
	two := []string{
		"10.244.20.0/26 via 192.168.100.20@1,192.168.101.20@2",
		"10.244.21.0/26 via 192.168.100.21@1",
		"10.244.22.0/26 via 192.168.100.22@1,192.168.101.22@2",
	}
	c.eventually("a", two, settle)
	if v := c.metric("a", "vpp_route_agent_peer_registration_gaps_total"); v != 1 {
		t.Errorf("peer_registration_gaps_total = %v, want 1", v)
	}

	c.del(key("p", 2))
	c.eventually("a", []string{two[0][:strings.Index(two[0], ",")], two[1], two[2]}, settle)
	c.put(key("p", 2), "192.168.101.20")
	c.eventually("a", two, settle)
	// A path moved to another peer IP on the same uplink.
	c.put(key("p", 2), "192.168.101.30")
	c.eventually("a", []string{"10.244.20.0/26 via 192.168.100.20@1,192.168.101.30@2", two[1], two[2]}, settle)

	if v := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); v != 0 {
		t.Errorf("route deletes = %v: a path-set change must be one replace", v)
	}
	c.put(key("gap", 4), "192.168.101.23") // the registration changes, its gap stays: not logged again
	c.eventually("a", []string{"10.244.20.0/26 via 192.168.100.20@1,192.168.101.30@2", two[1],
		"10.244.22.0/26 via 192.168.100.22@1,192.168.101.22@2,192.168.101.23@2"}, settle)
	if n := c.nodes["a"].logs.count("gap in its peer IP indexes"); n != 1 {
		t.Errorf("the gap was logged %d times, want once", n)
	}
}

// TestECMPPeerIPOffUplinks: a peer IP on neither uplink's subnet gets no path, and is logged once and
// counted; a node whose only peer IP is off both subnets is routed via it on the first uplink, as with
// one uplink (never withdrawn).
func TestECMPPeerIPOffUplinks(t *testing.T) {
	c := newCluster(t, clusterOpts{twoUplinks: true}, "a")
	key := func(node string, i int) string { return blockwatch.PeerKeyAt(hosts, node, netaddr.V4, i) }
	c.put(key("p", 1), "192.168.100.20")
	c.put(key("p", 2), "203.0.113.20")
	c.put(key("far", 1), "198.51.100.9")
	c.putBlock("10.244.20.0/26", "p", nil)
	c.putBlock("10.244.21.0/26", "far", nil)
	c.eventually("a", []string{"10.244.20.0/26 via 192.168.100.20@1", "10.244.21.0/26 via 198.51.100.9@1"}, settle)
	c.waitFor("two off-uplink peer IPs counted", 5*time.Second, func() bool {
		return c.metric("a", "vpp_route_agent_peer_ips_off_uplinks_total") == 2
	})
}

// TestECMPSecondUplinkDeleted: the second uplink deleted from VPP is waited for (named in /readyz);
// once it is back, the routes through it are deleted and added again (VPP keeps them dead otherwise),
// and they come back with both paths, resolved.
func TestECMPSecondUplinkDeleted(t *testing.T) {
	c := newCluster(t, clusterOpts{twoUplinks: true, resync: 200 * time.Millisecond}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	b := c.nodes["b"]
	want := []string{fmt.Sprintf("10.244.2.0/26 via %s@1,%s@2", b.peerV4, b.peer2V4)}
	c.eventually("a", want, settle)
	sim := c.nodes["a"].sim
	if err := sim.DeleteInterface(uplink2Name); err != nil {
		t.Fatal(err)
	}
	c.waitFor("the agent says the second uplink is missing", 30*time.Second, func() bool {
		_, missing := c.nodes["a"].agent.Ready()
		return slices.Contains(missing, "waiting for uplink "+uplink2Name)
	})
	if _, err := sim.CreateInterface(uplink2Name); err != nil {
		t.Fatal(err)
	}
	c.waitFor("ready", 30*time.Second, func() bool { ok, _ := c.nodes["a"].agent.Ready(); return ok })
	c.eventually("a", want, 30*time.Second)
	c.waitFor("no route drops traffic", 30*time.Second, func() bool {
		return !slices.ContainsFunc(sim.APIRoutes(0), func(r vppsim.Route) bool { return r.Unresolved })
	})
}
