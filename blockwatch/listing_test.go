package blockwatch

import (
	"fmt"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
)

// TestListing: the first list hands out its blocks in parts while it goes on, each with every peer and
// pool of the list's revision; together the parts hold exactly the Full snapshot's blocks (a
// malformed one is held, in no part); a relist hands out none.
func TestListing(t *testing.T) {
	_, cli := startEtcd(t)
	ctx := testCtx(t)
	if _, err := calicotest.PutBlocks(ctx, cli, 50, func(i int) string { return fmt.Sprintf("node-%d", i%5) }); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := calicotest.PutPeer(ctx, cli, DefaultHostsPrefix, fmt.Sprintf("node-%d", i), netip.AddrFrom4([4]byte{192, 0, 2, byte(i + 1)})); err != nil {
			t.Fatal(err)
		}
	}
	pool := calico.IPPool{Name: "p", CIDR: mustPrefix("10.0.0.0/8"), BlockSize: 26, NodeSelector: "all()"}
	v, err := calico.EncodeIPPool(pool)
	if err != nil {
		t.Fatal(err)
	}
	put(t, cli, calico.IPPoolKey(pool.Name), string(v))
	bad := calicotest.BlockCIDR(50)
	put(t, cli, calico.BlockKey(bad), "{not json")

	h := newHarness(t, cli, func(c *Config) { c.PageSize = 7 })
	var parts []*Listed
	h.w.testHookPage = func(src source, page int) {
		if src != srcBlocks {
			return
		}
		// Take each part as it comes (they would coalesce otherwise), before the next page is read.
		select {
		case l := <-h.w.Listing():
			parts = append(parts, l)
		case <-time.After(waitLimit):
			t.Errorf("no listed part after block page %d", page)
		}
	}
	h.run()
	full := h.next()
	if !full.Full || full.Blocks.Len() != 50 || len(full.Held) != 1 {
		t.Fatalf("first snapshot: full %v, %d blocks, held %v", full.Full, full.Blocks.Len(), full.Held)
	}
	if len(parts) < 2 {
		t.Fatalf("%d parts of 51 blocks listed 7 at a time", len(parts))
	}
	seen := map[netip.Prefix]bool{}
	for _, l := range parts {
		if l.Revision != full.Revision || !maps.Equal(l.Peers, full.Peers) || len(l.Pools) != 1 || !poolEqual(l.Pools["p"], full.Pools["p"]) {
			t.Errorf("part at revision %d with peers %v and pools %v; the snapshot at %d has %v and %v",
				l.Revision, l.Peers, l.Pools, full.Revision, full.Peers, full.Pools)
		}
		for _, b := range l.Blocks {
			if seen[b.CIDR] {
				t.Errorf("block %s in two parts", b.CIDR)
			}
			seen[b.CIDR] = true
			if full.Blocks.Get(b.CIDR) != b {
				t.Errorf("part's block %v is not the snapshot's %v", b, full.Blocks.Get(b.CIDR))
			}
		}
	}
	if len(seen) != full.Blocks.Len() || seen[bad] {
		t.Errorf("parts hold %d blocks (the malformed one: %v), the snapshot %d", len(seen), seen[bad], full.Blocks.Len())
	}

	// A relist has a view to replace: no parts.
	h.w.testHookPage = nil
	h.w.Relist()
	if s := h.next(); !s.Full || s.RelistReason != ReasonRequested {
		t.Fatalf("after Relist: full %v reason %q", s.Full, s.RelistReason)
	}
	select {
	case l := <-h.w.Listing():
		t.Errorf("a relist handed out a part of %d blocks", len(l.Blocks))
	default:
	}
}
