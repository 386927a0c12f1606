package blockwatch

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
)

// TestCompactedRelistAtCompactionRevision: after a compaction, the relist reads at the compaction
// revision (the one every watcher behind a gRPC proxy learns at once, so that the proxy can answer
// their identical requests from its cache), and the watch from there replays what was written after
// it.
func TestCompactedRelistAtCompactionRevision(t *testing.T) {
	srv, cli := startEtcd(t)
	px := newProxy(t, srv.Endpoint())
	a, b, c := mustPrefix("10.5.0.0/26"), mustPrefix("10.5.0.64/26"), mustPrefix("10.5.0.128/26")
	putBlock(t, cli, calicotest.Block(a, "node-a", 1))
	// The production probe interval: these tests count relists exactly, and the proxy cuts connections
	// (no probe is needed to notice), so a short interval would only let a slow probe add a relist.
	h := newHarness(t, fastClient(t, px.Endpoint()), func(c *Config) {
		c.CompactedRelistSpread = 300 * time.Millisecond
		c.ProbeInterval = DefaultProbeInterval
	})
	h.run()
	if s := h.next(); s.Blocks.Len() != 1 {
		t.Fatalf("initial: %v", s.Blocks)
	}
	px.Block()
	putBlock(t, cli, calicotest.Block(b, "node-b", 2))
	putBlock(t, cli, calicotest.Block(b, "node-b", 4)) // the watch resumes before the compaction revision
	crev, err := srv.Compact(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	after := putBlock(t, cli, calicotest.Block(c, "node-c", 3))
	px.Unblock()

	s, _ := h.waitFor("a Full snapshot", func(s *Snapshot) bool { return s.Full })
	if s.RelistReason != ReasonCompacted || s.Revision != crev {
		t.Fatalf("relist reason %q at revision %d, want %q at the compaction revision %d (etcd is at %d)",
			s.RelistReason, s.Revision, ReasonCompacted, crev, after)
	}
	if s.Blocks.Len() != 2 || s.Blocks.Get(b) == nil || s.Blocks.Get(c) != nil {
		t.Errorf("relist at revision %d: blocks %v, want %s and %s", s.Revision, s.Blocks, a, b)
	}
	s, _ = h.waitFor("the block written after the compaction", func(s *Snapshot) bool { return s.Blocks.Get(c) != nil })
	if s.Full || s.Blocks.Len() != 3 || s.Revision != after {
		t.Errorf("after the relist: full %v, %d blocks at revision %d, want an event at %d", s.Full, s.Blocks.Len(), s.Revision, after)
	}
}

// TestCompactedRelistFallsBack: when the compaction revision is itself compacted while the relist reads
// it, the relist starts over at the current revision.
func TestCompactedRelistFallsBack(t *testing.T) {
	srv, cli := startEtcd(t)
	px := newProxy(t, srv.Endpoint())
	a, b, c := mustPrefix("10.6.0.0/26"), mustPrefix("10.6.0.64/26"), mustPrefix("10.6.0.128/26")
	putBlock(t, cli, calicotest.Block(a, "node-a", 1))
	putBlock(t, cli, calicotest.Block(b, "node-b", 2))
	h := newHarness(t, fastClient(t, px.Endpoint()), func(c *Config) {
		c.ProbeInterval = DefaultProbeInterval // as above
		c.CompactedRelistSpread, c.PageSize = -1, 1
	})
	var armed atomic.Bool
	var crev2 atomic.Int64
	h.w.testHookPage = func(src source, page int) {
		// After the first page of the relist at the compaction revision, compact past it.
		if src == srcBlocks && page == 0 && armed.CompareAndSwap(true, false) {
			putBlock(t, cli, calicotest.Block(c, "node-c", 3))
			rev, err := srv.Compact(testCtx(t))
			if err != nil {
				t.Error(err)
			}
			crev2.Store(rev)
		}
	}
	h.run()
	if s := h.next(); s.Blocks.Len() != 2 {
		t.Fatalf("initial: %v", s.Blocks)
	}
	px.Block()
	putBlock(t, cli, calicotest.Block(a, "node-a2", 4))
	putBlock(t, cli, calicotest.Block(b, "node-b2", 5))
	if _, err := srv.Compact(testCtx(t)); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	px.Unblock()

	s, _ := h.waitFor("a Full snapshot", func(s *Snapshot) bool { return s.Full })
	if s.RelistReason != ReasonCompacted || s.Revision < crev2.Load() || crev2.Load() == 0 {
		t.Fatalf("relist reason %q at revision %d, want %q at the second compaction's revision %d or later",
			s.RelistReason, s.Revision, ReasonCompacted, crev2.Load())
	}
	if s.Blocks.Len() != 3 || s.Blocks.Get(a).Owner.Node != "node-a2" || s.Blocks.Get(c) == nil {
		t.Errorf("relist at revision %d: blocks %v", s.Revision, s.Blocks)
	}
	if st := h.w.Status(); st.Relists != 1 {
		t.Errorf("status %+v, want one relist", st)
	}
}
