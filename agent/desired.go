package agent

import (
	"cmp"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// RouteKind says why a route exists.
type RouteKind string

// Route kinds.
const (
	// KindBlock routes a whole block to the node that owns it.
	KindBlock RouteKind = "block"
	// KindBorrowed routes one address (/32 or /128) to the node that borrowed it from another's block.
	KindBorrowed RouteKind = "borrowed"
)

// DesiredRoute is one route this node must have: Prefix via NextHop, the peer IP of node Owner.
type DesiredRoute struct {
	Prefix  netip.Prefix `json:"prefix"`
	NextHop netip.Addr   `json:"next_hop"`
	Owner   string       `json:"owner"`
	// MoreNextHops are the owner's further peer IPs of the family (one per further uplink, in its
	// registration's index order) for a route without encapsulation: the agent routes over every one
	// that one of its uplinks reaches, as one ECMP route.
	MoreNextHops blockwatch.Addrs `json:"more_next_hops,omitzero"`
	Kind         RouteKind        `json:"kind"`
	// Block is the block the route comes from (equal to Prefix for KindBlock).
	Block netip.Prefix `json:"block"`
	// Encap is how the route carries packets (see encapView.of): none (via NextHop on the uplink), ipip
	// (through a tunnel to NextHop) or vxlan (via NextHop, the owner's VTEP address, through a VXLAN
	// tunnel to Underlay).
	Encap calico.Encap `json:"encap"`
	// Underlay and VTEPMAC are set for a VXLAN route: the owner's node IP from its Calico Node resource
	// (the tunnel's outer destination, felix's ParentDeviceIp) and its VTEP MAC (the static neighbour
	// of NextHop on the tunnel).
	Underlay netip.Addr `json:"underlay,omitempty"`
	VTEPMAC  calico.MAC `json:"-"`
	// EncapNote says why the route is not what the pool's mode asks for (a VXLAN route whose VTEP is
	// unknown: Hold).
	EncapNote string `json:"encap_note,omitempty"`
	// Hold says that the route cannot be built now (its owner's VTEP is unknown or malformed): the
	// agent keeps the route VPP has for the prefix, whatever it is, and adds none.
	Hold bool `json:"hold,omitempty"`
	// EncapProblem says that the block's pool has modes Calico's validator would refuse
	// (calico.IPPool.EncapProblems): the agent keeps the encapsulation the route has in VPP, and uses
	// Encap only for a route it has not programmed yet.
	EncapProblem bool `json:"encap_problem,omitempty"`
}

// Unresolved is a route this node should have but cannot program, and why.
type Unresolved struct {
	Prefix netip.Prefix `json:"prefix"`
	Owner  string       `json:"owner"`
	Kind   RouteKind    `json:"kind"`
	Block  netip.Prefix `json:"block"`
	Reason string       `json:"reason"`
	// MissingPeer is set when the reason is that Owner has no registered peer IP of the family: such a
	// route is kept in the FIB for the peer-loss grace period.
	MissingPeer bool `json:"-"`
}

// Options tell Desired whose view to compute.
type Options struct {
	// NodeName is this node: its own blocks get no route, its borrowed addresses neither.
	NodeName string
	// Pools are the managed pool CIDRs; nil means the enabled IP pools of the snapshot. Routes outside
	// every managed pool are never programmed (the agent could not recognise them as its own later).
	Pools []netip.Prefix
	// PeerIPs are this node's own peer IPs (besides those it registered in the snapshot), and
	// UplinkPrefixes its uplink's subnets: another node's peer IP equal to one of the former, or to a
	// subnet's network or broadcast address, is refused as a next hop.
	PeerIPs        []netip.Addr
	UplinkPrefixes []netip.Prefix
}

func (o Options) peerCheck() peerCheck {
	return peerCheck{node: o.NodeName, own: o.PeerIPs, subnets: o.UplinkPrefixes}
}

// encapView is what the encapsulation of a route depends on besides its block and next hop: the pools'
// modes and this node's subnets, against which CrossSubnet tests the next hop.
type encapView struct {
	pools            []encapPool // sorted by CIDR
	subnet4, subnet6 netip.Prefix
}

type encapPool struct {
	cidr    netip.Prefix
	encap   calico.PoolEncap
	problem bool
}

func (e encapView) equal(o encapView) bool {
	return slices.Equal(e.pools, o.pools) && e.subnet4 == o.subnet4 && e.subnet6 == o.subnet6
}

// newEncapView reads the pools' modes (disabled pools too: felix routes their blocks the same way) and
// this node's subnet of each family: the uplink's prefix when the agent was given its addresses, else
// the prefix of this node's address in its Calico Node resource (spec.bgp.ipv4Address, felix's own
// reading). The uplink's prefix comes first because CrossSubnet asks whether the next hop (the peer IP
// the remote agent registered) is on the uplink's link: exactly what the uplink's prefix says, where
// the Node resource can lag behind or name another interface.
func newEncapView(check peerCheck, pools map[string]calico.IPPool, nodes map[string]calico.Node) encapView {
	var e encapView
	for _, p := range pools {
		// A pool made in code without modes means Never, as calico.DecodeIPPool reads an absent one.
		p.IPIPMode = cmp.Or(p.IPIPMode, calico.EncapNever)
		p.VXLANMode = cmp.Or(p.VXLANMode, calico.EncapNever)
		e.pools = append(e.pools, encapPool{cidr: p.CIDR, encap: p.Encap(), problem: len(p.EncapProblems()) > 0})
	}
	slices.SortFunc(e.pools, func(a, b encapPool) int { return a.cidr.Compare(b.cidr) })
	for _, s := range check.subnets {
		if s.Addr().Is4() && !e.subnet4.IsValid() {
			e.subnet4 = s.Masked()
		}
		if s.Addr().Is6() && !e.subnet6.IsValid() {
			e.subnet6 = s.Masked()
		}
	}
	if n, ok := nodes[check.node]; ok {
		if !e.subnet4.IsValid() {
			e.subnet4 = n.V4.Subnet
		}
		if !e.subnet6.IsValid() {
			e.subnet6 = n.V6.Subnet
		}
	}
	return e
}

// poolOf returns the pool block lies in.
func (e encapView) poolOf(block netip.Prefix) (encapPool, bool) {
	i := slices.IndexFunc(e.pools, func(p encapPool) bool { return netaddr.Covers(p.cidr, block) })
	if i < 0 {
		return encapPool{}, false
	}
	return e.pools[i], true
}

// hasVXLAN reports whether a pool uses VXLAN: only then do the Node resources of other nodes matter.
func (e encapView) hasVXLAN() bool {
	return slices.ContainsFunc(e.pools, func(p encapPool) bool { return p.encap.Type == calico.EncapVXLAN })
}

func (e encapView) subnet(v6 bool) netip.Prefix {
	if v6 {
		return e.subnet6
	}
	return e.subnet4
}

// of returns the encapsulation of a route in block towards next hop nh: the pool's (calico.PoolEncap,
// CrossSubnet against this node's subnet).
func (e encapView) of(block netip.Prefix, nh netip.Addr) (enc calico.Encap, problem bool) {
	p, ok := e.poolOf(block)
	if !ok {
		return calico.EncapNone, false
	}
	return p.encap.Toward(e.subnet(nh.Is6()), nh), p.problem
}

// Desired computes, from a snapshot, the routes this node must have and the ones it cannot resolve, both
// sorted by prefix. It is pure.
func Desired(snap *blockwatch.Snapshot, opts Options) ([]DesiredRoute, []Unresolved) {
	v := View(snap, opts)
	return v.Desired, v.Unresolved
}

// RoutesView is everything the agent derives from one snapshot for this node: its routes, the ones it
// cannot resolve, the refused peer IPs and the held blocks, each sorted.
type RoutesView struct {
	Desired      []DesiredRoute `json:"desired"`
	Unresolved   []Unresolved   `json:"unresolved"`
	InvalidPeers []InvalidPeer  `json:"invalid_peers"`
	Held         []HeldBlock    `json:"held"`
}

// View computes the RoutesView of a snapshot. It is pure.
func View(snap *blockwatch.Snapshot, opts Options) RoutesView {
	d := newDesiredSet(opts.peerCheck())
	d.enc = newEncapView(d.check, snap.Pools, snap.Nodes)
	d.nodes = snap.Nodes
	d.reset(snap, ManagedPools(snap, opts.Pools))
	return RoutesView{Desired: d.routes(), Unresolved: d.unresolvedList(), InvalidPeers: sortedInvalid(d.invalid),
		Held: heldBlocks(snap)}
}

// ManagedPools returns the pool CIDRs the agent manages: explicit ones if given, else the CIDRs of the
// snapshot's enabled IP pools, sorted.
func ManagedPools(snap *blockwatch.Snapshot, explicit []netip.Prefix) []netip.Prefix {
	return managedPools(snap.Pools, explicit)
}

func managedPools(pools map[string]calico.IPPool, explicit []netip.Prefix) []netip.Prefix {
	if explicit != nil {
		return explicit
	}
	var out []netip.Prefix
	for _, p := range pools {
		if !p.Disabled {
			out = append(out, p.CIDR)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// disabledPools returns the CIDRs of the snapshot's disabled IP pools, sorted.
func disabledPools(snap *blockwatch.Snapshot) []netip.Prefix {
	var out []netip.Prefix
	for _, p := range snap.Pools {
		if p.Disabled {
			out = append(out, p.CIDR)
		}
	}
	slices.SortFunc(out, netip.Prefix.Compare)
	return out
}

// target is what one route prefix should look like in the FIB. route points into the blockResult the
// route comes from (routes are never modified once computed): a target costs a pointer, not a copy.
type target struct {
	route    *DesiredRoute
	resolved bool
	// missingPeer is set when the prefix is unresolved because its node has no peer IP of the prefix's
	// family.
	missingPeer peerFamily
}

// equal reports whether two targets describe the same route.
func (t target) equal(o target) bool {
	return *t.route == *o.route && t.resolved == o.resolved && t.missingPeer == o.missingPeer
}

// peerFamily is one node's registration of one address family: the unit of the peer-loss grace.
type peerFamily struct {
	node string
	ipv6 bool
}

func (p peerFamily) String() string { return p.node + "/" + netaddr.FamilyFor(p.ipv6).String() }

// registered reports whether peers hold a valid address of p's family for p's node.
func (p peerFamily) registered(peers map[string]blockwatch.Peer) bool {
	peer, ok := peers[p.node]
	if p.ipv6 {
		return ok && peer.IPv6.IsValid()
	}
	return ok && peer.IPv4.IsValid()
}

// blockResult is what one block contributes.
type blockResult struct {
	block      *blockwatch.Block
	routes     []DesiredRoute
	unresolved []Unresolved
}

// desiredSet maintains the desired routes incrementally: a changed block or peer recomputes only the
// routes it touches, and reports the route prefixes whose target changed. It is owned by one goroutine.
type desiredSet struct {
	node  string
	check peerCheck
	pools []netip.Prefix
	// enc decides each route's encapsulation; the owner sets it before a reset or begin, and resets
	// when it changes.
	enc encapView
	// nodes are the Calico Node resources (the VTEPs of VXLAN routes); the owner sets them with enc.
	nodes map[string]calico.Node
	// peers are the registered peers usable as next hops; invalid the refused addresses.
	peers   map[string]blockwatch.Peer
	invalid map[peerSlot]InvalidPeer
	// newlyInvalid lists refusals not seen before, for the agent to log; it clears it.
	newlyInvalid []InvalidPeer
	// defaultBlocks are the blocks of prefix length 0 seen so far (kept across resets, so that each is
	// reported once); newlyDefault lists those not seen before, for the agent to log and count.
	defaultBlocks map[netip.Prefix]struct{}
	newlyDefault  []netip.Prefix

	perBlock map[netip.Prefix]blockResult
	// sources maps a route prefix to the other blocks contributing a candidate for it: a block's own
	// CIDR is found in perBlock, so only borrowed addresses are here.
	sources map[netip.Prefix][]netip.Prefix
	// byNode maps a node to the blocks whose routes depend on its peer IPs (as owner or borrower), each
	// once: a slice, as a node has few blocks and a map per node would cost three times the memory.
	byNode  map[string][]netip.Prefix
	targets map[netip.Prefix]target

	// blocks counts the blocks of the view by blockKind.
	blocks          [numBlockKinds]int
	unresolvedCount int
	resolved        int // targets with resolved == true
}

// blockKind classifies a block for the vpp_route_agent_blocks gauge: per-agent totals, never a label per
// node (that would be N² series across a cluster).
type blockKind int

const (
	blockLocal   blockKind = iota // owned by this node
	blockRemote                   // owned by another node
	blockUnowned                  // owned by no node (released, load balancer)
	numBlockKinds
)

var blockKindNames = [numBlockKinds]string{"local", "remote", "unowned"}

func (d *desiredSet) kindOf(b *blockwatch.Block) blockKind {
	switch {
	case !b.Owner.IsNode():
		return blockUnowned
	case b.Owner.Node == d.node:
		return blockLocal
	default:
		return blockRemote
	}
}

func newDesiredSet(check peerCheck) *desiredSet {
	return &desiredSet{node: check.node, check: check}
}

// setPeers validates the snapshot's peers and returns the nodes whose usable peer IPs or refusals
// changed.
func (d *desiredSet) setPeers(raw map[string]blockwatch.Peer) map[string]struct{} {
	valid, invalid := d.check.validPeers(raw)
	changed := map[string]struct{}{}
	for n, p := range valid {
		if old, ok := d.peers[n]; !ok || old != p {
			changed[n] = struct{}{}
		}
	}
	for n := range d.peers {
		if _, ok := valid[n]; !ok {
			changed[n] = struct{}{}
		}
	}
	for pf, inv := range invalid {
		if old, ok := d.invalid[pf]; !ok || old != inv {
			changed[pf.node] = struct{}{}
			d.newlyInvalid = append(d.newlyInvalid, inv)
		}
	}
	for pf := range d.invalid {
		if _, ok := invalid[pf]; !ok {
			changed[pf.node] = struct{}{}
		}
	}
	d.peers, d.invalid = valid, invalid
	return changed
}

// reset rebuilds everything from a snapshot.
func (d *desiredSet) reset(snap *blockwatch.Snapshot, pools []netip.Prefix) {
	d.begin(snap.Peers, snap.Nodes, pools, snap.Blocks.Len())
	dirty := make(map[netip.Prefix]struct{}, snap.Blocks.Len())
	for cidr, b := range snap.Blocks.All() {
		d.setBlock(cidr, b, dirty)
	}
	for p := range dirty {
		d.recompute(p)
	}
}

// begin empties the set for the given peers and pools, with room for n blocks.
func (d *desiredSet) begin(peers map[string]blockwatch.Peer, nodes map[string]calico.Node, pools []netip.Prefix, n int) {
	d.pools = pools
	d.nodes = nodes
	d.setPeers(peers)
	d.perBlock = make(map[netip.Prefix]blockResult, n)
	d.sources = make(map[netip.Prefix][]netip.Prefix)
	d.byNode = make(map[string][]netip.Prefix)
	d.targets = make(map[netip.Prefix]target, n)
	d.blocks = [numBlockKinds]int{}
	d.unresolvedCount = 0
	d.resolved = 0
}

// addBlocks adds or replaces blocks (a part of a list) and returns the route prefixes whose target may
// have changed.
func (d *desiredSet) addBlocks(blocks []*blockwatch.Block) map[netip.Prefix]struct{} {
	dirty := make(map[netip.Prefix]struct{}, len(blocks))
	for _, b := range blocks {
		d.setBlock(b.CIDR, b, dirty)
	}
	for p := range dirty {
		d.recompute(p)
	}
	return dirty
}

// catchUp brings the set, built from the same pools, to snap: it recomputes the blocks whose *Block
// differs from the one it holds (or that it lacks, or that snap lacks) and those of the nodes whose
// peers changed, and reports true; or, when the pools differ, reports false and changes nothing.
func (d *desiredSet) catchUp(snap *blockwatch.Snapshot, pools []netip.Prefix) bool {
	if !slices.Equal(d.pools, pools) || d.enc.hasVXLAN() {
		return false // with VXLAN, the Nodes read while listing may have changed since
	}
	redo := make(map[netip.Prefix]struct{})
	for node := range d.setPeers(snap.Peers) {
		for _, cidr := range d.byNode[node] {
			redo[cidr] = struct{}{}
		}
	}
	for cidr, b := range snap.Blocks.All() {
		if r, ok := d.perBlock[cidr]; !ok || r.block != b {
			redo[cidr] = struct{}{}
		}
	}
	if len(d.perBlock)+len(redo) > snap.Blocks.Len() {
		for cidr := range d.perBlock {
			if snap.Blocks.Get(cidr) == nil {
				redo[cidr] = struct{}{}
			}
		}
	}
	dirty := make(map[netip.Prefix]struct{}, len(redo))
	for cidr := range redo {
		d.setBlock(cidr, snap.Blocks.Get(cidr), dirty)
	}
	for p := range dirty {
		d.recompute(p)
	}
	return true
}

// update applies an incremental snapshot and returns the route prefixes whose target may have changed.
func (d *desiredSet) update(snap *blockwatch.Snapshot) map[netip.Prefix]struct{} {
	dirty := make(map[netip.Prefix]struct{})
	redo := make(map[netip.Prefix]struct{}, len(snap.ChangedBlocks))
	for _, cidr := range snap.ChangedBlocks {
		redo[cidr] = struct{}{}
	}
	if len(snap.ChangedNodes) > 0 {
		d.nodes = snap.Nodes
		if d.enc.hasVXLAN() {
			for _, node := range snap.ChangedNodes {
				for _, cidr := range d.byNode[node] {
					redo[cidr] = struct{}{}
				}
			}
		}
	}
	if len(snap.ChangedPeers) > 0 {
		// One node's registration can change whether another's is valid (a shared address).
		for node := range d.setPeers(snap.Peers) {
			for _, cidr := range d.byNode[node] {
				redo[cidr] = struct{}{}
			}
		}
	}
	for cidr := range redo {
		d.setBlock(cidr, snap.Blocks.Get(cidr), dirty)
	}
	for p := range dirty {
		d.recompute(p)
	}
	return dirty
}

// setBlock replaces block cidr's contribution (b nil = the block is gone), marking touched prefixes dirty.
func (d *desiredSet) setBlock(cidr netip.Prefix, b *blockwatch.Block, dirty map[netip.Prefix]struct{}) {
	if old, ok := d.perBlock[cidr]; ok {
		d.forget(cidr, old, dirty)
	}
	if b == nil {
		return
	}
	r := d.compute(b)
	d.perBlock[cidr] = r
	d.blocks[d.kindOf(b)]++
	if b.Owner.IsNode() {
		d.link(b.Owner.Node, cidr)
	}
	for _, br := range b.Borrowed {
		d.link(br.Node, cidr)
	}
	for _, rt := range r.routes {
		d.addSource(rt.Prefix, cidr, dirty)
	}
	for _, u := range r.unresolved {
		d.addSource(u.Prefix, cidr, dirty)
	}
	d.unresolvedCount += len(r.unresolved)
}

func (d *desiredSet) forget(cidr netip.Prefix, old blockResult, dirty map[netip.Prefix]struct{}) {
	delete(d.perBlock, cidr)
	d.blocks[d.kindOf(old.block)]--
	if old.block.Owner.IsNode() {
		d.unlink(old.block.Owner.Node, cidr)
	}
	for _, br := range old.block.Borrowed {
		d.unlink(br.Node, cidr)
	}
	for _, rt := range old.routes {
		d.removeSource(rt.Prefix, cidr, dirty)
	}
	for _, u := range old.unresolved {
		d.removeSource(u.Prefix, cidr, dirty)
	}
	d.unresolvedCount -= len(old.unresolved)
}

func (d *desiredSet) link(node string, cidr netip.Prefix) {
	// The links of one block are made together: a second link of cidr to node is the last one.
	if s := d.byNode[node]; len(s) == 0 || s[len(s)-1] != cidr {
		d.byNode[node] = append(s, cidr)
	}
}

func (d *desiredSet) unlink(node string, cidr netip.Prefix) {
	s := d.byNode[node]
	i := slices.Index(s, cidr)
	if i < 0 {
		return
	}
	s[i] = s[len(s)-1]
	if s = s[:len(s)-1]; len(s) == 0 {
		delete(d.byNode, node)
	} else {
		d.byNode[node] = s
	}
}

func (d *desiredSet) addSource(p, cidr netip.Prefix, dirty map[netip.Prefix]struct{}) {
	dirty[p] = struct{}{}
	if p == cidr {
		return
	}
	if !slices.Contains(d.sources[p], cidr) {
		d.sources[p] = append(d.sources[p], cidr)
	}
}

func (d *desiredSet) removeSource(p, cidr netip.Prefix, dirty map[netip.Prefix]struct{}) {
	dirty[p] = struct{}{}
	if p == cidr {
		return
	}
	s := slices.DeleteFunc(d.sources[p], func(c netip.Prefix) bool { return c == cidr })
	if len(s) == 0 {
		delete(d.sources, p)
	} else {
		d.sources[p] = s
	}
}

// recompute picks the target of route prefix p among its candidates, deterministically: a resolved
// candidate beats an unresolved one, a block route beats a borrowed address, then the lower block CIDR.
func (d *desiredSet) recompute(p netip.Prefix) {
	var best target // best.route == nil: no candidate yet
	consider := func(r blockResult) {
		for i := range r.routes {
			if r.routes[i].Prefix == p {
				t := target{route: &r.routes[i], resolved: true}
				if best.route == nil || betterTarget(t, best) {
					best = t
				}
			}
		}
		for _, u := range r.unresolved {
			if u.Prefix == p {
				t := target{route: &DesiredRoute{Prefix: u.Prefix, Owner: u.Owner, Kind: u.Kind, Block: u.Block}}
				if u.MissingPeer {
					t.missingPeer = peerFamily{node: u.Owner, ipv6: u.Prefix.Addr().Is6()}
				}
				if best.route == nil || betterTarget(t, best) {
					best = t
				}
			}
		}
	}
	if r, ok := d.perBlock[p]; ok {
		consider(r)
	}
	for _, cidr := range d.sources[p] {
		if r, ok := d.perBlock[cidr]; ok {
			consider(r)
		}
	}
	if old, ok := d.targets[p]; ok && old.resolved {
		d.resolved--
	}
	if best.route == nil {
		delete(d.targets, p)
		return
	}
	d.targets[p] = best
	if best.resolved {
		d.resolved++
	}
}

func betterTarget(a, b target) bool {
	if a.resolved != b.resolved {
		return a.resolved
	}
	if a.route.Kind != b.route.Kind {
		return a.route.Kind == KindBlock
	}
	return a.route.Block.Compare(b.route.Block) < 0
}

// compute derives one block's routes (felix's rule, calico-datastore.md): the block CIDR via its owning
// node unless that is this node; each borrowed address via its borrower unless that is this node.
func (d *desiredSet) compute(b *blockwatch.Block) blockResult {
	r := blockResult{block: b}
	if b.CIDR.Bits() == 0 {
		// 0.0.0.0/0 or ::/0 would replace the node's default route: no Calico pool has blocks that
		// large (blockSize is at least 20 or 116), so such a key is a mistake, and it never becomes a
		// route, nor do its borrowed addresses.
		if _, seen := d.defaultBlocks[b.CIDR]; !seen {
			if d.defaultBlocks == nil {
				d.defaultBlocks = map[netip.Prefix]struct{}{}
			}
			d.defaultBlocks[b.CIDR] = struct{}{}
			d.newlyDefault = append(d.newlyDefault, b.CIDR)
		}
		if b.Owner.IsNode() && b.Owner.Node != d.node {
			r.unresolved = append(r.unresolved, Unresolved{Prefix: b.CIDR, Owner: b.Owner.Node, Kind: KindBlock, Block: b.CIDR,
				Reason: "a block of prefix length 0 would be a default route: never programmed"})
		}
		return r
	}
	if !inPools(d.pools, b.CIDR) {
		if b.Owner.IsNode() && b.Owner.Node != d.node {
			r.unresolved = append(r.unresolved, Unresolved{Prefix: b.CIDR, Owner: b.Owner.Node, Kind: KindBlock, Block: b.CIDR,
				Reason: "block is outside the managed pools"})
		}
		return r
	}
	if b.Owner.IsNode() && b.Owner.Node != d.node {
		d.resolve(&r, b.CIDR, b.Owner.Node, KindBlock, b.CIDR)
	}
	for _, br := range b.Borrowed {
		if br.Node == d.node {
			continue
		}
		d.resolve(&r, calico.HostPrefix(br.Addr), br.Node, KindBorrowed, b.CIDR)
	}
	return r
}

func (d *desiredSet) resolve(r *blockResult, p netip.Prefix, node string, kind RouteKind, block netip.Prefix) {
	if pool, ok := d.enc.poolOf(block); ok && pool.encap.Type == calico.EncapVXLAN && d.resolveVXLAN(r, p, node, kind, block, pool) {
		return
	}
	peer, ok := d.peers[node]
	nh := peer.IPv4
	fam := "IPv4"
	if p.Addr().Is6() {
		nh, fam = peer.IPv6, "IPv6"
	}
	if !ok || !nh.IsValid() {
		reason := fmt.Sprintf("node %q has no registered %s peer IP", node, fam)
		if inv, bad := d.invalid[peerSlot{peerFamily{node: node, ipv6: p.Addr().Is6()}, 0}]; bad {
			reason = fmt.Sprintf("node %q registered %s as its %s peer IP, which is refused: %s", node, inv.Addr, fam, inv.Reason)
		}
		r.unresolved = append(r.unresolved, Unresolved{Prefix: p, Owner: node, Kind: kind, Block: block,
			Reason: reason, MissingPeer: true})
		return
	}
	enc, problem := d.enc.of(block, nh)
	var more blockwatch.Addrs
	if enc == calico.EncapNone {
		more = peer.MoreIPv4
		if p.Addr().Is6() {
			more = peer.MoreIPv6
		}
	}
	r.routes = append(r.routes, DesiredRoute{Prefix: p, NextHop: nh, MoreNextHops: more, Owner: node, Kind: kind, Block: block,
		Encap: enc, EncapProblem: problem})
}

// resolveVXLAN routes prefix p of a VXLAN pool by felix's rule (vxlan_resolver.go): via the owner's
// VTEP address, through a VXLAN tunnel to its node IP, both from its Calico Node resource; the owner
// needs no registered peer IP (a Linux node that felix runs registers none). It reports false when the
// pool is CrossSubnet and the owner's node IP is in this node's subnet: the route is flat, via the
// registered peer IP, as in any pool. A VTEP that is absent or malformed holds the route: VPP's route
// stays as it is (never withdrawn for it), and none is added.
func (d *desiredSet) resolveVXLAN(r *blockResult, p netip.Prefix, node string, kind RouteKind, block netip.Prefix, pool encapPool) bool {
	v6 := p.Addr().Is6()
	n, known := d.nodes[node]
	var vtep calico.VTEP
	err := fmt.Errorf("node %q has no Calico Node resource: %w", node, calico.ErrNoVTEP)
	if known {
		vtep, err = n.VTEP(v6)
	}
	if err != nil {
		if pool.encap.CrossSubnet && d.sameSubnet(node, n, v6) {
			return false
		}
		if peer, registered := d.peers[node]; errors.Is(err, calico.ErrNoVTEP) && (!registered || !peer.IPv4.IsValid() && !peer.IPv6.IsValid()) {
			return false // a node known nowhere: unresolved, as any node without a registration
		}
		r.routes = append(r.routes, DesiredRoute{Prefix: p, Owner: node, Kind: kind, Block: block, Encap: calico.EncapVXLAN,
			EncapNote: "VTEP unknown, route kept as it is: " + err.Error(), Hold: true, EncapProblem: pool.problem})
		return true
	}
	if pool.encap.Toward(d.enc.subnet(v6), vtep.NodeIP) != calico.EncapVXLAN {
		return false
	}
	r.routes = append(r.routes, DesiredRoute{Prefix: p, NextHop: vtep.Addr, Owner: node, Kind: kind, Block: block,
		Encap: calico.EncapVXLAN, Underlay: vtep.NodeIP, VTEPMAC: vtep.MAC, EncapProblem: pool.problem})
	return true
}

// sameSubnet reports whether node n's address of a family (its Node resource's, else the registered
// peer IP) is in this node's subnet: a CrossSubnet VXLAN pool routes it flat, VTEP or not.
func (d *desiredSet) sameSubnet(node string, n calico.Node, v6 bool) bool {
	addr := n.Family(v6).Addr
	if !addr.IsValid() {
		peer := d.peers[node]
		addr = peer.IPv4
		if v6 {
			addr = peer.IPv6
		}
	}
	subnet := d.enc.subnet(v6)
	return addr.IsValid() && subnet.IsValid() && subnet.Contains(addr)
}

// prefixesOf returns the route prefixes that depend on node's peer IPs.
func (d *desiredSet) prefixesOf(node string) map[netip.Prefix]struct{} {
	out := make(map[netip.Prefix]struct{})
	for _, cidr := range d.byNode[node] {
		r, ok := d.perBlock[cidr]
		if !ok {
			continue
		}
		for _, rt := range r.routes {
			if rt.Owner == node {
				out[rt.Prefix] = struct{}{}
			}
		}
		for _, u := range r.unresolved {
			if u.Owner == node {
				out[u.Prefix] = struct{}{}
			}
		}
	}
	return out
}

// resolvedCount returns the number of route prefixes with a resolved target.
func (d *desiredSet) resolvedCount() int { return d.resolved }

// routes returns the resolved targets sorted by prefix.
func (d *desiredSet) routes() []DesiredRoute {
	out := make([]DesiredRoute, 0, len(d.targets))
	for _, t := range d.targets {
		if t.resolved {
			out = append(out, *t.route)
		}
	}
	slices.SortFunc(out, func(a, b DesiredRoute) int { return a.Prefix.Compare(b.Prefix) })
	return out
}

// unresolvedList returns every unresolved route of every block, sorted by prefix then block.
func (d *desiredSet) unresolvedList() []Unresolved {
	out := make([]Unresolved, 0, d.unresolvedCount)
	for _, r := range d.perBlock {
		out = append(out, r.unresolved...)
	}
	slices.SortFunc(out, func(a, b Unresolved) int {
		return cmp.Or(a.Prefix.Compare(b.Prefix), a.Block.Compare(b.Block))
	})
	return out
}

// HeldBlock is a block whose value cannot be read: the routes in the FIB inside its CIDR are kept as
// they are (or, when the agent saw a good value before, follow that last good value) until a readable
// value or a delete arrives.
type HeldBlock struct {
	Block    netip.Prefix `json:"block"`
	Reason   string       `json:"reason"`
	Revision int64        `json:"mod_revision"`
	// LastGood says that the routes follow the last good value this agent saw.
	LastGood bool `json:"last_good_value_kept"`
}

// heldBlocks lists the snapshot's held blocks sorted by CIDR.
func heldBlocks(snap *blockwatch.Snapshot) []HeldBlock {
	out := make([]HeldBlock, 0, len(snap.Held))
	for cidr, h := range snap.Held {
		out = append(out, HeldBlock{Block: cidr, Reason: h.Reason, Revision: h.Revision, LastGood: h.LastGood})
	}
	slices.SortFunc(out, func(a, b HeldBlock) int { return a.Block.Compare(b.Block) })
	return out
}
