package agent_test

import (
	"net/netip"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"go.fd.io/govpp/binapi/ip"
)

// settle bounds every wait for convergence: generous, as the tests run with -race on a loaded
// 2-core machine; a passing test does not wait longer for it.
const settle = 30 * time.Second

func TestTwoNodesBlocksAppearMoveAndVanish(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putBlock("10.244.1.0/26", "a", nil)
	c.putBlock("10.244.2.0/26", "b", map[int]string{3: "b", 4: "a"}) // ordinal 4 borrowed by a
	c.putBlock("fd00:10:244::40/122", "b", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b", "fd00:10:244::40/122": "b"}), settle)
	c.eventually("b", c.want(map[string]string{"10.244.1.0/26": "a", "10.244.2.4/32": "a"}), settle)

	// The block moves from b to a: a drops its route (own block now), b gets one (replace, not delete+add).
	c.putBlock("10.244.2.0/26", "a", map[int]string{3: "b"})
	c.eventually("a", c.want(map[string]string{"10.244.2.3/32": "b", "fd00:10:244::40/122": "b"}), settle)
	c.eventually("b", c.want(map[string]string{"10.244.1.0/26": "a", "10.244.2.0/26": "a"}), settle)

	// Blocks vanish.
	c.del(calico.BlockKey(netip.MustParsePrefix("10.244.2.0/26")))
	c.del(calico.BlockKey(netip.MustParsePrefix("fd00:10:244::40/122")))
	c.eventually("a", nil, settle)
	c.eventually("b", c.want(map[string]string{"10.244.1.0/26": "a"}), settle)
}

func TestThreeNodesHostRegistersLate(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	// Node c's blocks appear before c exists: unresolved everywhere.
	c.putBlock("10.244.3.0/26", "c", nil)
	c.putBlock("fd00:10:244::c0/122", "c", nil)
	c.putBlock("10.244.1.0/26", "a", map[int]string{9: "c"})
	c.eventually("b", c.want(map[string]string{"10.244.1.0/26": "a"}), settle)
	c.eventually("a", nil, settle)

	c.addNode("c")
	want := map[string]string{"10.244.3.0/26": "c", "fd00:10:244::c0/122": "c"}
	c.eventually("a", c.want(merge(want, map[string]string{"10.244.1.9/32": "c"})), settle)
	c.eventually("b", c.want(merge(want, map[string]string{"10.244.1.0/26": "a", "10.244.1.9/32": "c"})), settle)
	c.eventually("c", c.want(map[string]string{"10.244.1.0/26": "a"}), settle)
	c.converged(settle)
}

func TestBlockDeletedWhileAgentDownIsWithdrawnAtStart(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.4.0/26", "b", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b", "10.244.4.0/26": "b"}), settle)
	c.stop("a")
	c.del(calico.BlockKey(netip.MustParsePrefix("10.244.2.0/26")))
	c.putBlock("10.244.5.0/26", "b", nil)
	c.start("a")
	c.eventually("a", c.want(map[string]string{"10.244.4.0/26": "b", "10.244.5.0/26": "b"}), settle)
}

func TestForeignRoutesAreNeverTouched(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 300 * time.Millisecond}, "a", "b")
	sim := c.nodes["a"].sim
	outside := vppsim.Route{Prefix: netip.MustParsePrefix("172.16.9.0/24"), Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.168.100.77"), SwIfIndex: 1}}}
	// Inside a pool but via another next-hop interface (local0 cannot carry routes; use a drop path).
	inside := vppsim.Route{Prefix: netip.MustParsePrefix("10.244.200.0/24"), Paths: []vppsim.Path{{Type: "drop"}}}
	for _, r := range []vppsim.Route{outside, inside} {
		if err := sim.AddRoute(r); err != nil {
			t.Fatal(err)
		}
	}
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventually("a", append(c.want(map[string]string{"10.244.2.0/26": "b"}), "10.244.200.0/24 via invalid IP@4294967295"), settle)
	time.Sleep(time.Second) // several periodic resyncs
	have := map[netip.Prefix]bool{}
	for _, r := range sim.APIRoutes(0) {
		have[r.Prefix] = true
	}
	if !have[outside.Prefix] || !have[inside.Prefix] {
		t.Fatalf("a foreign route was removed: %v", have)
	}
}

func TestVPPRestartRestoresRoutes(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", map[int]string{1: "a"})
	c.putBlock("fd00:10:244::40/122", "b", nil)
	want := c.want(map[string]string{"10.244.2.0/26": "b", "fd00:10:244::40/122": "b"})
	c.eventually("a", want, settle)
	if err := c.nodes["a"].sim.Restart(); err != nil {
		t.Fatal(err)
	}
	c.eventually("a", want, settle)
	// The uplink came back configured too.
	for _, ifc := range c.nodes["a"].sim.Interfaces() {
		if ifc.Name == uplinkName && (!ifc.AdminUp || len(ifc.Addresses) != 2) {
			t.Errorf("uplink after VPP restart: %+v", ifc)
		}
	}
}

func TestEtcdDownKeepsFIBThenConverges(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 500 * time.Millisecond}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "b", nil)
	want := c.want(map[string]string{"10.244.2.0/26": "b", "10.244.3.0/26": "b"})
	c.eventually("a", want, settle)
	c.etcd.Stop()
	deadline := time.Now().Add(3 * time.Second) // several periodic resyncs while etcd is down
	for time.Now().Before(deadline) {
		if got := c.fib("a"); len(got) != 2 {
			t.Fatalf("FIB changed while etcd was down: %q", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if ok, missing := c.nodes["a"].agent.Ready(); ok {
		t.Error("agent reports ready while etcd is down")
	} else {
		t.Logf("not ready while etcd is down: %v", missing)
	}
	if err := c.etcd.Start(); err != nil {
		t.Fatal(err)
	}
	c.del(calico.BlockKey(netip.MustParsePrefix("10.244.3.0/26")))
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), 20*time.Second)
}

func TestMalformedValuesWithdrawNothing(t *testing.T) {
	c := newCluster(t, clusterOpts{resync: 300 * time.Millisecond}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "b", nil)
	want := c.want(map[string]string{"10.244.2.0/26": "b", "10.244.3.0/26": "b"})
	c.eventually("a", want, settle)
	// A burst of garbage: a good block overwritten with bad JSON, foreign keys, bad peer IPs.
	c.put(calico.BlockKey(netip.MustParsePrefix("10.244.2.0/26")), `{"cidr":`)
	c.put(calico.BlockPrefix+"ipv4/block/not-a-cidr", `{}`)
	c.put(calico.BlockPrefix+"ipv4/block/10.244.9.0-26", `{"cidr":"10.244.77.0/26","allocations":[]}`)
	c.put(hosts+"b/peerip/ipv4/1", "not-an-ip")
	c.put(hosts+"z/peerip/ipv4/1", "fd00::1")
	for i := 0; i < 50; i++ {
		c.put(calico.BlockPrefix+"ipv6/block/garbage", "\x00\x01")
	}
	time.Sleep(1500 * time.Millisecond) // periodic resyncs run meanwhile
	if got := c.fib("a"); len(got) != 2 {
		t.Fatalf("malformed values withdrew routes: %q", got)
	}
	c.eventually("a", want, settle)
}

func TestPeerLossGraceThenWithdraw(t *testing.T) {
	c := newCluster(t, clusterOpts{grace: 1500 * time.Millisecond}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), settle)
	// b's agent stops normally: its registration outlives it, so a keeps the route.
	c.stop("b")
	time.Sleep(500 * time.Millisecond)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), time.Second)
	// Registration removed (decommissioned node): kept for the grace period, then withdrawn.
	c.del(hosts + "b/peerip/ipv4/1")
	c.del(hosts + "b/peerip/ipv6/1")
	start := time.Now()
	time.Sleep(700 * time.Millisecond)
	if got := c.fib("a"); len(got) != 1 {
		t.Fatalf("route withdrawn within the grace period: %q", got)
	}
	c.eventually("a", nil, settle)
	if took := time.Since(start); took < 1400*time.Millisecond {
		t.Errorf("withdrawn after %s, before the 1.5s grace", took)
	}
}

func TestExplicitPoolsAndReadiness(t *testing.T) {
	c := newCluster(t, clusterOpts{pools: []netip.Prefix{netip.MustParsePrefix("10.244.2.0/24")}}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("10.244.3.0/26", "b", nil) // outside --pool-cidr: not routed
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), settle)
	deadline := time.Now().Add(settle)
	for {
		ok, missing := c.nodes["a"].agent.Ready()
		if ok {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("not ready: %v", missing)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// The out-of-pool block changes nothing in the FIB, so the FIB check above does not prove the agent
	// has seen it yet: wait for its view to include both blocks.
	ctx := c.ctx()
	var d agent.Debug
	for {
		var err error
		if d, err = c.nodes["a"].agent.DebugRoutes(ctx); err != nil {
			t.Fatal(err)
		}
		if len(d.Desired)+len(d.Unresolved) >= 2 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if len(d.Desired) != 1 || len(d.Programmed) != 1 || len(d.Unresolved) != 1 || d.Unresolved[0].Reason != "block is outside the managed pools" {
		t.Errorf("debug routes: %+v", d)
	}
}

func (c *cluster) addNode(name string) { c.addNodeAs(name, "") }

// addNodeAs adds a node with its own VPP and peer IPs whose agent runs as node name as ("": name).
func (c *cluster) addNodeAs(name, as string) {
	c.t.Helper()
	i := len(c.nodes) + 1
	n := &node{name: name, index: i, as: as,
		peerV4: netip.AddrFrom4([4]byte{192, 168, 100, byte(i)}),
		peerV6: netip.MustParseAddr("fd00:100::" + string(rune('0'+i))),
		sock:   c.dir + "/" + name + ".sock"}
	sim, err := vppsim.New(vppsim.Config{Interfaces: []string{uplinkName}})
	if err != nil {
		c.t.Fatal(err)
	}
	if err := sim.Listen(n.sock); err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { sim.Close() })
	n.sim = sim
	c.nodes[name] = n
	c.start(name)
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// TestOwnerChangeIsOneReplace moves a block from b to c and checks on node a that the route changed
// next hop through a single add (replace), with no delete of the prefix in between.
func TestOwnerChangeIsOneReplace(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b", "c")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), settle)
	sim := c.nodes["a"].sim
	sim.ResetRequests()
	c.putBlock("10.244.2.0/26", "c", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "c"}), settle)
	adds, dels := 0, 0
	for _, r := range sim.Requests() {
		m, ok := r.Msg.(*ip.IPRouteAddDel)
		if !ok || m.Route.Prefix.String() != "10.244.2.0/26" {
			continue
		}
		if m.IsAdd {
			adds++
			if m.IsMultipath {
				t.Error("the replace was sent as a multipath add")
			}
		} else {
			dels++
		}
	}
	if adds != 1 || dels != 0 {
		t.Errorf("owner change sent %d adds and %d deletes for the prefix, want 1 add (replace) and no delete", adds, dels)
	}
}
