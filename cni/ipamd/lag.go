package ipamd

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"slices"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// How the node state may lag behind etcd, and why decisions taken on it are still right. The
// watch-fed node state (state.go, fed by watch.go) saves a round trip per ADD; these rules make that
// safe, and this file holds the code of each:
//
//  1. Every change arrives with the revision it was true at, and per key the newest wins: a watch
//     event, a relist, an operation's read and this daemon's committed write may arrive in any order
//     (replace, set, newer).
//  2. A read of a whole source at R holds every change up to R; knownAt is the revision up to which
//     the state holds a source (the reservations' reservedRev is one).
//  3. Before a decision, an operation reads what the state has not received at all: every source
//     until each has been read once, and the block of an affinity not read yet (sync).
//  4. A success needs no fresh read: the write is conditional on what the decision used being as
//     known (the mod revisions of the blocks, affinities and pools it used, of the IPAM config and
//     of the Node; no IPReservation changed since reservedRev: view.writes). A write that loses
//     reads, in its failure branch, what it compared, and the next attempt decides on that.
//  5. A refusal, which no write checks, is answered only once it holds on a fresh read of what it
//     depended on, in one round trip, once per operation (recheck).

// replace sets a source to what a read of all of it at revision rev found, except the keys known at
// a later revision.
func (s *nodeState) replace(src source, kvs []kv, rev int64) {
	if rev <= s.listed[src] {
		return
	}
	raw, revs := s.raw[src], s.revs[src]
	found := make(map[string]bool, len(kvs))
	for _, kv := range kvs {
		found[kv.Key] = true
		if rev >= revs[kv.Key] {
			raw[kv.Key], revs[kv.Key] = kv, rev
		}
	}
	for k, r := range revs {
		if !found[k] && r <= rev {
			// Absent at rev, and nothing newer is known: the read covers it.
			delete(raw, k)
			delete(revs, k)
		}
	}
	s.listed[src] = rev
	s.decode(src)
}

// set records one key of a source at revision rev (v nil: deleted), unless the state knows the key
// at a later revision; it reports whether it did. A change at the same revision is applied again
// (one transaction writes several keys at one revision; applying a key twice changes nothing).
func (s *nodeState) set(src source, key string, v *kv, rev int64) bool {
	if rev <= s.listed[src] || rev < s.revs[src][key] {
		return false
	}
	s.revs[src][key] = rev
	if v == nil {
		delete(s.raw[src], key)
	} else {
		s.raw[src][key] = *v
	}
	return true
}

// newer reports whether rev is newer than what is known of the block cidr, one of the node's
// affinities; if so, the block is now known at rev, as absent until the caller says more.
func (s *nodeState) newer(cidr netip.Prefix, rev int64) bool {
	if _, ok := s.affinity[cidr]; !ok || rev <= s.blockKnown[cidr] {
		return false
	}
	s.blockKnown[cidr] = rev
	delete(s.bad, cidr)
	s.blocks[cidr] = nil
	return true
}

// knownAt returns the revision up to which the state holds every change of a source: its newest
// read, or the newest change applied since (a follower's watch delivers a prefix's changes in
// order, and a read of the whole source makes up for any it missed).
func (s *nodeState) knownAt(src source) int64 {
	rev := s.listed[src]
	for _, r := range s.revs[src] {
		rev = max(rev, r)
	}
	return rev
}

// sync reads what the state has not received from its followers yet: every source (with the handle,
// in the same round trip), then the blocks of new affinities. None in steady state.
func (c *call) sync(ctx context.Context, handleID string) error {
	if !c.state.allListed() {
		n := &needs{sources: true, blocks: slices.Collect(maps.Keys(c.state.blocks))}
		if handleID != "" {
			n.keys = []string{calico.HandleKey(handleID)}
		}
		if err := c.fetch(ctx, n); err != nil {
			return err
		}
	}
	if m := c.state.missingBlocks(); len(m) > 0 {
		return c.fetch(ctx, &needs{blocks: m})
	}
	return nil
}

// recheck returns err, a decision's failure, once it was taken on what the operation read at a
// current revision: else the need for it. The node state follows etcd through watches that may lag
// (the IPAM config, pools, reservations, Node and affinities, the node's blocks), so a refusal taken
// on it, which no write's conditions check, is taken again on a fresh read of what it depended on,
// in one round trip: the handle, every source of the state, the node's blocks, the other blocks,
// listings and families the operation read. Once per operation (opRead.fresh): the success path
// never gets here, and an operation that lost a race decides on its failure branch's read already.
func (v *view) recheck(err error) error {
	var n *needs
	if errors.As(err, &n) {
		return err
	}
	n = &needs{}
	if v.handleID != "" && (!v.handleRead || !v.read.fresh) {
		n.keys = []string{calico.HandleKey(v.handleID)}
	}
	if !v.read.fresh {
		n.sources = true
		for cidr := range v.affinity {
			n.blocks = append(n.blocks, cidr)
		}
		for cidr := range v.read.blocks {
			if _, ok := v.affinity[cidr]; !ok && !v.read.family[netaddr.FamilyOf(cidr.Addr())] {
				n.blocks = append(n.blocks, cidr)
			}
		}
		slices.SortFunc(n.blocks, netip.Prefix.Compare)
		for f := range n.listing {
			n.listing[f], n.family[f] = v.read.listings[f] != nil, v.read.family[f]
		}
	}
	if len(n.keys) == 0 && !n.sources {
		return err
	}
	return n
}
