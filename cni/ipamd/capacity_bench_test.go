package ipamd

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// BenchmarkCapacity100k: the elected daemon's read of the cluster's capacity (pools, config, every
// block, who is alive, at one revision) and its computation, over 100,000 blocks of 1,000 nodes (three
// addresses each) in a /9 pool: its first read, and the reads that follow with no block changed; beside
// them, their floor: one raw paged list of the block keys and values on the same etcd, and the
// computation alone (calico.Capacity on what was read).
//
//	go test -run '^$' -bench Capacity100k -benchtime 3x ./cni/ipamd/
func BenchmarkCapacity100k(b *testing.B) {
	const blocks = 100_000
	_, cli := etcdtest.Start(b)
	ctx := b.Context()
	pool := calico.IPPool{Name: "big", CIDR: netip.MustParsePrefix("10.0.0.0/9"), BlockSize: 26}
	if err := calicotest.PutPool(ctx, cli, pool); err != nil {
		b.Fatal(err)
	}
	if _, err := calicotest.PutBlocks(ctx, cli, blocks, func(i int) string { return fmt.Sprintf("node-%d", i%1000) }); err != nil {
		b.Fatal(err)
	}
	b.Run("raw-list", func(b *testing.B) {
		for b.Loop() {
			n, key, end := 0, calico.BlockPrefix, clientv3.GetPrefixRangeEnd(calico.BlockPrefix)
			for {
				resp, err := cli.Get(ctx, key, clientv3.WithRange(end), clientv3.WithLimit(5000))
				if err != nil {
					b.Fatal(err)
				}
				n += len(resp.Kvs)
				if !resp.More {
					break
				}
				key = string(resp.Kvs[len(resp.Kvs)-1].Key) + "\x00"
			}
			if n != blocks {
				b.Fatalf("listed %d blocks, want %d", n, blocks)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
	})
	newCapacity := func() *Capacity {
		return NewCapacity(CapacityConfig{Client: cli, Node: "node-0", Leader: func() bool { return true }, CallTimeout: time.Minute},
			prometheus.NewRegistry())
	}
	check := func(b *testing.B, c *Capacity) {
		c.mu.Lock()
		got := len(c.snap.rep.Nodes)
		c.mu.Unlock()
		if got != 1000 {
			b.Fatalf("capacity of %d nodes, want 1000", got)
		}
	}
	// A daemon's first read (just elected) decodes every block.
	b.Run("refresh-first", func(b *testing.B) {
		var c *Capacity
		for b.Loop() {
			c = newCapacity()
			if err := c.Refresh(ctx, true); err != nil {
				b.Fatal(err)
			}
		}
		check(b, c)
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
	})
	// The reads that follow decode only the blocks changed since (none here).
	b.Run("refresh-unchanged", func(b *testing.B) {
		c := newCapacity()
		if err := c.Refresh(ctx, true); err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			if err := c.Refresh(ctx, true); err != nil {
				b.Fatal(err)
			}
		}
		check(b, c)
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
	})
	b.Run("compute", func(b *testing.B) {
		in, _, _, err := newCapacity().read(ctx, true)
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			calico.Capacity(in.CapacityInput)
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/op")
	})
}
