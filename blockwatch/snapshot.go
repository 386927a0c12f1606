package blockwatch

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Relist reasons carried by Full snapshots (Snapshot.RelistReason) and the relists metric.
const (
	// ReasonInitial: the first list of a Watcher.
	ReasonInitial = "initial"
	// ReasonCompacted: etcd compacted the revision a watch needed (ErrCompacted).
	ReasonCompacted = "compacted"
	// ReasonWatchError: a watch was canceled with an error (no leader, a server-side cancel, ...)
	// or could not be created in time.
	ReasonWatchError = "watch-error"
	// ReasonWatchClosed: a watch channel closed without saying why.
	ReasonWatchClosed = "watch-closed"
	// ReasonRequested: Relist was called.
	ReasonRequested = "requested"
	// ReasonRestarted: Run was called again on a Watcher whose previous Run had returned.
	ReasonRestarted = "restarted"
	// ReasonOwnership: the IPAM config's strict affinity changed, and with it the ownership source
	// (OwnershipAuto).
	ReasonOwnership = "ownership-changed"
)

// RelistReasons returns every relist reason, for consumers that pre-create a series per reason.
func RelistReasons() []string {
	return []string{ReasonInitial, ReasonCompacted, ReasonWatchError, ReasonWatchClosed, ReasonRequested,
		ReasonRestarted, ReasonOwnership}
}

// Snapshot is the routing view of etcd at Revision. It is immutable once emitted: consumers must not
// modify it, and the Watcher never mutates a map or slice after handing it out (maps are copied on
// the Watcher's next write to them; Blocks, one shard of it).
type Snapshot struct {
	// Revision is the highest etcd revision the snapshot reflects. A Full snapshot is exactly the
	// state of the watched prefixes at Revision. In an incremental snapshot each prefix is etcd's state
	// of that prefix at some revision up to Revision: the prefixes are watched on independent
	// streams, so events of one prefix may arrive a little after later events of another.
	Revision int64
	// Blocks holds every block present at Revision. Blocks with deleted:true are absent, and so are
	// blocks whose value was never well-formed.
	Blocks Blocks
	// Held lists the blocks whose current value cannot be read (bad JSON, a cidr that differs from the
	// key's, ...): their key names the CIDR, so the consumer must keep whatever it has for that CIDR
	// until a readable value or a delete arrives. A held block is also in Blocks when this Watcher saw
	// a good value of it before (its routing data is that last good value).
	Held map[netip.Prefix]Held
	// Peers maps a node to its registered peer IPs.
	Peers map[string]Peer
	// Pools maps a pool name to the pool.
	Pools map[string]calico.IPPool
	// Full is true when the snapshot was produced by a (re)list: the consumer should do a full resync.
	Full bool
	// RelistReason says why a Full snapshot was listed (Reason* constants); "" when not Full.
	RelistReason string
	// ChangedBlocks lists, sorted, the blocks created, updated or deleted since the previous snapshot
	// (for a Full snapshot: the difference between the previous view and the relisted one; none for
	// a Watcher's first list, which has no previous view: everything in it is new, and none for a
	// snapshot that folds it in). Only
	// changes of routing data count: most IPAM writes (a pod address allocated in its node's own
	// block) change no route and produce no snapshot.
	ChangedBlocks []netip.Prefix
	// ChangedPeers lists, sorted, the nodes whose peer IPs changed since the previous snapshot (none
	// for a Watcher's first list).
	ChangedPeers []string
	// PoolsChanged says whether any pool changed since the previous snapshot (any field, the
	// encapsulation modes included).
	PoolsChanged bool
	// Nodes maps a node name to the routing data of its Calico Node resource (calico.Node with V4
	// and V6; Labels are not kept). A node whose value never decoded is absent; one whose current value
	// does not decode keeps its last good value. A field that did not parse is listed in its family's
	// Problems (and that field is zero): see calico.NodeFamily.AddrProblem and calico.Node.VTEP for
	// telling "absent" from "keep what you had".
	Nodes map[string]calico.Node
	// ChangedNodes lists, sorted, the nodes whose routing data (Nodes) changed since the previous
	// snapshot, created and deleted ones included (none for a Watcher's first list). The routes to
	// a listed node's blocks may need recomputing; when this node itself is listed, its subnet may
	// have changed, and with it the encapsulation of every route to a CrossSubnet pool.
	ChangedNodes []string
	// Tunnel is this node's effective tunnel configuration: calico.EffectiveTunnelConfig of the
	// FelixConfigurations "default" and "node.<Config.NodeName>" (each its last good value, if any).
	Tunnel calico.TunnelConfig
	// TunnelProblems lists the fields of those two FelixConfigurations that could not be used (each
	// falls through to the next layer in Tunnel); a consumer may keep the tunnel settings it had while
	// there are any.
	TunnelProblems []calico.FieldProblem
	// TunnelChanged says whether Tunnel or TunnelProblems changed since the previous snapshot (true
	// for a Watcher's first list).
	TunnelChanged bool
	// ReceivedAt is when the etcd response that produced this snapshot was received (the earliest
	// one, after coalescing).
	ReceivedAt time.Time
	// Ownership is where the owners in Blocks come from: OwnershipBlocks or OwnershipAffinities (see
	// Ownership: from the affinities, blocks have no Borrowed addresses, and blocks without an
	// affinity are absent).
	Ownership Ownership
	// Problem, when not empty, says why Blocks may lack routes although the view is complete:
	// ownership comes from the affinities while the IPAM config does not say strict affinity is on.
	Problem string
}

// Held says why a block is held: its value cannot be read.
type Held struct {
	Reason string
	// Revision is the mod revision of the unreadable value.
	Revision int64
	// LastGood is true when the block's routing data in Snapshot.Blocks is its last good value.
	LastGood bool
}

// Block is the routing data of one Calico IPAM block, and nothing else.
type Block struct {
	CIDR netip.Prefix
	// Owner is calico.OwnerOf the block: a node (route the CIDR to it), a virtual owner or nobody.
	Owner calico.Owner
	// Borrowed are the allocated addresses of other nodes (route each as a host route to its node).
	Borrowed []calico.Borrowed
}

// Equal reports whether a and b hold the same routing data; two nil blocks are equal.
func (a *Block) Equal(b *Block) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.CIDR == b.CIDR && a.Owner == b.Owner && slices.Equal(a.Borrowed, b.Borrowed)
}

// Peer is the uplink addresses a node registered; a zero Addr means the family is not registered.
// Whether an address can be a next hop is for the consumer to judge (agent.Options): the Watcher
// only checks that it is an address of the key's family.
type Peer struct {
	IPv4, IPv6 netip.Addr
	// IPv4Created and IPv6Created are the create revisions of the keys, and IPv4Leased and IPv6Leased
	// whether they are on a lease (as every agent writes them; a hand-written or leftover key is not):
	// which node holds an address when two claim the same one.
	IPv4Created, IPv6Created int64
	IPv4Leased, IPv6Leased   bool
	// MoreIPv4 and MoreIPv6 are the node's further peer IPs of each family, one per further uplink:
	// peerip/<family>/2, /3, ... in index order (IPv4 and IPv6 are the lowest index registered, /1 as
	// every agent writes it). Older agents register /1 only, so these are empty.
	MoreIPv4, MoreIPv6 Addrs
	// Gap says that an index is missing below a registered one (/1 and /3 without /2; /2 without /1):
	// the addresses there are used all the same, in index order.
	Gap bool
	// BFD are the node's peer IPs it answers BFD on (peerip/<family>/<n>/bfd, the agent's --bfd), IPv4
	// first; empty for a node without BFD, and for every older agent.
	BFD Addrs
}

// IPv4s returns every registered IPv4 peer IP of the node, in index order.
func (p Peer) IPv4s() []netip.Addr { return p.all(p.IPv4, p.MoreIPv4) }

// IPv6s returns every registered IPv6 peer IP of the node, in index order.
func (p Peer) IPv6s() []netip.Addr { return p.all(p.IPv6, p.MoreIPv6) }

func (p Peer) all(first netip.Addr, more Addrs) []netip.Addr {
	if !first.IsValid() {
		return nil
	}
	return append([]netip.Addr{first}, more.All()...)
}

// Addrs is an immutable, comparable list of addresses (so that Peer stays comparable). Its zero value is
// empty.
type Addrs struct{ enc string }

// MakeAddrs returns as as Addrs, in order; invalid addresses are left out.
func MakeAddrs(as []netip.Addr) Addrs {
	var b strings.Builder
	for _, a := range as {
		if !a.IsValid() {
			continue
		}
		if b.Len() > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(a.String())
	}
	return Addrs{enc: b.String()}
}

// All returns the addresses in order.
func (as Addrs) All() []netip.Addr {
	if as.enc == "" {
		return nil
	}
	var out []netip.Addr
	for f := range strings.FieldsSeq(as.enc) {
		out = append(out, netip.MustParseAddr(f)) // written by MakeAddrs
	}
	return out
}

// MarshalJSON writes the addresses as a JSON list.
func (as Addrs) MarshalJSON() ([]byte, error) {
	out := as.All()
	if out == nil {
		out = []netip.Addr{}
	}
	return json.Marshal(out)
}

// Len returns the number of addresses.
func (as Addrs) Len() int {
	if as.enc == "" {
		return 0
	}
	return strings.Count(as.enc, " ") + 1
}

// coalesce folds the unconsumed snapshot old into its successor s, which is not yet emitted and
// so may still be changed: s keeps its (newer) state and takes the union of both change sets, the
// earliest ReceivedAt, and Full from either. Folded into the first list's snapshot, which has no
// change sets (everything is new), s has none either.
func coalesce(old, s *Snapshot) *Snapshot {
	initial := old.Full && old.RelistReason == ReasonInitial
	if old.Full {
		if !s.Full {
			s.RelistReason = old.RelistReason
		}
		s.Full = true
	}
	s.ChangedBlocks = mergeSorted(old.ChangedBlocks, s.ChangedBlocks, netip.Prefix.Compare)
	s.ChangedPeers = mergeSorted(old.ChangedPeers, s.ChangedPeers, strings.Compare)
	s.ChangedNodes = mergeSorted(old.ChangedNodes, s.ChangedNodes, strings.Compare)
	if initial {
		s.ChangedBlocks, s.ChangedPeers, s.ChangedNodes = nil, nil, nil
	}
	s.PoolsChanged = s.PoolsChanged || old.PoolsChanged
	s.TunnelChanged = s.TunnelChanged || old.TunnelChanged
	if !old.ReceivedAt.IsZero() && (s.ReceivedAt.IsZero() || old.ReceivedAt.Before(s.ReceivedAt)) {
		s.ReceivedAt = old.ReceivedAt
	}
	return s
}

// mergeSorted returns the sorted union of two sorted, duplicate-free slices, in a fresh slice (nil if
// both are empty).
func mergeSorted[T any](a, b []T, cmp func(T, T) int) []T {
	if len(a)+len(b) == 0 {
		return nil
	}
	out := make([]T, 0, len(a)+len(b))
	for len(a) > 0 && len(b) > 0 {
		switch c := cmp(a[0], b[0]); {
		case c < 0:
			out, a = append(out, a[0]), a[1:]
		case c > 0:
			out, b = append(out, b[0]), b[1:]
		default:
			out, a, b = append(out, a[0]), a[1:], b[1:]
		}
	}
	out = append(out, a...)
	return append(out, b...)
}
