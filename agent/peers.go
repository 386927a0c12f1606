package agent

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
)

// InvalidPeer is a registered peer IP that the agent refuses as a next hop, and why. The node's routes
// of that family are handled as if it had registered none (kept for the peer-loss grace, then
// withdrawn).
type InvalidPeer struct {
	Node   string     `json:"node"`
	Addr   netip.Addr `json:"address"`
	Reason string     `json:"reason"`
}

// CheckNextHop reports why a cannot be the next hop of a route to another node: it must be a unicast
// address that is routable on a link, so not unspecified, loopback, multicast, link-local, the IPv4
// limited broadcast or another reserved IPv4 range, or an IPv4-mapped IPv6 address.
func CheckNextHop(a netip.Addr) error {
	switch {
	case !a.IsValid():
		return errors.New("not an address")
	case a.Zone() != "":
		return errors.New("has a zone")
	case a.IsUnspecified():
		return errors.New("the unspecified address")
	case a.IsLoopback():
		return errors.New("a loopback address")
	case a.IsMulticast():
		return errors.New("a multicast address")
	case a.IsLinkLocalUnicast():
		return errors.New("a link-local address (not routable beyond its link, and ambiguous without an interface)")
	case a.Is4() && a.As4()[0] == 0:
		return errors.New("in 0.0.0.0/8 (\"this network\")")
	case a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return errors.New("the limited broadcast address")
	case a.Is4() && a.As4()[0] >= 240:
		return errors.New("in the reserved range 240.0.0.0/4")
	case a.Is4In6():
		return errors.New("an IPv4-mapped IPv6 address")
	}
	return nil
}

// peerCheck is what the agent knows of this node's own addressing, to refuse peer IPs that would send
// traffic to the wrong place.
type peerCheck struct {
	node string
	// own are this node's peer IPs: another node registering one of them is refused.
	own []netip.Addr
	// subnets are the uplink's prefixes: their network address (and IPv4 broadcast address) is no
	// host's.
	subnets []netip.Prefix
}

// peerSlot is one registered address of a node: its family and its place among the node's addresses
// of that family (0: the first, IPv4/IPv6 of blockwatch.Peer; then one per further uplink).
type peerSlot struct {
	peerFamily
	nth int
}

// validPeers splits the registered peers into those usable as next hops and the refused ones. Besides
// CheckNextHop and this node's own addressing, an address registered by two nodes goes to the one
// whose key is on a lease (a live agent's registration) rather than to a key without one (written by
// hand or left over), then to the one that registered it first (the lower create revision; then the
// lower name), like the node-name lock. So a leftover key holding a node's address never takes that
// address from the node when it registers again. A node's further addresses (one per further uplink)
// are judged alike, with the create revision and lease of its first one; a refused one leaves the
// others usable, in their order. It is pure.
func (pc peerCheck) validPeers(raw map[string]blockwatch.Peer) (map[string]blockwatch.Peer, map[peerSlot]InvalidPeer) {
	valid := make(map[string]blockwatch.Peer, len(raw))
	invalid := map[peerSlot]InvalidPeer{}
	own := slices.Clone(pc.own)
	if p, ok := raw[pc.node]; ok {
		own = append(own, p.IPv4s()...)
		own = append(own, p.IPv6s()...)
	}
	type claim struct {
		node    string
		leased  bool
		created int64
	}
	// before reports whether claim c takes precedence over claim f.
	before := func(c, f claim) bool {
		if c.leased != f.leased {
			return c.leased
		}
		return c.created < f.created || c.created == f.created && c.node < f.node
	}
	type family struct {
		addrs []netip.Addr
		claim
	}
	families := func(node string, p blockwatch.Peer) [2]family {
		return [2]family{{p.IPv4s(), claim{node, p.IPv4Leased, p.IPv4Created}}, {p.IPv6s(), claim{node, p.IPv6Leased, p.IPv6Created}}}
	}
	first := map[netip.Addr]claim{} // the claim of every address that takes precedence
	for node, p := range raw {
		if node == pc.node {
			continue
		}
		for _, f := range families(node, p) {
			for _, a := range f.addrs {
				if c, seen := first[a]; !seen || before(f.claim, c) {
					first[a] = f.claim
				}
			}
		}
	}
	for node, p := range raw {
		v := blockwatch.Peer{IPv4Created: p.IPv4Created, IPv6Created: p.IPv6Created, IPv4Leased: p.IPv4Leased, IPv6Leased: p.IPv6Leased,
			Gap: p.Gap, BFD: p.BFD}
		for _, f := range families(node, p) {
			var good []netip.Addr
			for nth, a := range f.addrs {
				slot := peerSlot{peerFamily{node: node, ipv6: a.Is6()}, nth}
				if reason := pc.refuse(node, a, own, first[a].node); reason != "" {
					invalid[slot] = InvalidPeer{Node: node, Addr: a, Reason: reason}
					continue
				}
				good = append(good, a)
			}
			if len(good) == 0 {
				continue
			}
			if good[0].Is6() {
				v.IPv6, v.MoreIPv6 = good[0], blockwatch.MakeAddrs(good[1:])
			} else {
				v.IPv4, v.MoreIPv4 = good[0], blockwatch.MakeAddrs(good[1:])
			}
		}
		if v.IPv4.IsValid() || v.IPv6.IsValid() {
			valid[node] = v
		}
	}
	return valid, invalid
}

// refuse says why node's registered address a is refused ("" if it is not); firstNode is the node
// whose claim of a takes precedence.
func (pc peerCheck) refuse(node string, a netip.Addr, own []netip.Addr, firstNode string) string {
	if err := CheckNextHop(a); err != nil {
		return err.Error()
	}
	if node == pc.node {
		return "" // this node's own registration: never a next hop here anyway
	}
	for _, p := range pc.subnets {
		if p.Addr().Is4() != a.Is4() || p.Bits() >= p.Addr().BitLen()-1 {
			continue // /31, /32, /127, /128: every address is a host's
		}
		if a == p.Masked().Addr() {
			return fmt.Sprintf("the network address of the uplink subnet %s", p.Masked())
		}
		if a.Is4() && a == lastAddr(p) {
			return fmt.Sprintf("the broadcast address of the uplink subnet %s", p.Masked())
		}
	}
	if slices.Contains(own, a) {
		return fmt.Sprintf("this node's (%s) own peer IP", pc.node)
	}
	if firstNode != node {
		return fmt.Sprintf("also registered by node %q, which holds it (a lease-backed registration first, then the earlier one)", firstNode)
	}
	return ""
}

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().AsSlice()
	for i := p.Bits(); i < len(b)*8; i++ {
		b[i/8] |= 1 << (7 - i%8)
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// sortedInvalid returns the refused peers sorted by node, IPv4 first.
func sortedInvalid(m map[peerSlot]InvalidPeer) []InvalidPeer {
	out := slices.Collect(maps.Values(m))
	slices.SortFunc(out, func(a, b InvalidPeer) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), a.Addr.Compare(b.Addr))
	})
	return out
}
