package calicotest

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

func TestBlockIsWellFormed(t *testing.T) {
	for i, node := range []string{"node-a", ""} {
		b := Block(BlockCIDR(i), node, i)
		if err := b.Validate(); err != nil {
			t.Errorf("Block(%q): %v", node, err)
		}
		owner := calico.OwnerOf(b, false)
		if owner.Node != node || len(calico.BorrowedAddrs(b, owner)) != 0 {
			t.Errorf("Block(%q): owner %+v", node, owner)
		}
	}
	b := Block(BlockCIDR(0), "node-a", 0)
	ord := Allocate(b, "h", PodAttrs("node-b", "ns", "p", time.Unix(0, 0)))
	if got := calico.BorrowedAddrs(b, calico.OwnerOf(b, false)); len(got) != 1 || got[0].Ordinal != ord || got[0].Node != "node-b" {
		t.Errorf("borrowed = %+v", got)
	}
	if err := b.Validate(); err != nil {
		t.Error(err)
	}
}

func TestBlockCIDR(t *testing.T) {
	seen := map[netip.Prefix]bool{}
	for _, i := range []int{0, 1, 3, 4, 1023, 1024, MaxBlocks - 1} {
		p := BlockCIDR(i)
		if p.Bits() != 26 || p != p.Masked() || !netip.MustParsePrefix("10.0.0.0/8").Contains(p.Addr()) || seen[p] {
			t.Errorf("BlockCIDR(%d) = %s", i, p)
		}
		seen[p] = true
	}
	if BlockCIDR(1) != netip.MustParsePrefix("10.0.0.64/26") || BlockCIDR(4) != netip.MustParsePrefix("10.0.1.0/26") {
		t.Errorf("BlockCIDR(1) = %s, BlockCIDR(4) = %s", BlockCIDR(1), BlockCIDR(4))
	}
}

func TestPutBlocksAndPeer(t *testing.T) {
	_, cli := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cidrs, err := PutBlocks(ctx, cli, 300, func(i int) string { return fmt.Sprintf("n%d", i%3) })
	if err != nil || len(cidrs) != 300 {
		t.Fatalf("PutBlocks: %d, %v", len(cidrs), err)
	}
	resp, err := cli.Get(ctx, calico.BlockKey(cidrs[299]))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("get: %v %v", resp, err)
	}
	b, err := calico.DecodeBlock(resp.Kvs[0].Value)
	if err != nil || b.CIDR != cidrs[299] || calico.OwnerOf(b, false).Node != "n2" {
		t.Fatalf("block 299: %+v, %v", b, err)
	}
	count, err := cli.Get(ctx, calico.BlockPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil || count.Count != 300 {
		t.Fatalf("count %v, %v", count, err)
	}
	if err := PutPeer(ctx, cli, "/hosts/", "n1", netip.MustParseAddr("2001:db8::1")); err != nil {
		t.Fatal(err)
	}
	if resp, err := cli.Get(ctx, "/hosts/n1/peerip/ipv6/1"); err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "2001:db8::1" {
		t.Fatalf("peer: %v, %v", resp, err)
	}
}
