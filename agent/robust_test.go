package agent_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// debugUntil polls node name's /debug/routes document until cond holds.
func (c *cluster) debugUntil(name, what string, cond func(d agent.Debug) bool) agent.Debug {
	c.t.Helper()
	deadline := time.Now().Add(settle)
	for {
		d, err := c.nodes[name].agent.DebugRoutes(c.ctx())
		if err != nil {
			c.t.Fatal(err)
		}
		if cond(d) {
			return d
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %s: not %s within %s: %+v", name, what, settle, d)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUnreadableBlockIsHeldAcrossRestarts: a block whose value turns unreadable while node a's agent is
// down is not in etcd's readable view when a starts; its key names the CIDR, so a keeps the block's
// route and the borrowed /32 inside it, lists the block as held with the reason, and lets a readable
// value decide again later, including about the routes that value no longer mentions.
func TestUnreadableBlockIsHeldAcrossRestarts(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 300 * time.Millisecond}, "a", "b", "c")
	c.putBlock("10.244.2.0/26", "b", map[int]string{5: "c"})
	want := c.want(map[string]string{"10.244.2.0/26": "b", "10.244.2.5/32": "c"})
	c.eventually("a", want, settle)
	if v := c.metric("a", "vpp_route_agent_blocks_held"); v != 0 {
		t.Errorf("blocks_held = %v with every block readable", v)
	}

	c.stop("a")
	key := calico.BlockKey(netip.MustParsePrefix("10.244.2.0/26"))
	c.put(key, `{"cidr":"10.244.2.0/26","affinity":`)
	c.start("a")
	d := c.debugUntil("a", "holding the block", func(d agent.Debug) bool { return len(d.Held) == 1 })
	if d.Held[0].Block != netip.MustParsePrefix("10.244.2.0/26") || d.Held[0].LastGood || !strings.Contains(d.Held[0].Reason, "JSON") {
		t.Errorf("held: %+v", d.Held)
	}
	c.metricUntil("a", "vpp_route_agent_blocks_held", 1)
	waitResynced(t, c, "a")
	time.Sleep(time.Second) // several periodic resyncs
	if got := c.fib("a"); !slices.Equal(got, want) {
		t.Fatalf("a restarted agent withdrew routes of an unreadable block:\n got %q\nwant %q", got, want)
	}

	// A readable value decides again: the block moved to c, whose pod address is now its own.
	c.putBlock("10.244.2.0/26", "c", map[int]string{5: "c"})
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "c"}), settle)
	c.debugUntil("a", "releasing the block", func(d agent.Debug) bool { return len(d.Held) == 0 })
	c.metricUntil("a", "vpp_route_agent_blocks_held", 0)
}

// metricUntil waits until node name's metric (all its series summed) has the value want.
func (c *cluster) metricUntil(name, metric string, want float64) {
	c.t.Helper()
	deadline := time.Now().Add(settle)
	for {
		v := c.metric(name, metric)
		if v == want {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %s: %s = %v after %s, want %v", name, metric, v, settle, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func waitResynced(t *testing.T, c *cluster, name string) {
	t.Helper()
	waitUntil(t, "resynced", settle, c.nodes[name].agent.Resynced)
}

// TestInvalidPeerIPsAreRefused: peer IPs that cannot be next hops — loopback, link-local, the limited
// broadcast, the network address of a's uplink subnet, a's own address, an address another node
// registered first — are refused, listed with the node and the reason, and the routes to those nodes
// handled like an unregistered peer's; a valid registration still routes.
func TestInvalidPeerIPsAreRefused(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	a, b := c.nodes["a"], c.nodes["b"]
	// "dup" registers b's address after b (the first registration wins), "self" a's after a.
	waitUntil(t, "a and b ready", settle, func() bool {
		ra, _ := a.agent.Ready()
		rb, _ := b.agent.Ready()
		return ra && rb
	})
	if v := c.metric("a", "vpp_route_agent_peers_invalid"); v != 0 {
		t.Errorf("peers_invalid = %v with only valid peers", v)
	}
	bad := map[string]string{
		"lo":    "127.0.0.1",
		"ll":    "169.254.10.1",
		"bcast": "255.255.255.255",
		"net":   netip.PrefixFrom(a.peerV4, 24).Masked().Addr().String(),
		"self":  a.peerV4.String(),
		"dup":   b.peerV4.String(), // registered after b
	}
	blocks := map[string]string{}
	i := 10
	for n, ip := range bad {
		c.put(hosts+n+"/peerip/ipv4/1", ip)
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 26).String()
		c.putBlock(cidr, n, nil)
		blocks[n] = cidr
		i++
	}
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), settle)
	d := c.debugUntil("a", "refusing every bad peer IP", func(d agent.Debug) bool { return len(d.InvalidPeers) == len(bad) })
	for _, p := range d.InvalidPeers {
		if p.Addr.String() != bad[p.Node] || p.Reason == "" {
			t.Errorf("invalid peer %+v", p)
		}
	}
	for n, cidr := range blocks {
		found := false
		for _, u := range d.Unresolved {
			if u.Prefix.String() == cidr && strings.Contains(u.Reason, "refused") && strings.Contains(u.Reason, bad[n]) {
				found = true
			}
		}
		if !found {
			t.Errorf("block %s of node %s (%s) is not unresolved as refused: %+v", cidr, n, bad[n], d.Unresolved)
		}
	}
	if got := c.fib("a"); len(got) != 1 {
		t.Errorf("routes via refused peers: %q", got)
	}
	c.metricUntil("a", "vpp_route_agent_peers_invalid", float64(len(bad)))
	// A peer that turns valid is routed.
	c.put(hosts+"lo/peerip/ipv4/1", "192.168.100.77")
	want := []string{"10.244.2.0/26 via " + b.peerV4.String() + "@1", blocks["lo"] + " via 192.168.100.77@1"}
	slices.Sort(want)
	c.eventually("a", want, settle)
	c.metricUntil("a", "vpp_route_agent_peers_invalid", float64(len(bad)-1))
}
