package blockwatch

import (
	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Listed is a part of a Watcher's first list, handed out while the list goes on (Listing) so that a
// consumer can start work before the list is complete: every pool, peer and Node of the list's
// revision and the tunnel configuration (the list reads them before the blocks), and blocks listed
// since the previous part. It is not a
// view of etcd: a block absent from every part may still be listed, and until the Full snapshot
// arrives nothing may be concluded from an absence. Its maps and blocks are immutable, shared with the
// snapshots.
type Listed struct {
	// Revision is the revision of the list. A list that fails is retried at a new revision (whose
	// parts carry it); the parts of one revision together hold each of its blocks once.
	Revision int64
	// Blocks are blocks present at Revision, with their routing data (as Snapshot.Blocks holds them).
	Blocks []*Block
	// Total is the number of keys the list reads for the blocks at Revision (block keys, or affinity
	// keys when ownership comes from them), as etcd counted them: a size to make room for, not a
	// promise (some keys may be malformed or deleted blocks).
	Total int
	// Peers, Pools and Nodes are all the peers, pools and Nodes at Revision; Tunnel and
	// TunnelProblems are as in Snapshot.
	Peers          map[string]Peer
	Pools          map[string]calico.IPPool
	Nodes          map[string]calico.Node
	Tunnel         calico.TunnelConfig
	TunnelProblems []calico.FieldProblem
}

// Listing delivers the parts of the first list, the one that has no previous view to diff against
// (later lists replace a view the consumer already acts on: it waits for their Full snapshot). Like
// Updates it has capacity 1 and coalesces: a part the consumer has not taken yet is merged into the
// next one. The Full snapshot that ends the list comes on Updates, after its last part; a consumer may
// ignore Listing altogether.
func (w *Watcher) Listing() <-chan *Listed { return w.listing }

// emitListed hands a part of the first list out without blocking, merged with the part the consumer
// has not taken yet, if it is of the same revision. c is the view being listed: its peers, pools,
// Nodes and FelixConfigurations are complete, and its maps from now on shared.
func (w *Watcher) emitListed(c *cache, blocks []*Block, total int) {
	c.peersShared, c.poolsShared, c.nodesShared = true, true, true
	l := &Listed{Revision: c.rev, Blocks: blocks, Total: total, Peers: c.peers, Pools: c.pools, Nodes: c.nodes,
		Tunnel: c.tunnel, TunnelProblems: c.tunnelProblems}
	merge := func(old, l *Listed) *Listed {
		if old.Revision == l.Revision {
			l.Blocks = append(old.Blocks, l.Blocks...)
		}
		return l
	}
	if !sendMerged(w.listing, l, merge) {
		w.log.Error("blockwatch: listed part dropped: Listing has another sender")
	}
}
