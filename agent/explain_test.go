package agent

import (
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"

	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// TestCheckFIB: each way VPP's longest-prefix-match entry can differ from the route the agent should
// have is a disagreement with its own reason; what the agent does not program is not judged.
func TestCheckFIB(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	block := &ExplainedRoute{DesiredRoute: DesiredRoute{Prefix: pfx("10.244.1.0/26"), NextHop: addr("192.0.2.2"), Owner: "node-b", Kind: KindBlock,
		Block: pfx("10.244.1.0/26")}}
	via := func(p, nh string) vppapi.FIBEntry {
		return vppapi.FIBEntry{Prefix: pfx(p), Paths: []vppapi.Path{{NextHop: addr(nh), SwIfIndex: 1}}}
	}
	drop := vppapi.FIBEntry{Prefix: pfx("0.0.0.0/0"), Paths: []vppapi.Path{{SwIfIndex: ^uint32(0), Type: vppapi.PathDrop}}}
	local := vppapi.FIBEntry{Prefix: pfx("10.244.1.0/26"), Paths: []vppapi.Path{{SwIfIndex: 2}}}
	managed := []netip.Prefix{pfx("10.244.0.0/16")}
	q := pfx("10.244.1.7/32")
	for _, tc := range []struct {
		name string
		want NodeRoutes
		got  vppapi.FIBEntry
		v    Verdict
		why  string
	}{
		{"as it should", NodeRoutes{Forwarding: block}, via("10.244.1.0/26", "192.0.2.2"), VerdictAgrees, "as it should"},
		{"other next hop", NodeRoutes{Forwarding: block}, via("10.244.1.0/26", "192.0.2.9"), VerdictDisagrees, "not via 192.0.2.2"},
		{"foreign entry", NodeRoutes{Forwarding: block}, local, VerdictDisagrees, "foreign entry"},
		{"shadowed", NodeRoutes{Forwarding: block}, via("10.244.1.0/29", "192.0.2.9"), VerdictDisagrees, "more specific entry 10.244.1.0/29"},
		{"missing", NodeRoutes{Forwarding: block}, drop, VerdictDisagrees, "deleted behind the agent's back"},
		{"own pod", NodeRoutes{Local: true}, via("10.244.1.0/26", "192.0.2.2"), VerdictNotJudged, "the node's own"},
		{"held", NodeRoutes{Held: true}, via("10.244.1.0/26", "192.0.2.2"), VerdictNotJudged, "held block"},
		{"grace", NodeRoutes{Unresolved: []Unresolved{{Prefix: pfx("10.244.1.0/26"), Owner: "node-d", MissingPeer: true}}},
			via("10.244.1.0/26", "192.0.2.4"), VerdictNotJudged, "peer-loss grace"},
		{"stale", NodeRoutes{Why: "block 10.244.1.0/26 has no owning node"}, via("10.244.1.0/26", "192.0.2.2"), VerdictDisagrees, "should not have"},
		{"nothing expected", NodeRoutes{Why: "outside every managed IP pool"}, drop, VerdictAgrees, "no agent route expected"},
		{"outside the pools", NodeRoutes{Why: "outside every managed IP pool"}, via("10.0.0.0/8", "192.0.2.254"), VerdictAgrees, "no agent route expected"},
	} {
		v, why := CheckFIB(tc.want, q, tc.got, managed, nil)
		if v != tc.v || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %s %q, want %s %q", tc.name, v, why, tc.v, tc.why)
		}
	}
}

// TestCheckFIBECMP: a flat route of an owner with two peer IPs agrees with an ECMP entry whose paths
// go to them, and disagrees when a path goes to another address.
func TestCheckFIBECMP(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	block := &ExplainedRoute{DesiredRoute: DesiredRoute{Prefix: pfx("10.244.1.0/26"), NextHop: addr("192.0.2.2"), Owner: "node-b", Kind: KindBlock,
		Block: pfx("10.244.1.0/26"), MoreNextHops: blockwatch.MakeAddrs([]netip.Addr{addr("198.51.100.2")})}}
	ecmp := func(second string) vppapi.FIBEntry {
		return vppapi.FIBEntry{Prefix: pfx("10.244.1.0/26"), Paths: []vppapi.Path{{NextHop: addr("192.0.2.2"), SwIfIndex: 1}, {NextHop: addr(second), SwIfIndex: 2}}}
	}
	q := pfx("10.244.1.7/32")
	if v, why := CheckFIB(NodeRoutes{Forwarding: block}, q, ecmp("198.51.100.2"), nil, nil); v != VerdictAgrees {
		t.Errorf("ECMP over both peer IPs: %s %q", v, why)
	}
	if v, why := CheckFIB(NodeRoutes{Forwarding: block}, q, ecmp("198.51.100.9"), nil, nil); v != VerdictDisagrees || !strings.Contains(why, "198.51.100.9") {
		t.Errorf("a path to another address: %s %q", v, why)
	}
}

// TestCheckFIBEncap: an IPIP route agrees when VPP's path goes through the agent's IPIP tunnel to the
// route's next hop (no next hop on the path), and disagrees, naming why, when it goes flat, through a
// tunnel to another peer, through another's tunnel, or through a tunnel where a flat route is due; a
// VXLAN route's path through the agent's VXLAN tunnel may carry the peer as next hop; a route of a pool
// whose modes are in question agrees either way.
func TestCheckFIBEncap(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	route := func(e calico.Encap, problem bool) *ExplainedRoute {
		return &ExplainedRoute{DesiredRoute: DesiredRoute{Prefix: pfx("10.244.1.0/26"), NextHop: addr("198.51.100.2"), Owner: "node-b",
			Kind: KindBlock, Block: pfx("10.244.1.0/26"), Encap: e, EncapProblem: problem}}
	}
	tunnels := Tunnels{}
	tunnels.AddIPIP([]vppapi.IPIPTunnel{
		{SwIfIndex: 3, Instance: 0, Src: addr("192.0.2.1"), Dst: addr("198.51.100.2"), Tag: TunnelTag},
		{SwIfIndex: 4, Instance: 1, Src: addr("192.0.2.1"), Dst: addr("198.51.100.9"), Tag: TunnelTag},
		{SwIfIndex: 5, Instance: 7, Src: addr("192.0.2.77"), Dst: addr("198.51.100.2")}, // an operator's
	})
	tunnels[6] = Tunnel{SwIfIndex: 6, Name: "vxlan_tunnel0", Encap: calico.EncapVXLAN, Peer: addr("198.51.100.2"), Agent: true}
	through := func(idx uint32, nh string) vppapi.FIBEntry {
		p := vppapi.Path{SwIfIndex: idx}
		if nh != "" {
			p.NextHop = addr(nh)
		}
		return vppapi.FIBEntry{Prefix: pfx("10.244.1.0/26"), Paths: []vppapi.Path{p}}
	}
	q := pfx("10.244.1.7/32")
	managed := []netip.Prefix{pfx("10.244.0.0/16")}
	for _, tc := range []struct {
		name  string
		route *ExplainedRoute
		got   vppapi.FIBEntry
		v     Verdict
		why   string
	}{
		{"ipip through the agent's tunnel", route(calico.EncapIPIP, false), through(3, ""), VerdictAgrees, "through the agent's tunnel ipip0 (sw_if_index 3, IPIP to 198.51.100.2), as it should"},
		{"ipip gone flat", route(calico.EncapIPIP, false), through(1, "198.51.100.2"), VerdictDisagrees, "goes flat (via 198.51.100.2 sw_if_index 1) where IPIP through a tunnel to 198.51.100.2 is due"},
		{"ipip to another peer", route(calico.EncapIPIP, false), through(4, ""), VerdictDisagrees, "goes through tunnel ipip1 (sw_if_index 4, IPIP to 198.51.100.9), not to 198.51.100.2"},
		{"ipip through another's tunnel", route(calico.EncapIPIP, false), through(5, ""), VerdictDisagrees, "not the agent's"},
		{"ipip through an unknown interface", route(calico.EncapIPIP, false), through(9, ""), VerdictDisagrees, "foreign entry"},
		{"flat through a tunnel", route(calico.EncapNone, false), through(3, ""), VerdictDisagrees, "goes through tunnel ipip0 (sw_if_index 3, IPIP to 198.51.100.2) where a flat route via 198.51.100.2 is due"},
		{"ipip where vxlan is due", route(calico.EncapVXLAN, false), through(3, ""), VerdictDisagrees, "where VXLAN is due"},
		{"vxlan with the VTEP as next hop", route(calico.EncapVXLAN, false), through(6, "198.51.100.2"), VerdictAgrees, "vxlan_tunnel0"},
		{"in question, flat", route(calico.EncapIPIP, true), through(1, "198.51.100.2"), VerdictAgrees, "as it should"},
		{"in question, tunnelled", route(calico.EncapNone, true), through(3, ""), VerdictAgrees, "as it should"},
		{"ipip missing", route(calico.EncapIPIP, false), vppapi.FIBEntry{Prefix: pfx("0.0.0.0/0"), Paths: []vppapi.Path{{SwIfIndex: ^uint32(0), Type: vppapi.PathDrop}}},
			VerdictDisagrees, "VPP has no route 10.244.1.0/26 through the agent's tunnel ipip0"},
	} {
		v, why := CheckFIB(NodeRoutes{Forwarding: tc.route}, q, tc.got, managed, tunnels)
		if v != tc.v || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %s %q, want %s %q", tc.name, v, why, tc.v, tc.why)
		}
	}
	// A borrowed address's /32 through the agent's tunnel, as VPP dumps it: its own address as next hop.
	borrowed := &ExplainedRoute{DesiredRoute: DesiredRoute{Prefix: q, NextHop: addr("198.51.100.2"), Owner: "node-b",
		Kind: KindBorrowed, Block: pfx("10.244.1.0/26"), Encap: calico.EncapIPIP}}
	host := vppapi.FIBEntry{Prefix: q, Paths: []vppapi.Path{{NextHop: q.Addr(), SwIfIndex: 3}}}
	if v, why := CheckFIB(NodeRoutes{Forwarding: borrowed}, q, host, managed, tunnels); v != VerdictAgrees {
		t.Errorf("a borrowed /32 through the agent's tunnel, dumped via itself: %s %q, want agrees", v, why)
	}
	// Without the tunnels (the dump failed), a route through a tunnel cannot be told from a foreign one.
	if v, _ := CheckFIB(NodeRoutes{Forwarding: route(calico.EncapIPIP, false)}, q, through(3, ""), managed, nil); v != VerdictDisagrees {
		t.Errorf("without tunnels: %s, want disagrees", v)
	}
	// A stale route through the agent's tunnel is the agent's shape.
	if v, why := CheckFIB(NodeRoutes{Why: "no owning node"}, q, through(3, ""), managed, tunnels); v != VerdictDisagrees || !strings.Contains(why, "should not have") {
		t.Errorf("stale tunnel route: %s %q", v, why)
	}
}

// TestExplainEncapWhy: each route says why it has its encapsulation: the pool's modes, and for
// CrossSubnet the next hop against the node's subnet (its Calico Node's), or that the subnet is unknown.
func TestExplainEncapWhy(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	snap := snapOf([]*blockwatch.Block{
		{CIDR: pfx("10.244.1.0/26"), Owner: calico.Owner{Kind: calico.OwnerHost, Node: "b"}},
		{CIDR: pfx("10.244.2.0/26"), Owner: calico.Owner{Kind: calico.OwnerHost, Node: "c"}},
		{CIDR: pfx("10.246.1.0/26"), Owner: calico.Owner{Kind: calico.OwnerHost, Node: "b"}},
	}, map[string]blockwatch.Peer{"a": {IPv4: addr("192.0.2.1")}, "b": {IPv4: addr("198.51.100.2")}, "c": {IPv4: addr("192.0.2.3")}})
	snap.Pools = map[string]calico.IPPool{
		"cross": {Name: "cross", CIDR: pfx("10.244.0.0/16"), BlockSize: 26, IPIPMode: calico.EncapCrossSubnet, VXLANMode: calico.EncapNever},
		"flat":  {Name: "flat", CIDR: pfx("10.246.0.0/16"), BlockSize: 26, IPIPMode: calico.EncapNever, VXLANMode: calico.EncapNever},
	}
	snap.Nodes = map[string]calico.Node{"a": {Name: "a", V4: calico.NodeFamily{Subnet: pfx("192.0.2.0/24")}}}
	re := ExplainRoutes(snap, pfx("10.0.0.0/8"), Options{NodeName: "a"})
	want := map[string]string{
		"10.244.1.0/26": "pool cross has ipipMode CrossSubnet and vxlanMode Never (ipip across subnets) and peer IP 198.51.100.2 is outside the node's subnet 192.0.2.0/24: ipip",
		"10.244.2.0/26": "pool cross has ipipMode CrossSubnet and vxlanMode Never (ipip across subnets) and peer IP 192.0.2.3 is inside the node's subnet 192.0.2.0/24: no encapsulation",
		"10.246.1.0/26": "pool flat has ipipMode Never and vxlanMode Never: no encapsulation",
	}
	if len(re.This.Routes) != len(want) {
		t.Fatalf("routes %+v", re.This.Routes)
	}
	for _, r := range re.This.Routes {
		if r.EncapWhy != want[r.Prefix.String()] {
			t.Errorf("%s: encap %s because %q, want %q", r.Prefix, r.Encap, r.EncapWhy, want[r.Prefix.String()])
		}
	}
	// Node c has no Calico Node: its subnet is unknown, and CrossSubnet encapsulates.
	re = ExplainRoutes(snap, pfx("10.244.1.0/26"), Options{NodeName: "c"})
	if f := re.This.Forwarding; f == nil || f.Encap != calico.EncapIPIP || !strings.Contains(f.EncapWhy, "the node's subnet is unknown") {
		t.Errorf("node c: %+v", re.This.Forwarding)
	}
}

// TestExplainRoutesMatchesView: on random snapshots, the routes ExplainRoutes gives every node for a
// random query are exactly the routes and unresolved routes View computes for that node from the whole
// snapshot, restricted to those overlapping the query (the shortcut of viewing only the overlapping
// blocks changes nothing), and each node is in one group.
func TestExplainRoutesMatchesView(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 19))
	nodes := []string{"a", "b", "c", "d", "e"}
	for round := range 200 {
		peers := map[string]blockwatch.Peer{}
		for i, n := range nodes[:rng.IntN(len(nodes)+1)] {
			p := blockwatch.Peer{IPv4: netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)})}
			if rng.IntN(8) == 0 {
				p.IPv4 = addr("127.0.0.1") // refused
			}
			peers[n] = p
		}
		var blocks []*blockwatch.Block
		for i := range 12 {
			if rng.IntN(3) == 0 {
				continue
			}
			cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i / 4), byte(i%4) * 64}), 26)
			if i == 11 {
				cidr = pfx("10.99.0.0/26") // in the disabled pool
			}
			b := &blockwatch.Block{CIDR: cidr}
			if rng.IntN(6) != 0 {
				b.Owner = calico.Owner{Kind: calico.OwnerHost, Node: nodes[rng.IntN(len(nodes))]}
			}
			for j := rng.IntN(3); j > 0; j-- {
				ord := rng.IntN(64)
				a, _ := calico.OrdinalAddr(cidr, ord)
				n := nodes[rng.IntN(len(nodes))]
				if (b.Owner.IsNode() && n == b.Owner.Node) || slices.ContainsFunc(b.Borrowed, func(x calico.Borrowed) bool { return x.Ordinal == ord }) {
					continue
				}
				b.Borrowed = append(b.Borrowed, calico.Borrowed{Ordinal: ord, Addr: a, Node: n})
			}
			slices.SortFunc(b.Borrowed, func(x, y calico.Borrowed) int { return x.Ordinal - y.Ordinal })
			blocks = append(blocks, b)
		}
		snap := snapOf(blocks, peers)
		var q netip.Prefix
		switch rng.IntN(3) {
		case 0:
			q = pfx("10.244.0.0/16")
		case 1:
			q = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(rng.IntN(3)), byte(rng.IntN(256))}), 26).Masked()
		default:
			q = calico.HostPrefix(netip.AddrFrom4([4]byte{10, 244, byte(rng.IntN(3)), byte(rng.IntN(256))}))
		}
		this := nodes[rng.IntN(len(nodes))]
		re := ExplainRoutes(snap, q, Options{NodeName: this})
		seen := map[string]int{}
		for _, g := range re.Groups {
			for _, n := range g.Nodes {
				seen[n]++
				v := View(snap, Options{NodeName: n})
				wantR := slices.DeleteFunc(slices.Clone(v.Desired), func(r DesiredRoute) bool { return !r.Prefix.Overlaps(q) })
				wantU := slices.DeleteFunc(slices.Clone(v.Unresolved), func(u Unresolved) bool { return !u.Prefix.Overlaps(q) })
				gotR := []DesiredRoute{}
				for _, r := range g.Routes {
					gotR = append(gotR, r.DesiredRoute)
					if r.EncapWhy == "" {
						t.Fatalf("round %d, node %s: route %s has no encap_why", round, n, r.Prefix)
					}
				}
				if !reflect.DeepEqual(gotR, append([]DesiredRoute{}, wantR...)) || !reflect.DeepEqual(g.Unresolved, append([]Unresolved{}, wantU...)) {
					t.Fatalf("round %d, node %s, query %s: explain %+v %+v, view %+v %+v", round, n, q, g.Routes, g.Unresolved, wantR, wantU)
				}
				if g.Forwarding == nil && !g.Local && g.Why == "" {
					t.Fatalf("round %d, node %s, query %s: no route and no reason", round, n, q)
				}
				if n == this && !reflect.DeepEqual(g.NodeRoutes, re.This) {
					t.Fatalf("round %d: This %+v differs from %s's group %+v", round, re.This, n, g.NodeRoutes)
				}
			}
		}
		for _, n := range append(slices.Collect(maps.Keys(peers)), this) {
			if seen[n] != 1 {
				t.Fatalf("round %d: node %s in %d groups", round, n, seen[n])
			}
		}
	}
}
