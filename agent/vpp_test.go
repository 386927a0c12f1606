package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
)

// TestVPPOwnRoutesInPool: VPP's recursive-resolution and adjacency /32s inside a managed pool are not the
// agent's, whether VPP can tell the route source (ip_route_v2_dump) or not (an older VPP): no drift
// repeats and no route of VPP's is deleted again and again.
func TestVPPOwnRoutesInPool(t *testing.T) {
	for _, tc := range []struct {
		name     string
		sim      func(*vppsim.Config)
		bySource bool
	}{
		{"route source", nil, true},
		{"no ip_route_v2_dump", func(c *vppsim.Config) {
			c.CRCOverrides = map[string]string{"ip_route_v2_dump": "deadbeef"}
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, clusterOpts{resync: 150 * time.Millisecond, sim: tc.sim}, "a", "b")
			c.putBlock("10.244.2.0/26", "b", nil)
			want := c.want(map[string]string{"10.244.2.0/26": "b"})
			c.eventually("a", want, settle)

			sim := c.nodes["a"].sim
			// Another client's route recursive via a pod of b's block: VPP adds 10.244.2.5/32 via b's peer on
			// the uplink. A neighbour resolved on the uplink inside the pool: an adjacency /32.
			rec := vppsim.Route{Prefix: netip.MustParsePrefix("10.99.0.0/24"),
				Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("10.244.2.5"), SwIfIndex: ^uint32(0)}}}
			if err := sim.AddRoute(rec); err != nil {
				t.Fatal(err)
			}
			if err := sim.ResolveNeighbor(1, netip.MustParseAddr("10.244.2.9")); err != nil {
				t.Fatal(err)
			}
			vppOwn := func() int {
				n := 0
				for _, r := range sim.Routes(0, false) {
					if r.Source == vppsim.SourceRR || r.Source == vppsim.SourceAdjacency {
						n++
					}
				}
				return n
			}
			resyncs := func() float64 {
				return c.metric("a", "vpp_route_agent_syncs_total", "kind", "periodic", "result", "ok")
			}
			afterResyncs := func(what string, n float64) {
				from := resyncs()
				c.waitFor(fmt.Sprintf("%v periodic resyncs %s", n, what), 30*time.Second, func() bool { return resyncs() >= from+n })
			}
			// Resyncs have seen VPP's /32s: with the route source, three of them; without it, the agent
			// tried deleting both and counted them undeletable.
			start := resyncs()
			c.waitFor("resyncs that saw VPP's own /32s", 30*time.Second, func() bool {
				if vppOwn() != 2 {
					return false
				}
				if tc.bySource {
					return resyncs() >= start+3
				}
				return c.metric("a", "vpp_route_agent_routes_undeletable_total") >= 2
			})
			afterResyncs("to finish the one under way", 1)
			if n := vppOwn(); n != 2 {
				t.Fatalf("VPP's own /32s: %d, want 2", n)
			}
			drift := c.metric("a", "vpp_route_agent_drift_corrections_total")
			deletes := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete")
			afterResyncs("after the baseline", 2)
			if d := c.metric("a", "vpp_route_agent_drift_corrections_total"); d != drift {
				t.Errorf("drift corrections went on: %v then %v", drift, d)
			}
			if d := c.metric("a", "vpp_route_agent_route_operations_total", "op", "delete"); d != deletes {
				t.Errorf("deletes went on: %v then %v", deletes, d)
			}
			undeletable := c.metric("a", "vpp_route_agent_routes_undeletable_total")
			logged := c.nodes["a"].logs.count("VPP kept a route the agent deleted")
			if tc.bySource {
				if drift != 0 || deletes != 0 || undeletable != 0 || logged != 0 {
					t.Errorf("with the route source: drift %v, deletes %v, undeletable %v, logged %d; want all 0",
						drift, deletes, undeletable, logged)
				}
			} else if undeletable != 2 || logged != 2 {
				t.Errorf("without the route source: undeletable %v, logged %d; want 2 each (once per route)", undeletable, logged)
			}
			c.eventually("a", want, settle)
			if got := c.debug("a").Foreign; !slices.Contains(got, netip.MustParsePrefix("10.244.2.5/32")) && !tc.bySource {
				t.Errorf("foreign_in_pools %v lacks the recursive-resolution /32", got)
			}
		})
	}
}

// TestUplinkAppearsLate: VPP answers before its startup-config created the uplink, after a start and
// after every restart. The agent waits, says so, counts no error, and programs the routes once it appears.
// The uplink appears only when the test has seen the wait.
func TestUplinkAppearsLate(t *testing.T) {
	c := newCluster(t, clusterOpts{sim: func(cfg *vppsim.Config) { cfg.InterfacesOnDemand = true }}, "a", "b")
	if err := c.nodes["b"].sim.CreateInterfaces(); err != nil { // only a's uplink is late
		t.Fatal(err)
	}
	c.putBlock("10.244.2.0/26", "b", nil)
	want := c.want(map[string]string{"10.244.2.0/26": "b"})
	for _, step := range []string{"start", "restart"} {
		if step == "restart" {
			if err := c.nodes["a"].sim.Restart(); err != nil {
				t.Fatal(err)
			}
		}
		c.waitFor(step+": waiting for the uplink", 30*time.Second, func() bool {
			_, missing := c.nodes["a"].agent.Ready()
			return slices.Contains(missing, "waiting for uplink "+uplinkName) &&
				c.metric("a", "vpp_route_agent_uplink_waiting") == 1
		})
		if err := c.nodes["a"].sim.CreateInterfaces(); err != nil {
			t.Fatal(err)
		}
		c.eventually("a", want, 30*time.Second)
		c.waitFor(step+": ready", 30*time.Second, func() bool { ok, _ := c.nodes["a"].agent.Ready(); return ok })
		if v := c.metric("a", "vpp_route_agent_uplink_waiting"); v != 0 {
			t.Errorf("%s: uplink_waiting %v after the uplink appeared", step, v)
		}
		if n := c.metric("a", "vpp_route_agent_syncs_total", "result", "error"); n != 0 {
			t.Errorf("%s: %v failed resyncs counted for the wait", step, n)
		}
	}
	if n := c.nodes["a"].logs.count("VPP has no uplink interface yet"); n != 2 {
		t.Errorf("the wait was logged %d times, want once per VPP start", n)
	}
}

// TestLongResyncKeepsHealth: a resync against a slow VPP keeps the reconcile loop from turning for
// seconds; /healthz (HealthyWithin) and the watchdog must stay fed meanwhile.
func TestLongResyncKeepsHealth(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	var blocks []netip.Prefix
	for i := range 8 {
		blocks = append(blocks, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(10 + i), 0}), 26))
		c.putBlock(blocks[i].String(), "b", nil)
	}
	c.waitFor("routes", settle, func() bool { return len(c.fib("a")) == 8 })
	want := c.fib("a")
	a := c.nodes["a"]
	// Some state is published first: from then on DebugRoutes answers at once with the last state the
	// loop published, which it does at least every 2 s while it turns (every second when idle) and
	// someone asks. A state older than 3 s shows a loop that did not turn for longer than the health
	// window.
	if _, err := a.agent.DebugRoutes(c.ctx()); err != nil {
		t.Fatal(err)
	}
	// Every route drifts behind the agent's back (no etcd event), VPP turns slow, and the relist's
	// resync repairs them in one turn of the loop: slow dumps, then eight slow writes.
	for _, b := range blocks {
		if err := a.sim.AddRoute(vppsim.Route{Prefix: b, Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.168.100.99"), SwIfIndex: 1}}}); err != nil {
			t.Fatal(err)
		}
	}
	a.sim.SetFaults(vppsim.Faults{ReplyDelay: 300 * time.Millisecond})
	defer a.sim.SetFaults(vppsim.Faults{})
	a.agent.Relist()
	const busy = 3 * time.Second
	var stalest time.Duration
	for deadline := time.Now().Add(15 * time.Second); time.Now().Before(deadline); {
		if !a.agent.HealthyWithin(time.Second) {
			t.Fatal("unhealthy while a resync was running")
		}
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		d, err := a.agent.DebugRoutes(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		age := time.Since(d.AsOf)
		if stalest >= busy && age < time.Second {
			break // the loop turns again: the resync is over
		}
		stalest = max(stalest, age)
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("the loop did not turn for %s", stalest.Round(time.Millisecond))
	if stalest < busy {
		t.Errorf("the loop published state at least every %s: it was never busy long enough to test its health", stalest)
	}
	a.sim.SetFaults(vppsim.Faults{})
	c.waitFor("drift repaired", settle, func() bool { return slices.Equal(c.fib("a"), want) })
}

// TestSlowVPPReconnectsKeepHealth: a VPP so slow (600 ms a request, against a reply timeout of 1 s) that
// the agent's health probes go unanswered and it reconnects again and again, each time setting up the
// uplink and dumping the table against the slow VPP. Throughout, sampled every 50 ms over three reconnect
// cycles, the reconcile loop counts as alive for /healthz and the watchdog within 1.5 s (the idle loop
// turns every second, so a window of 1 s is missed by scheduling jitter alone); meanwhile /readyz and
// vpp_connected say that VPP does not answer.
func TestSlowVPPReconnectsKeepHealth(t *testing.T) {
	const window = 1500 * time.Millisecond
	c := newCluster(t, clusterOpts{resync: 200 * time.Millisecond}, "a", "b")
	for i := range 8 {
		c.putBlock(netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(10 + i), 0}), 26).String(), "b", nil)
	}
	c.waitFor("routes", settle, func() bool { return len(c.fib("a")) == 8 })
	want := c.fib("a")
	a := c.nodes["a"]
	a.sim.SetFaults(vppsim.Faults{ReplyDelay: 600 * time.Millisecond})
	defer a.sim.SetFaults(vppsim.Faults{})
	reconnects := func() float64 { return c.metric("a", "vpp_route_agent_vpp_reconnects_total") }
	from := reconnects()
	const cycles = 3
	shown := false // /readyz and vpp_connected said VPP did not answer
	deadline := time.Now().Add(60 * time.Second)
	for ; reconnects() < from+cycles || !shown; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("after 60 s: %v reconnects, VPP shown as not answering: %v; want %d and true", reconnects()-from, shown, cycles)
		}
		if !a.agent.HealthyWithin(window) {
			t.Fatalf("the reconcile loop neither turned within %s nor was busy on VPP", window)
		}
		_, missing := a.agent.Ready()
		if slices.ContainsFunc(missing, func(m string) bool { return strings.HasPrefix(m, "VPP not connected: VPP not responding") }) &&
			c.metric("a", "vpp_route_agent_vpp_connected") == 0 {
			shown = true
		}
	}
	a.sim.SetFaults(vppsim.Faults{})
	c.waitFor("ready again", settle, func() bool { ok, _ := a.agent.Ready(); return ok })
	c.eventually("a", want, settle)
}

// TestStalledVPPShows: a VPP that stops answering is reported as not connected, with why.
func TestStalledVPPShows(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a")
	a := c.nodes["a"]
	c.waitFor("ready", settle, func() bool { ok, _ := a.agent.Ready(); return ok })
	a.sim.SetFaults(vppsim.Faults{NoReply: true, NoPingReply: true})
	c.waitFor("not connected", 10*time.Second, func() bool {
		_, missing := a.agent.Ready()
		return slices.ContainsFunc(missing, func(m string) bool { return strings.HasPrefix(m, "VPP not connected") }) &&
			c.metric("a", "vpp_route_agent_vpp_connected") == 0
	})
	a.sim.SetFaults(vppsim.Faults{})
	c.waitFor("ready again", settle, func() bool { ok, _ := a.agent.Ready(); return ok })
}

// TestUplinkDeletedNoticedByResync: a VPP without interface events (want_interface_events of another
// CRC) deletes the uplink; the periodic resync notices, the agent waits for it and says so, and once an
// interface of that name is back, with the same sw_if_index or another, every route is deleted and added
// again through it, so that none stays dead: those kept for a vanished peer's grace too.
func TestUplinkDeletedNoticedByResync(t *testing.T) {
	for _, tc := range []struct {
		name     string
		newIndex bool // another interface takes the freed index first
	}{{"same index", false}, {"new index", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c := newCluster(t, clusterOpts{resync: 200 * time.Millisecond, grace: time.Hour, sim: func(cfg *vppsim.Config) {
				cfg.CRCOverrides = map[string]string{"want_interface_events": "deadbeef"}
			}}, "a", "b")
			c.putBlock("10.244.2.0/26", "b", nil)
			c.putBlock("10.244.3.0/26", "b", nil)
			want := c.want(map[string]string{"10.244.2.0/26": "b", "10.244.3.0/26": "b"})
			c.eventually("a", want, settle)
			// b's registration is gone: its routes are kept for the peer-loss grace, through the uplink's
			// return too.
			c.stop("b")
			c.del(hosts + "b/peerip/ipv4/1")
			c.del(hosts + "b/peerip/ipv6/1")
			c.waitFor("b missing", 30*time.Second, func() bool { return len(c.debug("a").Missing) > 0 })
			sim := c.nodes["a"].sim
			if err := sim.DeleteInterface(uplinkName); err != nil {
				t.Fatal(err)
			}
			c.waitFor("the agent says the uplink is missing", 30*time.Second, func() bool {
				_, missing := c.nodes["a"].agent.Ready()
				return slices.Contains(missing, "waiting for uplink "+uplinkName) &&
					c.metric("a", "vpp_route_agent_uplink_waiting") == 1
			})
			if tc.newIndex {
				if _, err := sim.CreateInterface("loop9"); err != nil {
					t.Fatal(err)
				}
			}
			idx, err := sim.CreateInterface(uplinkName)
			if err != nil {
				t.Fatal(err)
			}
			if (idx != 1) != tc.newIndex {
				t.Fatalf("the uplink came back as sw_if_index %d", idx)
			}
			for i := range want {
				want[i] = strings.Replace(want[i], "@1", fmt.Sprintf("@%d", idx), 1)
			}
			c.waitFor("ready", 30*time.Second, func() bool { ok, _ := c.nodes["a"].agent.Ready(); return ok })
			c.eventually("a", want, 30*time.Second) // the dead routes were there all along with the same index
			for _, r := range sim.APIRoutes(0) {
				if r.Unresolved {
					t.Errorf("%s still drops traffic", r.Prefix)
				}
			}
			if n := c.nodes["a"].logs.count("the uplink interface is gone from VPP"); n != 1 {
				t.Errorf("the loss was logged %d times, want once", n)
			}
		})
	}
}
