package agent

import (
	"encoding/json"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// This file answers "why this address?" for the explain subcommand: the routes every node should have
// for one address or prefix, computed by View, the agent's own computation, so that the answer can
// never disagree with what the agents do; and whether a FIB entry VPP reports for it agrees.

// NodeRoutes is what one node's FIB should hold for a queried address or prefix.
type NodeRoutes struct {
	// Routes are the node's routes whose prefix overlaps the query, and Unresolved the routes it
	// should have there but cannot program (with the reason).
	Routes     []DesiredRoute `json:"routes"`
	Unresolved []Unresolved   `json:"unresolved"`
	// Forwarding is the route that carries the query (the longest of Routes containing it), nil when
	// none does: then Why says why.
	Forwarding *DesiredRoute `json:"forwarding"`
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
	nr := NodeRoutes{Routes: []DesiredRoute{}, Unresolved: []Unresolved{}}
	for _, r := range v.Desired {
		if r.Prefix.Overlaps(q) {
			nr.Routes = append(nr.Routes, r)
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
			if r := &nr.Routes[i]; covers(r.Prefix, q) && (nr.Forwarding == nil || r.Prefix.Bits() > nr.Forwarding.Prefix.Bits()) {
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

// covers reports whether p contains all of q.
func covers(p, q netip.Prefix) bool { return p.Bits() <= q.Bits() && p.Contains(q.Addr()) }

// containing returns the block that contains q, preferring the longest (blocks do not overlap unless
// a writer erred), nil if none does.
func containing(snap *blockwatch.Snapshot, q netip.Prefix) *blockwatch.Block {
	var best *blockwatch.Block
	for cidr, b := range snap.Blocks.All() {
		if covers(cidr, q) && (best == nil || cidr.Bits() > best.CIDR.Bits()) {
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
		if u := &unresolved[i]; covers(u.Prefix, q) && (best == nil || u.Prefix.Bits() > best.Prefix.Bits()) {
			best = u
		}
	}
	if best != nil {
		return fmt.Sprintf("%s (%s of %s) is unresolved: %s", best.Prefix, best.Kind, best.Owner, best.Reason), false
	}
	for cidr, h := range snap.Held {
		if covers(cidr, q) {
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
			if covers(p.CIDR, q) {
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

// CheckFIB compares got, VPP's longest-prefix-match entry for q (ip_route_lookup), with what this node
// should have (want, its NodeRoutes), and says why in one sentence. managed are the managed pools
// (ManagedPools): an entry shaped like the agent's (every path via a next hop) inside them that the
// agent should not have is stale.
func CheckFIB(want NodeRoutes, q netip.Prefix, got vppapi.FIBEntry, managed []netip.Prefix) (Verdict, string) {
	agentShaped := len(got.Paths) > 0
	for _, p := range got.Paths {
		if p.Type != vppapi.PathNormal || !p.NextHop.IsValid() {
			agentShaped = false
		}
	}
	paths := pathsString(got.Paths)
	if f := want.Forwarding; f != nil {
		switch {
		case got.Prefix == f.Prefix && agentShaped && allVia(got.Paths, f.NextHop):
			return VerdictAgrees, fmt.Sprintf("VPP forwards it by %s via %s, as it should", got.Prefix, f.NextHop)
		case got.Prefix == f.Prefix && agentShaped:
			return VerdictDisagrees, fmt.Sprintf("VPP's %s goes %s, not via %s (%s of %s): changed behind the agent's back, or the agent has not caught up",
				got.Prefix, paths, f.NextHop, f.Kind, f.Owner)
		case got.Prefix == f.Prefix:
			return VerdictDisagrees, fmt.Sprintf("VPP's entry for %s is not the agent's (%s): a foreign entry, which the agent leaves alone", got.Prefix, paths)
		case got.Prefix.Bits() > f.Prefix.Bits():
			return VerdictDisagrees, fmt.Sprintf("a more specific entry %s (%s) shadows %s via %s", got.Prefix, paths, f.Prefix, f.NextHop)
		default:
			return VerdictDisagrees, fmt.Sprintf("VPP has no route %s via %s: the lookup falls to %s (%s); deleted behind the agent's back, or the agent is not running or not ready",
				f.Prefix, f.NextHop, got.Prefix, paths)
		}
	}
	if want.Local {
		return VerdictNotJudged, fmt.Sprintf("the node's own: VPP forwards it by %s (%s), which the agent does not program", got.Prefix, paths)
	}
	for _, u := range want.Unresolved {
		if covers(u.Prefix, q) && u.MissingPeer {
			return VerdictNotJudged, fmt.Sprintf("VPP forwards it by %s (%s); a route to an unregistered node is kept for the peer-loss grace period, then deleted", got.Prefix, paths)
		}
	}
	if want.Held {
		return VerdictNotJudged, fmt.Sprintf("VPP forwards it by %s (%s); routes inside a held block stay as they are", got.Prefix, paths)
	}
	for _, r := range want.Routes {
		if r.Prefix == got.Prefix {
			// A route the agent should have, more specific than the query (a prefix query).
			if agentShaped && allVia(got.Paths, r.NextHop) {
				return VerdictAgrees, fmt.Sprintf("VPP's %s via %s is the agent's route, as it should be", got.Prefix, r.NextHop)
			}
			return VerdictDisagrees, fmt.Sprintf("VPP's %s goes %s, not via %s", got.Prefix, paths, r.NextHop)
		}
	}
	if agentShaped && inPools(managed, got.Prefix) && len(want.Unresolved) == 0 {
		return VerdictDisagrees, fmt.Sprintf("VPP forwards it by %s (%s), a route the agent should not have: stale, or written by another client", got.Prefix, paths)
	}
	return VerdictAgrees, fmt.Sprintf("no agent route expected; VPP forwards it by %s (%s)", got.Prefix, paths)
}

func allVia(paths []vppapi.Path, nh netip.Addr) bool {
	for _, p := range paths {
		if p.NextHop != nh {
			return false
		}
	}
	return len(paths) > 0
}

func pathsString(paths []vppapi.Path) string {
	if len(paths) == 0 {
		return "no path"
	}
	s := make([]string, len(paths))
	for i, p := range paths {
		s[i] = p.String()
	}
	return strings.Join(s, ", ")
}
