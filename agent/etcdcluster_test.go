package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// routeWrites counts the FIB writes node name's agent made (adds, which include replaces, and deletes).
func (c *cluster) routeWrites(name string) (adds, deletes float64) {
	return c.metric(name, "vpp_route_agent_route_operations_total", "op", "add"),
		c.metric(name, "vpp_route_agent_route_operations_total", "op", "delete")
}

// putBlockRetry writes a block, retrying while etcd has no leader.
func (c *cluster) putBlockRetry(cidr, owner string) {
	c.t.Helper()
	b := calico.NewBlock(netip.MustParsePrefix(cidr), "host:"+owner, 1)
	v, err := calico.EncodeBlock(b)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx := c.ctx()
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := c.cli.Put(rctx, calico.BlockKey(b.CIDR), string(v))
		cancel()
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			c.t.Fatalf("put %s: %v", cidr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestNameConflictChangesNoRoute: a second agent started with node b's name (a copied configuration)
// and its own peer IP. On node a no route changes while both run: the second agent registers nothing
// and says why. When b stops for good (its lease expires) the second agent takes over and a's route
// changes exactly once. VPP_ROUTE_AGENT_CONFLICT_SECONDS lengthens the conflict (docs/performance.md's figure
// uses 20).
func TestNameConflictChangesNoRoute(t *testing.T) {
	window := 2 * time.Second
	if s, err := strconv.Atoi(os.Getenv("VPP_ROUTE_AGENT_CONFLICT_SECONDS")); err == nil && s > 0 {
		window = time.Duration(s) * time.Second
	}
	// The grace (the daemon's default is 60s) covers the moment between b's lease expiring and b2
	// registering, as it covers any agent restart.
	c := newCluster(t, clusterOpts{resync: time.Second, grace: 5 * time.Second}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), settle)
	waitUntil(t, "b ready", settle, func() bool { ok, _ := c.nodes["b"].agent.Ready(); return ok })

	c.addNodeAs("b2", "b")
	waitUntil(t, "the conflict reported", settle, func() bool {
		_, missing := c.nodes["b2"].agent.Ready()
		return slices.ContainsFunc(missing, func(m string) bool { return strings.Contains(m, "registered by another agent") })
	})
	if v := c.metric("b2", "vpp_route_agent_registration_conflict"); v != 1 {
		t.Errorf("conflict gauge %v", v)
	}
	adds0, dels0 := c.routeWrites("a")
	time.Sleep(window)
	adds1, dels1 := c.routeWrites("a")
	t.Logf("FIGURE: route writes on another node during a %s name conflict: %v adds/replaces, %v deletes", window, adds1-adds0, dels1-dels0)
	if adds1 != adds0 || dels1 != dels0 {
		t.Errorf("node a changed routes during the conflict: %v adds, %v deletes", adds1-adds0, dels1-dels0)
	}
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b"}), time.Second)

	// b stops for good: its lease (5s) runs out, b2 takes over, a's route changes once.
	c.stop("b")
	c.eventually("a", c.want(map[string]string{"10.244.2.0/26": "b2"}), settle)
	// Two periodic resyncs after the change: a second write, if any, would have been made by then.
	resyncs := func() float64 {
		return c.metric("a", "vpp_route_agent_syncs_total", "kind", "periodic", "result", "ok")
	}
	from := resyncs()
	waitUntil(t, "two periodic resyncs after the takeover", 30*time.Second, func() bool { return resyncs() >= from+2 })
	adds2, dels2 := c.routeWrites("a")
	if adds2-adds1 != 1 || dels2 != dels1 {
		t.Errorf("takeover: %v adds, %v deletes on node a, want one replace", adds2-adds1, dels2-dels1)
	}
}

// TestEtcdClusterFaults runs the agents against a real 3-member etcd cluster and kills the leader,
// freezes each member in turn (its client port stops answering, connections stay open) and takes
// quorum away: every write made meanwhile reaches the FIB, and nothing is ever withdrawn.
func TestEtcdClusterFaults(t *testing.T) {
	t0 := time.Now()
	phase := func(what string) { t.Logf("+%s %s", time.Since(t0).Round(time.Millisecond), what) }
	defer phase("done")
	c := newCluster(t, clusterOpts{members: 3, resync: 500 * time.Millisecond, probe: -1}, "a", "b")
	phase("cluster up")
	routes := map[string]string{"10.244.2.0/26": "b"}
	c.putBlockRetry("10.244.2.0/26", "b")
	c.eventually("a", c.want(routes), settle)
	ctx := c.ctx()

	// Leader kill.
	leader, err := c.ecl.WaitLeader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.ecl.Kill(leader)
	phase("leader killed")
	start := time.Now()
	c.putBlockRetry("10.244.3.0/26", "b")
	routes["10.244.3.0/26"] = "b"
	c.eventually("a", c.want(routes), settle)
	t.Logf("leader m%d killed: a write reached node a's FIB %s later", leader, time.Since(start).Round(time.Millisecond))
	if err := c.ecl.Restart(leader); err != nil {
		t.Fatal(err)
	}
	phase("leader back")

	// Member freeze: the agents' connections to the member stay open but nothing comes back. The
	// agents run with the daemon's settings (progress probe 2s, etcdconfig's guard).
	for i, p := range c.ecl.Proxies {
		relists := c.metric("a", "vpp_route_agent_etcd_relists_total")
		p.Freeze()
		start := time.Now()
		cidr := fmt.Sprintf("10.244.%d.0/26", 10+i)
		c.putBlockRetry(cidr, "b")
		routes[cidr] = "b"
		c.eventually("a", c.want(routes), settle)
		moved := "the watch was on another member"
		if c.metric("a", "vpp_route_agent_etcd_relists_total") > relists {
			moved = "the watch noticed and moved to another member"
		}
		t.Logf("FIGURE: member m%d frozen: a write reached node a's FIB %s later (%s)", i, time.Since(start).Round(time.Millisecond), moved)
		p.Thaw()
	}
	if _, dels := c.routeWrites("a"); dels != 0 {
		t.Errorf("%v routes withdrawn", dels)
	}

	phase("freezes done")
	// Quorum loss: two of three members down. Nothing is withdrawn, readiness says why.
	want := c.want(routes)
	down := []int{(leader + 1) % 3, (leader + 2) % 3}
	for _, i := range down {
		c.ecl.Kill(i)
		phase("member killed")
	}
	waitUntil(t, "a not ready", 3*settle, func() bool {
		_, missing := c.nodes["a"].agent.Ready()
		return slices.Contains(missing, "etcd watch not in sync")
	})
	phase("quorum lost, noticed")
	time.Sleep(2 * time.Second) // resyncs every 500ms meanwhile
	if got := c.fib("a"); !slices.Equal(got, want) {
		t.Errorf("FIB changed without quorum:\n got %q\nwant %q", got, want)
	}
	// Each restart waits for the other to form a quorum: they run side by side, and the test owns them
	// (the cleanup waits for them before the cluster is torn down) and fails on their errors.
	restarts := make(chan error, len(down))
	var restarting sync.WaitGroup
	t.Cleanup(restarting.Wait)
	for _, i := range down {
		restarting.Add(1)
		go func() {
			defer restarting.Done()
			if err := c.ecl.Restart(i); err != nil {
				restarts <- fmt.Errorf("restart m%d: %w", i, err)
				return
			}
			restarts <- nil
		}()
	}
	c.putBlockRetry("10.244.4.0/26", "b")
	for range down {
		if err := <-restarts; err != nil {
			t.Fatal(err)
		}
	}
	phase("quorum back")
	routes["10.244.4.0/26"] = "b"
	// The watch relists with a backoff that grew while quorum was lost (up to 5s): allow for it.
	c.eventually("a", c.want(routes), 3*settle)
	if _, dels := c.routeWrites("a"); dels != 0 {
		t.Errorf("%v routes withdrawn", dels)
	}
}
