package agent_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// apiRoutes returns node name's API routes in table 0 via the uplink, anywhere (c.fib shows only the
// test pools), as "prefix via nh" strings, sorted.
func (c *cluster) apiRoutes(name string) []string {
	var out []string
	for _, r := range c.nodes[name].sim.APIRoutes(0) {
		for _, p := range r.Paths {
			if p.SwIfIndex == 1 {
				out = append(out, fmt.Sprintf("%s via %s", r.Prefix, p.NextHop))
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestDefaultRouteNeverFromABlock: a /0 pool with a /0 block owned by node b would give every other
// node a default route via b. A block of prefix length 0 never becomes a route (it is unresolved, with
// the reason, logged and counted once); the blocks inside the /0 pool still get theirs.
func TestDefaultRouteNeverFromABlock(t *testing.T) {
	c := newCluster(t, clusterOpts{}, "a", "b")
	c.putPool("everything", netip.MustParsePrefix("0.0.0.0/0"), 26)
	zero := calico.BlockKey(netip.MustParsePrefix("0.0.0.0/0"))
	c.put(zero, `{"cidr":"0.0.0.0/0","affinity":"host:b","allocations":[],"unallocated":[],"attributes":[]}`)
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putBlock("172.20.0.0/26", "b", nil) // in the /0 pool only
	want := []string{"10.244.2.0/26 via 192.168.100.2", "172.20.0.0/26 via 192.168.100.2"}
	c.waitFor("a's routes", settle, func() bool { return slices.Equal(c.apiRoutes("a"), want) })
	// Rewriting the /0 block (a new snapshot, a periodic resync) changes nothing and counts nothing.
	c.put(zero, `{"cidr":"0.0.0.0/0","affinity":"host:b","allocations":[],"unallocated":[],"attributes":[],"sequenceNumber":2}`)
	c.putBlock("10.244.3.0/26", "b", nil)
	want = append(want, "10.244.3.0/26 via 192.168.100.2")
	slices.Sort(want)
	c.waitFor("a's routes after the rewrite", settle, func() bool { return slices.Equal(c.apiRoutes("a"), want) })
	if got := c.apiRoutes("a"); !slices.Equal(got, want) {
		t.Fatalf("a's routes %q, want %q", got, want)
	}
	d := c.debug("a")
	found := false
	for _, u := range d.Unresolved {
		if u.Prefix == netip.MustParsePrefix("0.0.0.0/0") && u.Owner == "b" {
			found = true
		}
	}
	if !found {
		t.Errorf("the /0 block is not listed as unresolved: %+v", d.Unresolved)
	}
	if n := c.metric("a", "vpp_route_agent_default_route_blocks_total"); n != 1 {
		t.Errorf("default-route blocks counted %v times, want once", n)
	}
	if n := c.nodes["a"].logs.count("ignoring a block of prefix length 0"); n != 1 {
		t.Errorf("logged %d times, want once", n)
	}
}

// TestRoutesOfADeletedPoolAreWithdrawn: the routes the agent programmed in a pool are withdrawn when the
// pool is deleted, before or after its blocks; a pool that is only disabled keeps its routes as they
// are (the migration limit in docs/limitations.md).
func TestRoutesOfADeletedPoolAreWithdrawn(t *testing.T) {
	extra := netip.MustParsePrefix("10.96.0.0/16")
	c := newCluster(t, clusterOpts{}, "a", "b")
	base := []string{"10.244.2.0/26 via 192.168.100.2"}
	c.putBlock("10.244.2.0/26", "b", nil)
	c.putPool("extra", extra, 26)
	c.putBlock("10.96.1.0/26", "b", nil)
	c.putBlock("10.96.2.0/26", "a", map[int]string{5: "b"}) // a borrowed address
	withExtra := append(slices.Clone(base), "10.96.1.0/26 via 192.168.100.2", "10.96.2.5/32 via 192.168.100.2")
	slices.Sort(withExtra)
	c.waitFor("a's routes in both pools", settle, func() bool { return slices.Equal(c.apiRoutes("a"), withExtra) })
	c.waitFor("b's borrowed route", settle, func() bool { return slices.Contains(c.apiRoutes("b"), "10.96.2.0/26 via 192.168.100.1") })

	// Disabled: the routes stay.
	if err := putPoolDisabled(c, "extra", extra); err != nil {
		t.Fatal(err)
	}
	c.putBlock("10.244.3.0/26", "b", nil) // a marker: a has seen the disabled pool once it has this route
	withMarker := append(slices.Clone(withExtra), "10.244.3.0/26 via 192.168.100.2")
	slices.Sort(withMarker)
	c.waitFor("the marker route", settle, func() bool { return slices.Contains(c.apiRoutes("a"), "10.244.3.0/26 via 192.168.100.2") })
	if got := c.apiRoutes("a"); !slices.Equal(got, withMarker) {
		t.Fatalf("a's routes with the pool disabled %q, want %q", got, withMarker)
	}

	// Deleted, its blocks still there: withdrawn on every node.
	c.del(calico.IPPoolKey("extra"))
	base = append(base, "10.244.3.0/26 via 192.168.100.2")
	c.waitFor("a's routes of the deleted pool withdrawn", settle, func() bool {
		return slices.Equal(c.apiRoutes("a"), base)
	})
	c.waitFor("b's routes of the deleted pool withdrawn", settle, func() bool {
		return !slices.ContainsFunc(c.apiRoutes("b"), func(r string) bool {
			return extra.Contains(netip.MustParsePrefix(strings.Fields(r)[0]).Addr())
		})
	})
}

// putPoolDisabled writes pool name as disabled.
func putPoolDisabled(c *cluster, name string, cidr netip.Prefix) error {
	v, err := calico.EncodeIPPool(calico.IPPool{Name: name, CIDR: cidr, BlockSize: 26, Disabled: true})
	if err != nil {
		return err
	}
	c.put(calico.IPPoolKey(name), string(v))
	return nil
}

// TestEtcdOutOfSpaceIsNotReady: etcd out of space (NOSPACE) still answers the watch, but refuses every
// write, the registration's among them: the agent says not ready, naming it, and keeps its routes;
// once the alarm is disarmed it is ready again.
func TestEtcdOutOfSpaceIsNotReady(t *testing.T) {
	c := newCluster(t, clusterOpts{quota: 2 << 20}, "a", "b")
	c.putBlock("10.244.2.0/26", "b", nil)
	want := c.want(map[string]string{"10.244.2.0/26": "b"})
	c.eventually("a", want, settle)
	c.waitFor("a ready", settle, func() bool { ok, _ := c.nodes["a"].agent.Ready(); return ok })
	if err := etcdtest.Fill(c.ctx(), c.cli); err != nil {
		t.Fatal(err)
	}
	c.waitFor("a not ready naming NOSPACE", settle, func() bool {
		_, missing := c.nodes["a"].agent.Ready()
		return slices.ContainsFunc(missing, func(m string) bool { return strings.Contains(m, "out of space (alarm NOSPACE)") })
	})
	if got := c.fib("a"); !slices.Equal(got, want) {
		t.Errorf("FIB with etcd out of space %q, want %q", got, want)
	}
	if _, err := c.cli.Delete(c.ctx(), "/fill/", clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := c.cli.AlarmDisarm(c.ctx(), &clientv3.AlarmMember{}); err != nil {
		t.Fatal(err)
	}
	c.waitFor("a ready again", settle, func() bool { ok, _ := c.nodes["a"].agent.Ready(); return ok })
}
