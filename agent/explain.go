package agent

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// This file answers "why this address?" for the explain subcommand: the routes every node should have
// for one address or prefix, computed by View, the agent's own computation, so that the answer can
// never disagree with what the agents do; and whether a FIB entry VPP reports for it agrees.

// ExplainedRoute is a DesiredRoute with the reason for its encapsulation.
type ExplainedRoute struct {
	DesiredRoute
	// EncapWhy says why the route has its Encap: the pool's modes and, for CrossSubnet, the next hop
	// against the node's subnet.
	EncapWhy string `json:"encap_why"`
}

// NodeRoutes is what one node's FIB should hold for a queried address or prefix.
type NodeRoutes struct {
	// Routes are the node's routes whose prefix overlaps the query, and Unresolved the routes it
	// should have there but cannot program (with the reason).
	Routes     []ExplainedRoute `json:"routes"`
	Unresolved []Unresolved     `json:"unresolved"`
	// Forwarding is the route that carries the query (the longest of Routes containing it), nil when
	// none does: then Why says why.
	Forwarding *ExplainedRoute `json:"forwarding"`
	// Local is set when the query is the node's own: in its own block and not borrowed by another
	// node, or borrowed by this node. The agent programs no route for it.
	Local bool `json:"local"`
	// Held is set when the query lies in a held block: the routes inside it stay as they are.
	Held bool   `json:"held"`
	Why  string `json:"why"`
}

// RouteGroup is a set of nodes whose FIBs should hold the same for the query.
type RouteGroup struct {
	Nodes []string `json:"nodes"`
	NodeRoutes
}

// RouteExplanation is the routes of every node for one query.
type RouteExplanation struct {
	// Groups are the nodes with identical routes, sorted by their first node; each node is in one.
	Groups []RouteGroup
	// This is the routes of Options.NodeName.
	This NodeRoutes
}

// ExplainRoutes computes, with View on the blocks of snap overlapping q, the routes every known node
// (registered, with a Calico Node, owning or borrowing in those blocks, and opts.NodeName) should have
// for q. opts.NodeName is taken as the node of each view in turn; PeerIPs and UplinkPrefixes apply to
// every node alike. It is pure.
func ExplainRoutes(snap *blockwatch.Snapshot, q netip.Prefix, opts Options) RouteExplanation {
	blocks := map[netip.Prefix]*blockwatch.Block{}
	nodes := map[string]struct{}{opts.NodeName: {}}
	for cidr, b := range snap.Blocks.All() {
		if !cidr.Overlaps(q) {
			continue
		}
		blocks[cidr] = b
		if b.Owner.IsNode() {
			nodes[b.Owner.Node] = struct{}{}
		}
		for _, br := range b.Borrowed {
			nodes[br.Node] = struct{}{}
		}
	}
	for n := range snap.Peers {
		nodes[n] = struct{}{}
	}
	for n := range snap.Nodes {
		nodes[n] = struct{}{}
	}
	sub := *snap
	sub.Blocks = blockwatch.BlocksOf(blocks)

	var out RouteExplanation
	byKey := map[string]int{}
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		o := opts
		o.NodeName = n
		nr := nodeRoutes(&sub, q, o)
		if n == opts.NodeName {
			out.This = nr
		}
		key, _ := json.Marshal(nr)
		if i, ok := byKey[string(key)]; ok {
			out.Groups[i].Nodes = append(out.Groups[i].Nodes, n)
			continue
		}
		byKey[string(key)] = len(out.Groups)
		out.Groups = append(out.Groups, RouteGroup{Nodes: []string{n}, NodeRoutes: nr})
	}
	return out
}

// nodeRoutes is one node's NodeRoutes for q, from a snapshot holding only the blocks overlapping q.
func nodeRoutes(snap *blockwatch.Snapshot, q netip.Prefix, opts Options) NodeRoutes {
	v := View(snap, opts)
	enc := newEncapView(opts.peerCheck(), snap.Pools, snap.Nodes)
	nr := NodeRoutes{Routes: []ExplainedRoute{}, Unresolved: []Unresolved{}}
	for _, r := range v.Desired {
		if r.Prefix.Overlaps(q) {
			nr.Routes = append(nr.Routes, ExplainedRoute{DesiredRoute: r, EncapWhy: encapWhy(snap, enc, r)})
		}
	}
	for _, u := range v.Unresolved {
		if u.Prefix.Overlaps(q) {
			nr.Unresolved = append(nr.Unresolved, u)
		}
	}
	block := containing(snap, q)
	if block != nil {
		nr.Local, nr.Why = localTo(block, q, opts.NodeName)
	}
	if !nr.Local {
		for i := range nr.Routes {
			if r := &nr.Routes[i]; netaddr.Covers(r.Prefix, q) && (nr.Forwarding == nil || r.Prefix.Bits() > nr.Forwarding.Prefix.Bits()) {
				nr.Forwarding = r
			}
		}
	}
	if nr.Forwarding != nil || nr.Local {
		return nr
	}
	nr.Why, nr.Held = whyNoRoute(snap, q, block, nr.Unresolved, opts)
	return nr
}

// encapWhy says why r has its encapsulation, for a node whose encapView is e: the pool's modes (as
// calico.IPPool.Encap reads them) and, for a CrossSubnet pool, the next hop against the node's subnet.
func encapWhy(snap *blockwatch.Snapshot, e encapView, r DesiredRoute) string {
	var pool *calico.IPPool
	for _, name := range slices.Sorted(maps.Keys(snap.Pools)) {
		if p := snap.Pools[name]; netaddr.Covers(p.CIDR, r.Block) {
			pool = &p
			break
		}
	}
	if pool == nil {
		return "no IP pool contains block " + r.Block.String() + ": no encapsulation"
	}
	pe := pool.Encap()
	ipip, vxlan := cmp.Or(pool.IPIPMode, calico.EncapNever), cmp.Or(pool.VXLANMode, calico.EncapNever)
	var why string
	switch {
	case pe.Type == calico.EncapNone && ipip != calico.EncapNever && pool.CIDR.Addr().Is6():
		why = fmt.Sprintf("pool %s is IPv6 (its ipipMode %s is ignored: IPIP is IPv4 only) and has vxlanMode %s: no encapsulation", pool.Name, ipip, vxlan)
	case pe.Type == calico.EncapNone:
		why = fmt.Sprintf("pool %s has ipipMode %s and vxlanMode %s: no encapsulation", pool.Name, ipip, vxlan)
	default:
		mode := fmt.Sprintf("pool %s has ipipMode %s and vxlanMode %s (%s", pool.Name, ipip, vxlan, pe.Type)
		if !pe.CrossSubnet {
			why = mode + " always)"
			break
		}
		subnet := e.subnet4
		if r.NextHop.Is6() {
			subnet = e.subnet6
		}
		switch {
		case !subnet.IsValid():
			why = fmt.Sprintf("%s across subnets) and the node's subnet is unknown (no uplink address, no address in its Calico Node): %s to %s",
				mode, pe.Type, r.NextHop)
		case calico.SameSubnet(subnet, r.NextHop):
			why = fmt.Sprintf("%s across subnets) and peer IP %s is inside the node's subnet %s: no encapsulation", mode, r.NextHop, subnet)
		default:
			why = fmt.Sprintf("%s across subnets) and peer IP %s is outside the node's subnet %s: %s", mode, r.NextHop, subnet, pe.Type)
		}
	}
	if r.EncapNote != "" {
		why += "; " + r.EncapNote
	}
	if r.EncapProblem {
		why += "; the pool's modes are in question (Calico would refuse them): the agent keeps the encapsulation the route has in VPP"
	}
	return why
}

// containing returns the block that contains q, preferring the longest (blocks do not overlap unless
// a writer erred), nil if none does.
func containing(snap *blockwatch.Snapshot, q netip.Prefix) *blockwatch.Block {
	var best *blockwatch.Block
	for cidr, b := range snap.Blocks.All() {
		if netaddr.Covers(cidr, q) && (best == nil || cidr.Bits() > best.CIDR.Bits()) {
			best = b
		}
	}
	return best
}

// localTo reports whether the address q (a host prefix) is node's own: in its block and not
// borrowed, or borrowed by it. A wider query is local when it lies in node's own block.
func localTo(b *blockwatch.Block, q netip.Prefix, node string) (bool, string) {
	if q.IsSingleIP() {
		for _, br := range b.Borrowed {
			if br.Addr == q.Addr() {
				if br.Node == node {
					return true, fmt.Sprintf("its own pod's address, borrowed from block %s: local", b.CIDR)
				}
				return false, ""
			}
		}
	}
	if b.Owner.IsNode() && b.Owner.Node == node {
		return true, fmt.Sprintf("its own block %s: local", b.CIDR)
	}
	return false, ""
}

// whyNoRoute says why no route carries q on a node that is not its owner.
func whyNoRoute(snap *blockwatch.Snapshot, q netip.Prefix, block *blockwatch.Block, unresolved []Unresolved, opts Options) (why string, held bool) {
	var best *Unresolved
	for i := range unresolved {
		if u := &unresolved[i]; netaddr.Covers(u.Prefix, q) && (best == nil || u.Prefix.Bits() > best.Prefix.Bits()) {
			best = u
		}
	}
	if best != nil {
		return fmt.Sprintf("%s (%s of %s) is unresolved: %s", best.Prefix, best.Kind, best.Owner, best.Reason), false
	}
	for cidr, h := range snap.Held {
		if netaddr.Covers(cidr, q) {
			return fmt.Sprintf("block %s is held (its value cannot be read: %s): the routes inside it stay as they are", cidr, h.Reason), true
		}
	}
	if block != nil {
		switch {
		case block.Owner.Kind == calico.OwnerVirtual:
			return fmt.Sprintf("block %s belongs to virtual owner %q, not a node (felix's rule)", block.CIDR, block.Owner.Node), false
		case !block.Owner.IsNode():
			return fmt.Sprintf("block %s has no owning node (affinity null or unreadable)", block.CIDR), false
		}
		return "no route computed", false
	}
	pools := ManagedPools(snap, opts.Pools)
	if !inPools(pools, q) {
		for _, p := range snap.Pools {
			if netaddr.Covers(p.CIDR, q) {
				return fmt.Sprintf("pool %s (%s) is not managed (disabled, or not in --pool-cidr)", p.Name, p.CIDR), false
			}
		}
		return "outside every managed IP pool", false
	}
	if q.IsSingleIP() {
		return "no block contains it: not allocated", false
	}
	return "no single route carries the whole prefix; the routes inside it are listed", false
}

// Verdict is how a FIB entry compares with what the agent should have programmed.
type Verdict string

// Verdicts of CheckFIB.
const (
	VerdictAgrees    Verdict = "agrees"
	VerdictDisagrees Verdict = "disagrees"
	// VerdictNotJudged: nothing is expected of the agent for the query (its own pods, a held block,
	// a route kept for the peer-loss grace): the FIB entry is shown, not judged.
	VerdictNotJudged Verdict = "not-judged"
)

// Tunnel is a tunnel interface of this node's VPP as CheckFIB judges a path through it: its
// encapsulation, its peer (outer destination) and whether it is the agent's (tagged TunnelTag).
type Tunnel struct {
	SwIfIndex uint32       `json:"sw_if_index"`
	Name      string       `json:"name"`
	Encap     calico.Encap `json:"encap"`
	Source    netip.Addr   `json:"source"`
	Peer      netip.Addr   `json:"peer"`
	Agent     bool         `json:"agent"`
}

func (t Tunnel) String() string {
	return fmt.Sprintf("%s (sw_if_index %d, %s to %s)", t.Name, t.SwIfIndex, strings.ToUpper(t.Encap.String()), t.Peer)
}

// Tunnels are this node's VPP's tunnels by sw_if_index.
type Tunnels map[uint32]Tunnel

// AddIPIP adds VPP's IPIP tunnels (vppapi.Client.DumpIPIPTunnels).
func (ts Tunnels) AddIPIP(tunnels []vppapi.IPIPTunnel) {
	for _, t := range tunnels {
		ts[t.SwIfIndex] = Tunnel{SwIfIndex: t.SwIfIndex, Name: t.Name(), Encap: calico.EncapIPIP, Source: t.Src, Peer: t.Dst,
			Agent: t.Tag == TunnelTag}
	}
}

// AddVXLAN adds VPP's VXLAN tunnels (vppapi.Client.DumpVXLANTunnels).
func (ts Tunnels) AddVXLAN(tunnels []vppapi.VXLANTunnel) {
	for _, t := range tunnels {
		ts[t.SwIfIndex] = Tunnel{SwIfIndex: t.SwIfIndex, Name: t.Name(), Encap: calico.EncapVXLAN, Source: t.Src, Peer: t.Dst,
			Agent: t.Tag == TunnelTag}
	}
}

// To returns the agent's tunnel of encapsulation e to peer (the lowest sw_if_index if, with a stale
// source, there are several); false when VPP has none.
func (ts Tunnels) To(e calico.Encap, peer netip.Addr) (Tunnel, bool) {
	var best Tunnel
	found := false
	for _, t := range ts {
		if t.Agent && t.Encap == e && t.Peer == peer && (!found || t.SwIfIndex < best.SwIfIndex) {
			best, found = t, true
		}
	}
	return best, found
}

// CheckFIB compares got, VPP's longest-prefix-match entry for q (ip_route_lookup), with what this node
// should have (want, its NodeRoutes), and says why in one sentence. tunnels are VPP's tunnels: a path
// through the agent's tunnel to a route's next hop is how an encapsulated route looks (no next hop for
// IPIP). managed are the managed pools (ManagedPools): an entry shaped like the agent's (every path via
// a next hop or through the agent's tunnel) inside them that the agent should not have is stale.
func CheckFIB(want NodeRoutes, q netip.Prefix, got vppapi.FIBEntry, managed []netip.Prefix, tunnels Tunnels) (Verdict, string) {
	got = ipipHostPath(got, func(idx uint32) bool { return tunnels[idx].Encap == calico.EncapIPIP })
	agentShaped := len(got.Paths) > 0
	for _, p := range got.Paths {
		t, isTunnel := tunnels[p.SwIfIndex]
		if p.Type != vppapi.PathNormal || !(p.NextHop.IsValid() || isTunnel && t.Agent) {
			agentShaped = false
		}
	}
	paths := pathsString(got.Paths, tunnels)
	if f := want.Forwarding; f != nil {
		ok, how := pathsAre(got.Paths, f.DesiredRoute, tunnels)
		should := expected(f.DesiredRoute, tunnels)
		switch {
		case got.Prefix == f.Prefix && ok:
			return VerdictAgrees, fmt.Sprintf("VPP forwards it by %s %s, as it should", got.Prefix, should)
		case got.Prefix == f.Prefix && agentShaped:
			return VerdictDisagrees, fmt.Sprintf("VPP's %s %s (%s of %s): changed behind the agent's back, or the agent has not caught up",
				got.Prefix, how, f.Kind, f.Owner)
		case got.Prefix == f.Prefix:
			return VerdictDisagrees, fmt.Sprintf("VPP's entry for %s is not the agent's (%s): a foreign entry, which the agent leaves alone", got.Prefix, paths)
		case got.Prefix.Bits() > f.Prefix.Bits():
			return VerdictDisagrees, fmt.Sprintf("a more specific entry %s (%s) shadows %s %s", got.Prefix, paths, f.Prefix, should)
		default:
			return VerdictDisagrees, fmt.Sprintf("VPP has no route %s %s: the lookup falls to %s (%s); deleted behind the agent's back, or the agent is not running or not ready",
				f.Prefix, should, got.Prefix, paths)
		}
	}
	if want.Local {
		return VerdictNotJudged, fmt.Sprintf("the node's own: VPP forwards it by %s (%s), which the agent does not program", got.Prefix, paths)
	}
	for _, u := range want.Unresolved {
		if netaddr.Covers(u.Prefix, q) && u.MissingPeer {
			return VerdictNotJudged, fmt.Sprintf("VPP forwards it by %s (%s); a route to an unregistered node is kept for the peer-loss grace period, then deleted", got.Prefix, paths)
		}
	}
	if want.Held {
		return VerdictNotJudged, fmt.Sprintf("VPP forwards it by %s (%s); routes inside a held block stay as they are", got.Prefix, paths)
	}
	for _, r := range want.Routes {
		if r.Prefix == got.Prefix {
			// A route the agent should have, more specific than the query (a prefix query).
			if ok, how := pathsAre(got.Paths, r.DesiredRoute, tunnels); !ok {
				return VerdictDisagrees, fmt.Sprintf("VPP's %s %s", got.Prefix, how)
			}
			return VerdictAgrees, fmt.Sprintf("VPP's %s %s is the agent's route, as it should be", got.Prefix, expected(r.DesiredRoute, tunnels))
		}
	}
	if agentShaped && inPools(managed, got.Prefix) && len(want.Unresolved) == 0 {
		return VerdictDisagrees, fmt.Sprintf("VPP forwards it by %s (%s), a route the agent should not have: stale, or written by another client", got.Prefix, paths)
	}
	return VerdictAgrees, fmt.Sprintf("no agent route expected; VPP forwards it by %s (%s)", got.Prefix, paths)
}

// pathsAre reports whether paths forward as r should: via r.NextHop on an interface that is no tunnel
// for a flat route; through the agent's tunnel of r.Encap to r.NextHop for an encapsulated one, with no
// next hop (IPIP) or r.NextHop (VXLAN, whose next hop is the remote VTEP); either when r's pool's modes
// are in question (the agent keeps the encapsulation a route has). A flat route may have a path to each of
// the owner's peer IPs (r.MoreNextHops: ECMP over several uplinks). Else it says how they differ.
func pathsAre(paths []vppapi.Path, r DesiredRoute, tunnels Tunnels) (bool, string) {
	if len(paths) == 0 {
		return false, "has no path"
	}
	due := strings.ToUpper(r.Encap.String())
	for _, p := range paths {
		t, isTunnel := tunnels[p.SwIfIndex]
		switch {
		case p.Type != vppapi.PathNormal:
			return false, fmt.Sprintf("has a %s path, not %s", p, expected(r, tunnels))
		case p.NextHop.IsValid() && p.NextHop != r.NextHop && !slices.Contains(r.MoreNextHops.All(), p.NextHop):
			// An ECMP route's further paths go to the owner's further peer IPs (one per uplink).
			return false, fmt.Sprintf("goes %s, not %s", pathString(p, tunnels), expected(r, tunnels))
		case !isTunnel && r.Encap != calico.EncapNone && !r.EncapProblem:
			return false, fmt.Sprintf("goes flat (%s) where %s through a tunnel to %s is due", pathString(p, tunnels), due, r.NextHop)
		case !isTunnel && !p.NextHop.IsValid():
			return false, fmt.Sprintf("goes %s (no next hop, not a tunnel), not %s", pathString(p, tunnels), expected(r, tunnels))
		case isTunnel && r.Encap == calico.EncapNone && !r.EncapProblem:
			return false, fmt.Sprintf("goes through tunnel %s where a flat route via %s is due", t, r.NextHop)
		case isTunnel && r.Encap != calico.EncapNone && t.Encap != r.Encap:
			return false, fmt.Sprintf("goes through tunnel %s where %s is due", t, due)
		case isTunnel && t.Peer != r.NextHop:
			return false, fmt.Sprintf("goes through tunnel %s, not to %s", t, r.NextHop)
		case isTunnel && !t.Agent:
			return false, fmt.Sprintf("goes through tunnel %s, which is not the agent's (no %q tag)", t, TunnelTag)
		}
	}
	return true, ""
}

// expected says how r should forward on this node: "via NH" or "through the agent's IPIP tunnel ...".
func expected(r DesiredRoute, tunnels Tunnels) string {
	if r.Encap == calico.EncapNone {
		return "via " + r.NextHop.String()
	}
	if t, ok := tunnels.To(r.Encap, r.NextHop); ok {
		return "through the agent's tunnel " + t.String()
	}
	return fmt.Sprintf("through an %s tunnel to %s (VPP has none of the agent's)", strings.ToUpper(r.Encap.String()), r.NextHop)
}

func pathString(p vppapi.Path, tunnels Tunnels) string {
	if t, ok := tunnels[p.SwIfIndex]; ok {
		s := "through " + t.String()
		if p.NextHop.IsValid() {
			s += " via " + p.NextHop.String()
		}
		return s
	}
	return p.String()
}

func pathsString(paths []vppapi.Path, tunnels Tunnels) string {
	if len(paths) == 0 {
		return "no path"
	}
	s := make([]string, len(paths))
	for i, p := range paths {
		s[i] = pathString(p, tunnels)
	}
	return strings.Join(s, ", ")
}
