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
	block := &DesiredRoute{Prefix: pfx("10.244.1.0/26"), NextHop: addr("192.0.2.2"), Owner: "node-b", Kind: KindBlock, Block: pfx("10.244.1.0/26")}
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
		v, why := CheckFIB(tc.want, q, tc.got, managed)
		if v != tc.v || !strings.Contains(why, tc.why) {
			t.Errorf("%s: %s %q, want %s %q", tc.name, v, why, tc.v, tc.why)
		}
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
				if !reflect.DeepEqual(g.Routes, append([]DesiredRoute{}, wantR...)) || !reflect.DeepEqual(g.Unresolved, append([]Unresolved{}, wantU...)) {
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
