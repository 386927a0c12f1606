package blockwatch

import (
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// source names the prefix a key came from; its name is the metrics label.
type source uint8

const (
	srcBlocks source = iota
	srcHosts
	srcPools
	// srcAffinities replaces srcBlocks when ownership comes from the affinities (see Ownership).
	srcAffinities
	// srcIPAMConfig is the IPAM config key, read unless Config.Ownership is OwnershipBlocks.
	srcIPAMConfig
	// srcNodes are Calico's Node resources (their addresses and VXLAN tunnel endpoints).
	srcNodes
	// srcFelixConfigs are Calico's FelixConfigurations, of which only "default" and
	// "node.<Config.NodeName>" are read (tunnel settings).
	srcFelixConfigs
	numSources
)

func (s source) String() string {
	return [...]string{"blocks", "hosts", "pools", "affinities", "ipam-config", "nodes", "felixconfigurations"}[s]
}

// peerEntry is the last good address of one peer key, the revision of the last value applied to it,
// and the key's create revision.
type peerEntry struct {
	rev, created int64
	leased       bool
	addr         netip.Addr
}

// cache is the routing view at one revision, owned by the goroutine running Run. blocks (per shard),
// held, peers, pools and nodes are copy-on-write: once handed to a snapshot (shared) they are cloned before
// the next change.
// The *Revs maps hold, per key that has a good value, the mod revision of the last value applied to
// it (good or malformed), so that a stale event never overwrites a newer one.
type cache struct {
	rev int64

	blocks    blockSet // copy-on-write per shard
	blockRevs map[netip.Prefix]int64

	held       map[netip.Prefix]Held
	heldShared bool

	peerKeys    map[peerID]peerEntry
	peers       map[string]Peer
	peersShared bool

	pools       map[string]calico.IPPool
	poolRevs    map[string]int64
	poolsShared bool

	nodes       map[string]calico.Node // routing data only: no labels, problem values clipped
	nodeRevs    map[string]int64
	nodesShared bool

	// felix holds the FelixConfigurations this node reads (felixDefault, felixNode); tunnel and
	// tunnelProblems are derived from them (replaced, never modified: snapshots share them).
	felix          [2]felixEntry
	tunnel         calico.TunnelConfig
	tunnelProblems []calico.FieldProblem

	// names interns the node names of the blocks: 100,000 blocks of 1,000 nodes hold 1,000 strings.
	// It only grows until the next relist starts a fresh cache.
	names map[string]string

	// ownership is where the blocks' owners come from: OwnershipBlocks or OwnershipAffinities.
	ownership Ownership
	// affinities holds, by block and then node, the affinity keys read (OwnershipAffinities only);
	// blocks and held are derived from it. Never handed out.
	affinities map[netip.Prefix]map[string]affinityEntry
	// ipam is the IPAM config (read unless Config.Ownership is OwnershipBlocks).
	ipam ipamState
}

func newCache() *cache {
	return &cache{
		blockRevs: map[netip.Prefix]int64{}, held: map[netip.Prefix]Held{},
		peerKeys: map[peerID]peerEntry{}, peers: map[string]Peer{},
		pools: map[string]calico.IPPool{}, poolRevs: map[string]int64{}, names: map[string]string{},
		nodes: map[string]calico.Node{}, nodeRevs: map[string]int64{}, tunnel: calico.EffectiveTunnelConfig(nil, nil),
		ownership: OwnershipBlocks, affinities: map[netip.Prefix]map[string]affinityEntry{}, ipam: ipamState{known: true},
	}
}

// The FelixConfigurations a Watcher reads, as indexes of cache.felix.
const (
	felixDefault = iota // "default"
	felixNode           // "node.<Config.NodeName>"
)

// felixEntry is the last good value of one FelixConfiguration key (nil: none) and the mod revision
// of the last value applied to it (good or malformed).
type felixEntry struct {
	rev int64
	cfg *calico.FelixConfiguration
}

// grow makes room for about n blocks in a cache that has none yet.
func (c *cache) grow(n int) {
	if len(c.blockRevs) == 0 {
		c.blockRevs = make(map[netip.Prefix]int64, n)
	}
	c.blocks.grow(n)
}

// intern replaces the node names of b, a block not yet in any view, with the cache's copies.
func (c *cache) intern(b *Block) {
	b.Owner.Node = c.name(b.Owner.Node)
	for i := range b.Borrowed {
		b.Borrowed[i].Node = c.name(b.Borrowed[i].Node)
	}
}

func (c *cache) name(s string) string {
	if s == "" {
		return ""
	}
	if n, ok := c.names[s]; ok {
		return n
	}
	n := strings.Clone(s)
	c.names[n] = n
	return n
}

// changes accumulates what changed between two snapshots.
type changes struct {
	blocks   map[netip.Prefix]struct{}
	peers    map[string]struct{}
	nodes    map[string]struct{}
	pools    bool
	tunnel   bool
	received time.Time // when the first response contributing to these changes arrived
}

func (ch *changes) empty() bool {
	return len(ch.blocks) == 0 && len(ch.peers) == 0 && len(ch.nodes) == 0 && !ch.pools && !ch.tunnel
}

// block, peer, node, pool and tunnelChanged record a change; they do nothing on a nil *changes.
func (ch *changes) block(p netip.Prefix) {
	if ch == nil {
		return
	}
	if ch.blocks == nil {
		ch.blocks = map[netip.Prefix]struct{}{}
	}
	ch.blocks[p] = struct{}{}
}

func (ch *changes) peer(node string) {
	if ch == nil {
		return
	}
	if ch.peers == nil {
		ch.peers = map[string]struct{}{}
	}
	ch.peers[node] = struct{}{}
}

func (ch *changes) node(name string) {
	if ch == nil {
		return
	}
	if ch.nodes == nil {
		ch.nodes = map[string]struct{}{}
	}
	ch.nodes[name] = struct{}{}
}

func (ch *changes) tunnelChanged() {
	if ch != nil {
		ch.tunnel = true
	}
}

// setBlock records a good value for cidr at rev. A value with the same routing data keeps the old
// pointer and records no change.
func (c *cache) setBlock(cidr netip.Prefix, b *Block, rev int64, ch *changes) {
	c.blockRevs[cidr] = rev
	if old, _ := c.blocks.get(cidr); old.Equal(b) {
		return
	}
	c.blocks.set(cidr, b)
	ch.block(cidr)
}

func (c *cache) deleteBlock(cidr netip.Prefix, ch *changes) {
	delete(c.blockRevs, cidr)
	if _, ok := c.blocks.get(cidr); !ok {
		return
	}
	c.blocks.delete(cidr)
	ch.block(cidr)
}

// hold marks cidr as held (h) or, with a zero h, no longer held.
func (c *cache) hold(cidr netip.Prefix, h Held, ch *changes) {
	old, was := c.held[cidr]
	if was && old == h || !was && h == (Held{}) {
		return
	}
	if c.heldShared {
		c.held, c.heldShared = maps.Clone(c.held), false
	}
	if h == (Held{}) {
		delete(c.held, cidr)
	} else {
		c.held[cidr] = h
	}
	ch.block(cidr)
}

// setPeer records e for id; an invalid e.addr deletes the key.
func (c *cache) setPeer(id peerID, e peerEntry, ch *changes) {
	if e.addr.IsValid() {
		c.peerKeys[id] = e
	} else {
		delete(c.peerKeys, id)
	}
	v4, more4, gap4 := c.peerFamily(id.node, false)
	v6, more6, gap6 := c.peerFamily(id.node, true)
	p := Peer{IPv4: v4.addr, IPv6: v6.addr, IPv4Created: v4.created, IPv6Created: v6.created,
		IPv4Leased: v4.leased, IPv6Leased: v6.leased, MoreIPv4: more4, MoreIPv6: more6, Gap: gap4 || gap6,
		BFD: c.peerBFD(id.node)}
	old, had := c.peers[id.node]
	if had && old == p || !had && p == (Peer{}) {
		return
	}
	if c.peersShared {
		c.peers, c.peersShared = maps.Clone(c.peers), false
	}
	if p == (Peer{}) {
		delete(c.peers, id.node)
	} else {
		c.peers[id.node] = p
	}
	ch.peer(id.node)
}

// peerBFD returns the addresses node advertises BFD on (PeerBFDKeyAt), IPv4 then IPv6, each in index order.
func (c *cache) peerBFD(node string) Addrs {
	var out []netip.Addr
	for _, v6 := range []bool{false, true} {
		for i := 1; i <= MaxPeerIndex; i++ {
			if e, ok := c.peerKeys[peerID{node: node, v6: v6, index: i, bfd: true}]; ok {
				out = append(out, e.addr)
			}
		}
	}
	return MakeAddrs(out)
}

// peerFamily returns node's registered peer key of the family with the lowest index, the addresses of
// the others in index order, and whether an index below a registered one is missing.
func (c *cache) peerFamily(node string, v6 bool) (first peerEntry, more Addrs, gap bool) {
	var rest []netip.Addr
	missing := false
	for i := 1; i <= MaxPeerIndex; i++ {
		e, ok := c.peerKeys[peerID{node: node, v6: v6, index: i}]
		switch {
		case !ok:
			missing = true
			continue
		case !first.addr.IsValid():
			first = e
		default:
			rest = append(rest, e.addr)
		}
		gap = gap || missing
	}
	return first, MakeAddrs(rest), gap
}

// setPool records a pool at rev; a zero pool (no Name) deletes name.
func (c *cache) setPool(name string, p calico.IPPool, rev int64, ch *changes) {
	if p.Name == "" {
		delete(c.poolRevs, name)
	} else {
		c.poolRevs[name] = rev
	}
	old, had := c.pools[name]
	if had && p.Name != "" && poolEqual(old, p) || !had && p.Name == "" {
		return
	}
	if c.poolsShared {
		c.pools, c.poolsShared = maps.Clone(c.pools), false
	}
	if p.Name == "" {
		delete(c.pools, name)
	} else {
		c.pools[name] = p
	}
	ch.pool()
}

func (ch *changes) pool() {
	if ch != nil {
		ch.pools = true
	}
}

// setNode records a node's routing data at rev; a zero node (no Name) deletes name.
func (c *cache) setNode(name string, n calico.Node, rev int64, ch *changes) {
	if n.Name == "" {
		delete(c.nodeRevs, name)
	} else {
		c.nodeRevs[name] = rev
	}
	old, had := c.nodes[name]
	if had && n.Name != "" && nodeEqual(old, n) || !had && n.Name == "" {
		return
	}
	if c.nodesShared {
		c.nodes, c.nodesShared = maps.Clone(c.nodes), false
	}
	if n.Name == "" {
		delete(c.nodes, name)
	} else {
		c.nodes[name] = n
	}
	ch.node(name)
}

// setFelix records the FelixConfiguration of slot at rev (nil: deleted) and derives the tunnel
// configuration from both slots.
func (c *cache) setFelix(slot int, cfg *calico.FelixConfiguration, rev int64, ch *changes) {
	c.felix[slot] = felixEntry{rev: rev, cfg: cfg}
	if cfg == nil {
		c.felix[slot].rev = 0 // gone keys have no revision: a later create applies
	}
	tunnel := calico.EffectiveTunnelConfig(c.felix[felixDefault].cfg, c.felix[felixNode].cfg)
	var problems []calico.FieldProblem
	for _, e := range c.felix {
		if e.cfg != nil {
			problems = append(problems, e.cfg.Problems...)
		}
	}
	if tunnel == c.tunnel && slices.Equal(problems, c.tunnelProblems) {
		return
	}
	c.tunnel, c.tunnelProblems = tunnel, problems
	ch.tunnelChanged()
}

// diff records in ch everything that differs between the views old and c.
func (c *cache) diff(old *cache, ch *changes) {
	for k, h := range c.held {
		if o, ok := old.held[k]; !ok || o != h {
			ch.block(k)
		}
	}
	for k := range old.held {
		if _, ok := c.held[k]; !ok {
			ch.block(k)
		}
	}
	for i := range c.blocks.shards {
		for k, b := range c.blocks.shards[i] {
			if !old.blocks.shards[i][k].Equal(b) {
				ch.block(k)
			}
		}
		for k := range old.blocks.shards[i] {
			if _, ok := c.blocks.shards[i][k]; !ok {
				ch.block(k)
			}
		}
	}
	for n, p := range c.peers {
		if o, ok := old.peers[n]; !ok || o != p {
			ch.peer(n)
		}
	}
	for n := range old.peers {
		if _, ok := c.peers[n]; !ok {
			ch.peer(n)
		}
	}
	if !maps.EqualFunc(c.pools, old.pools, poolEqual) {
		ch.pools = true
	}
	for n, v := range c.nodes {
		if o, ok := old.nodes[n]; !ok || !nodeEqual(o, v) {
			ch.node(n)
		}
	}
	for n := range old.nodes {
		if _, ok := c.nodes[n]; !ok {
			ch.node(n)
		}
	}
	if c.tunnel != old.tunnel || !slices.Equal(c.tunnelProblems, old.tunnelProblems) {
		ch.tunnel = true
	}
}

// snapshot hands the current view out; from now on the maps are shared and copied before any change.
func (c *cache) snapshot(ch *changes, full bool, reason string) *Snapshot {
	s := &Snapshot{
		Revision: c.rev, Blocks: c.blocks.freeze(), Held: c.held, Peers: c.peers, Pools: c.pools,
		Full: full, RelistReason: reason, PoolsChanged: ch.pools, ReceivedAt: ch.received,
		Ownership: c.ownership, Problem: c.problem(),
		Nodes: c.nodes, Tunnel: c.tunnel, TunnelProblems: c.tunnelProblems, TunnelChanged: ch.tunnel,
	}
	if len(ch.blocks) > 0 {
		s.ChangedBlocks = slices.SortedFunc(maps.Keys(ch.blocks), netip.Prefix.Compare)
	}
	if len(ch.peers) > 0 {
		s.ChangedPeers = slices.SortedFunc(maps.Keys(ch.peers), strings.Compare)
	}
	if len(ch.nodes) > 0 {
		s.ChangedNodes = slices.SortedFunc(maps.Keys(ch.nodes), strings.Compare)
	}
	c.heldShared, c.peersShared, c.poolsShared, c.nodesShared = true, true, true, true
	return s
}
