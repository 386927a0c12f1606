package release

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// BenchmarkReleaseNode10Blocks: release of a dead node holding 10 /26 blocks of 20 pods each (200
// addresses, 200 handles, 10 affinities) on an embedded etcd that also holds 990 blocks of other
// nodes, plan (read everything at one revision) and commit (10 transactions) timed apart; the floor
// is one raw etcd transaction (a conditional put of one block) on the same etcd, in the same run.
func BenchmarkReleaseNode10Blocks(b *testing.B) {
	_, cli := etcdtest.Start(b)
	ctx := context.Background()
	// Other nodes' blocks: the plan reads every block to find borrowed addresses.
	for i := 10; i < 1000; i++ {
		putBlock(b, cli, blockCIDR(i), fmt.Sprintf("host:other%d", i/10), alloc{0, fmt.Sprintf("o.%d", i), fmt.Sprintf("other%d", i/10)})
	}
	var plan, commit, raw time.Duration
	b.ResetTimer()
	for it := range b.N {
		b.StopTimer()
		for i := range 10 {
			var allocs []alloc
			for p := range 20 {
				allocs = append(allocs, alloc{p, fmt.Sprintf("net.%d-%d-%d", it, i, p), "dead"})
			}
			putBlock(b, cli, blockCIDR(i), "host:dead", allocs...)
		}
		o := Options{Client: cli, Node: "dead", CallTimeout: 10 * time.Second}
		b.StartTimer()
		t0 := time.Now()
		p, err := NewPlan(ctx, o)
		if err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		res, err := Commit(ctx, o, p)
		if err != nil || len(res.Released) != 200 || res.Transactions != 10 {
			b.Fatalf("%+v %v", res, err)
		}
		t2 := time.Now()
		b.StopTimer()
		plan, commit = plan+t1.Sub(t0), commit+t2.Sub(t1)
		// The floor: one conditional put of a block, as each of the commit's transactions is.
		key := calico.BlockKey(netip.MustParsePrefix(blockCIDR(500)))
		g, err := cli.Get(ctx, key)
		if err != nil {
			b.Fatal(err)
		}
		t3 := time.Now()
		if _, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", g.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(key, string(g.Kvs[0].Value))).Commit(); err != nil {
			b.Fatal(err)
		}
		raw += time.Since(t3)
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(plan.Microseconds())/n/1000, "plan-ms/op")
	b.ReportMetric(float64(commit.Microseconds())/n/1000, "commit-ms/op")
	b.ReportMetric(float64(raw.Microseconds())/n/1000, "raw-txn-ms/op")
}

func blockCIDR(i int) string {
	return netip.AddrFrom4([4]byte{10, byte(i >> 2), byte(i << 6), 0}).String() + "/26"
}
