package ipamd

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// putCapacityFixture writes one pool (10.0.0.0/24, blocks of /26), a block of node "a" with three
// addresses (one borrowed by "b"), a block of node "gone" with two, a reservation of a whole block,
// maxBlocksPerHost 3, a liveness key for "a" and a route agent registration for "b".
func putCapacityFixture(t *testing.T, c *clientv3.Client) {
	t.Helper()
	put := func(k string, v []byte, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Put(t.Context(), k, string(v)); err != nil {
			t.Fatal(err)
		}
	}
	pool := calico.IPPool{Name: "p4", CIDR: netip.MustParsePrefix("10.0.0.0/24"), BlockSize: 26}
	v, err := calico.EncodeIPPool(pool)
	put(calico.IPPoolKey("p4"), v, err)
	v, err = calico.EncodeIPAMConfig(calico.IPAMConfig{AutoAllocateBlocks: true, MaxBlocksPerHost: 3})
	put(calico.IPAMConfigKey, v, err)
	block := func(cidr, node string, owners ...string) {
		b := calico.NewBlock(netip.MustParsePrefix(cidr), "host:"+node, 1)
		for i, o := range owners {
			h := "h-" + o
			if err := b.Assign(i, calico.AllocationAttribute{HandleID: &h, Secondary: map[string]string{calico.AttrNode: o}}); err != nil {
				t.Fatal(err)
			}
		}
		v, err := calico.EncodeBlock(b)
		put(calico.BlockKey(b.CIDR), v, err)
		put(calico.HostAffinityKey(node, b.CIDR), []byte(`{"state":"confirmed","deleted":false}`), nil)
	}
	block("10.0.0.0/26", "a", "a", "a", "b")
	block("10.0.0.64/26", "gone", "gone", "gone")
	put(calico.IPReservationKey("r"), []byte(`{"kind":"IPReservation","spec":{"reservedCIDRs":["10.0.0.128/26"]}}`), nil)
	put(calico.IPPoolKey("broken"), []byte(`{not json`), nil)
	put(AliveKey("a"), []byte("1"), nil)
	put(DefaultHostsPrefix+"b/peerip/ipv4/1", []byte("192.0.2.2"), nil)
}

// TestCapacityGauges reads the fixture as the leader and as another daemon: the leader exports
// every pool figure, the dead node's addresses and the node's own gauges; another daemon only its
// node's gauges, none of the cluster's series.
func TestCapacityGauges(t *testing.T) {
	_, cli := etcdtest.Start(t)
	putCapacityFixture(t, cli)
	for _, leader := range []bool{true, false} {
		reg := prometheus.NewRegistry()
		c := NewCapacity(CapacityConfig{Client: cli, Node: "a", Leader: func() bool { return leader }}, reg)
		if err := c.Refresh(t.Context(), leader); err != nil {
			t.Fatal(err)
		}
		pool := []string{"pool", "p4", "family", "ipv4"}
		want := map[string]float64{
			"block_ipam_node_blocks":              1,
			"block_ipam_node_allocated_addresses": 3,
			"block_ipam_node_free_addresses":      61,
			"block_ipam_node_block_limit":         3,
			"block_ipam_auto_allocate_blocks":     1,
			"block_ipam_capacity_skipped_values":  1, // the broken pool
			"block_ipam_capacity_exporter":        b2f(leader),
		}
		cluster := map[string]float64{
			"block_ipam_pool_addresses":            256,
			"block_ipam_pool_block_addresses":      128,
			"block_ipam_pool_allocated_addresses":  5,
			"block_ipam_pool_free_block_addresses": 123,
			"block_ipam_pool_reserved_addresses":   64,
			"block_ipam_pool_blocks":               2,
			"block_ipam_pool_claimable_blocks":     1,
			"block_ipam_pool_borrowed_addresses":   1,
			"block_ipam_pool_dead_node_addresses":  2,
			"block_ipam_dead_nodes":                1,
		}
		for name, v := range cluster {
			if !leader {
				v = 0
			}
			want[name] = v
		}
		for name, v := range want {
			var labels []string
			if strings.HasPrefix(name, "block_ipam_node_") && name != "block_ipam_node_block_limit" {
				labels = append([]string{"node", "a"}, pool...)
			} else if strings.HasPrefix(name, "block_ipam_pool_") {
				labels = pool
			}
			if got := metricstest.Value(t, reg, name, labels...); got != v {
				t.Errorf("leader %v: %s%v = %v, want %v", leader, name, labels, got, v)
			}
		}
		if !leader {
			mfs, _ := reg.Gather()
			for _, mf := range mfs {
				if strings.HasPrefix(mf.GetName(), "block_ipam_pool_") || mf.GetName() == "block_ipam_dead_nodes" {
					t.Errorf("a daemon that does not lead exports %s", mf.GetName())
				}
			}
		}
	}
}

// daemonUnderTest is one daemon's liveness and capacity gauges, on its own etcd client.
type daemonUnderTest struct {
	live   *Liveness
	reg    *prometheus.Registry
	cancel context.CancelFunc
	done   chan struct{}
}

func startDaemon(t *testing.T, endpoint, node string, ttl time.Duration) *daemonUnderTest {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	live, err := NewLiveness(LivenessConfig{Client: cli, Node: node, TTL: ttl, CallTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	d := &daemonUnderTest{live: live, reg: prometheus.NewRegistry(), done: make(chan struct{})}
	c := NewCapacity(CapacityConfig{Client: cli, Node: node, Leader: live.Leader, CallTimeout: time.Second}, d.reg)
	ctx, cancel := context.WithCancel(context.Background())
	d.cancel = cancel
	go func() {
		defer close(d.done)
		done := make(chan struct{})
		go func() { defer close(done); c.Run(ctx) }()
		live.Run(ctx)
		<-done
	}()
	t.Cleanup(func() {
		cancel()
		<-d.done
		cli.Close()
	})
	return d
}

// exporting reports whether the daemon exports the cluster's gauges.
func (d *daemonUnderTest) exporting(t *testing.T) bool {
	return metricstest.Value(t, d.reg, "block_ipam_pool_addresses") > 0
}

func waitFor(t *testing.T, what string, limit time.Duration, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > limit {
			t.Fatalf("%s: not within %s", what, limit)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return time.Since(start)
}

// TestExporterFailover: of two daemons exactly one exports the cluster's gauges; when the exporter
// dies without a word (its etcd connection frozen, then its context ended: kill -9 as etcd sees it,
// neither resigning nor revoking), the other exports them within one liveness TTL plus 5 s, and
// the dead daemon's liveness key is gone by then.
func TestExporterFailover(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	putCapacityFixture(t, cli)
	proxy, err := etcdtest.NewProxy(strings.TrimPrefix(srv.Endpoint(), "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(proxy.Close)
	const ttl = 3 * time.Second
	first := startDaemon(t, proxy.Endpoint(), "first", ttl)
	waitFor(t, "first daemon exports", 30*time.Second, func() bool { return first.exporting(t) })
	second := startDaemon(t, srv.Endpoint(), "second", ttl)
	waitFor(t, "second daemon alive", 30*time.Second, second.live.Alive)
	if second.exporting(t) || second.live.Leader() {
		t.Fatal("two daemons export the cluster's gauges")
	}
	if got := metricstest.Value(t, second.reg, "block_ipam_node_block_limit", "node", "second"); got != 3 {
		t.Fatalf("the second daemon's own gauges: block limit %v, want 3", got)
	}

	proxy.Freeze()
	killed := time.Now()
	first.cancel()
	took := waitFor(t, "second daemon takes over", ttl+5*time.Second, func() bool { return second.exporting(t) })
	t.Logf("took over %s after the exporter died (liveness TTL %s)", took.Round(10*time.Millisecond), ttl)
	r, err := cli.Get(t.Context(), AliveKey("first"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 0 {
		t.Errorf("the dead daemon's liveness key is still there %s after its death", time.Since(killed))
	}
	if v := metricstest.Value(t, second.reg, "block_ipam_capacity_exporter", "node", "second"); v != 1 {
		t.Errorf("block_ipam_capacity_exporter of the new exporter = %v", v)
	}
	proxy.Thaw()
}

// TestExporterResignsOnStop: a daemon that stops hands the election over at once (long before its
// lease ends) and leaves its liveness key to its lease, so a restart does not make the node look dead.
func TestExporterResignsOnStop(t *testing.T) {
	_, cli := etcdtest.Start(t)
	putCapacityFixture(t, cli)
	const ttl = 60 * time.Second
	first := startDaemon(t, cli.Endpoints()[0], "first", ttl)
	waitFor(t, "first daemon exports", 30*time.Second, func() bool { return first.exporting(t) })
	second := startDaemon(t, cli.Endpoints()[0], "second", ttl)
	waitFor(t, "second daemon alive", 30*time.Second, second.live.Alive)
	first.cancel()
	<-first.done
	// Well inside the TTL: only a resignation explains it.
	waitFor(t, "second daemon takes over", ttl/2, func() bool { return second.exporting(t) })
	r, err := cli.Get(t.Context(), AliveKey("first"))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Kvs) != 1 {
		t.Error("the stopped daemon's liveness key was deleted with it: a restart would make the node look dead")
	}
}

// TestCapacityCountsExclude: the ranges the CNI configuration excludes are reserved addresses in the
// gauges: the pool's reserved addresses grow by the excluded range outside the IPReservation, and the
// node's free addresses shrink by the excluded addresses inside its block.
func TestCapacityCountsExclude(t *testing.T) {
	_, cli := etcdtest.Start(t)
	putCapacityFixture(t, cli)
	exclude := []netip.Prefix{netip.MustParsePrefix("10.0.0.192/27"), netip.MustParsePrefix("10.0.0.60/30")}
	reg := prometheus.NewRegistry()
	c := NewCapacity(CapacityConfig{Client: cli, Node: "a", Leader: func() bool { return true },
		Exclude: func() []netip.Prefix { return exclude }}, reg)
	if err := c.Refresh(t.Context(), true); err != nil {
		t.Fatal(err)
	}
	pool := []string{"pool", "p4", "family", "ipv4"}
	if got := metricstest.Value(t, reg, "block_ipam_pool_reserved_addresses", pool...); got != 64+32+4 {
		t.Errorf("reserved addresses %v, want 100: the IPReservation's 64, and the excluded /27 and /30", got)
	}
	if got := metricstest.Value(t, reg, "block_ipam_node_free_addresses", append([]string{"node", "a"}, pool...)...); got != 61-4 {
		t.Errorf("node a's free addresses %v, want 57: 61 less the excluded /30 in its block", got)
	}
}

// TestServerRemembersExclude: the capacity gauges learn ipam.exclude from the last ADD the daemon
// served (only requests carry the CNI configuration).
func TestServerRemembersExclude(t *testing.T) {
	srv := startServer(t, Config{}, nil)
	if got := srv.Exclude(); got != nil {
		t.Fatalf("Exclude before any ADD = %v, want nil", got)
	}
	req := addRequest("c1", 10*time.Second)
	req.Exclude = []netip.Prefix{netip.MustParsePrefix("10.244.0.0/30")}
	if reply := srv.serve(t.Context(), time.Now(), req); reply.Code != 0 {
		t.Fatalf("ADD: %d %s", reply.Code, reply.Msg)
	}
	if got := srv.Exclude(); len(got) != 1 || got[0] != req.Exclude[0] {
		t.Errorf("Exclude after the ADD = %v, want %v", got, req.Exclude)
	}
}
