package agent

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

var (
	pfx  = netip.MustParsePrefix
	addr = netip.MustParseAddr
)

func hostBlock(cidr, owner string, borrowed ...calico.Borrowed) *blockwatch.Block {
	return &blockwatch.Block{CIDR: pfx(cidr), Owner: calico.Owner{Kind: calico.OwnerHost, Node: owner}, Borrowed: borrowed}
}

func snapOf(blocks []*blockwatch.Block, peers map[string]blockwatch.Peer) *blockwatch.Snapshot {
	s := &blockwatch.Snapshot{Peers: peers, Full: true,
		Pools: map[string]calico.IPPool{
			"v4":       {Name: "v4", CIDR: pfx("10.244.0.0/16"), BlockSize: 26},
			"v6":       {Name: "v6", CIDR: pfx("fd00:10:244::/48"), BlockSize: 122},
			"disabled": {Name: "disabled", CIDR: pfx("10.99.0.0/16"), BlockSize: 26, Disabled: true},
		}}
	m := map[netip.Prefix]*blockwatch.Block{}
	for _, b := range blocks {
		m[b.CIDR] = b
	}
	s.Blocks = blockwatch.BlocksOf(m)
	return s
}

func TestDesiredFelixRule(t *testing.T) {
	peers := map[string]blockwatch.Peer{
		"a": {IPv4: addr("192.0.2.1"), IPv6: addr("2001:db8::1")},
		"b": {IPv4: addr("192.0.2.2"), IPv6: addr("2001:db8::2")},
		"c": {IPv4: addr("192.0.2.3")},
	}
	snap := snapOf([]*blockwatch.Block{
		hostBlock("10.244.1.0/26", "a"), // this node's own block: no route
		hostBlock("10.244.1.64/26", "b", // remote block with an address borrowed by a, one by c
			calico.Borrowed{Ordinal: 4, Addr: addr("10.244.1.68"), Node: "a"},
			calico.Borrowed{Ordinal: 5, Addr: addr("10.244.1.69"), Node: "c"}),
		hostBlock("10.244.2.0/26", "a", // own block with an address borrowed by b
			calico.Borrowed{Ordinal: 1, Addr: addr("10.244.2.1"), Node: "b"}),
		hostBlock("fd00:10:244::40/122", "b"),
		hostBlock("fd00:10:244::80/122", "c"), // c has no IPv6 peer IP
		hostBlock("10.244.3.0/26", "gone"),    // owner not registered
		hostBlock("10.99.0.0/26", "b"),        // in a disabled pool
		hostBlock("172.31.0.0/26", "b"),       // outside every pool
		{CIDR: pfx("10.244.4.0/26"), Owner: calico.Owner{Kind: calico.OwnerVirtual, Node: "lb"}},
		{CIDR: pfx("10.244.5.0/26")}, // no owner
		{CIDR: pfx("10.244.6.0/26"), Owner: calico.Owner{Kind: calico.OwnerLegacyHost, Node: "b"}},
	}, peers)
	routes, unresolved := Desired(snap, Options{NodeName: "a"})
	want := []DesiredRoute{
		{Prefix: pfx("10.244.1.64/26"), NextHop: addr("192.0.2.2"), Owner: "b", Kind: KindBlock, Block: pfx("10.244.1.64/26")},
		{Prefix: pfx("10.244.1.69/32"), NextHop: addr("192.0.2.3"), Owner: "c", Kind: KindBorrowed, Block: pfx("10.244.1.64/26")},
		{Prefix: pfx("10.244.2.1/32"), NextHop: addr("192.0.2.2"), Owner: "b", Kind: KindBorrowed, Block: pfx("10.244.2.0/26")},
		{Prefix: pfx("10.244.6.0/26"), NextHop: addr("192.0.2.2"), Owner: "b", Kind: KindBlock, Block: pfx("10.244.6.0/26")},
		{Prefix: pfx("fd00:10:244::40/122"), NextHop: addr("2001:db8::2"), Owner: "b", Kind: KindBlock, Block: pfx("fd00:10:244::40/122")},
	}
	if !reflect.DeepEqual(routes, want) {
		t.Errorf("routes:\n got %+v\nwant %+v", routes, want)
	}
	var got []string
	for _, u := range unresolved {
		got = append(got, fmt.Sprintf("%s %s %v: %s", u.Prefix, u.Owner, u.MissingPeer, u.Reason))
	}
	wantU := []string{
		`10.99.0.0/26 b false: block is outside the managed pools`,
		`10.244.3.0/26 gone true: node "gone" has no registered IPv4 peer IP`,
		`172.31.0.0/26 b false: block is outside the managed pools`,
		`fd00:10:244::80/122 c true: node "c" has no registered IPv6 peer IP`,
	}
	if !reflect.DeepEqual(got, wantU) {
		t.Errorf("unresolved:\n got %q\nwant %q", got, wantU)
	}

	// Explicit pools override the snapshot's.
	routes, _ = Desired(snap, Options{NodeName: "a", Pools: []netip.Prefix{pfx("172.31.0.0/16")}})
	if len(routes) != 1 || routes[0].Prefix != pfx("172.31.0.0/26") {
		t.Errorf("with explicit pools: %+v", routes)
	}
}

func TestDesiredConflictIsDeterministic(t *testing.T) {
	peers := map[string]blockwatch.Peer{"b": {IPv4: addr("192.0.2.2")}, "c": {IPv4: addr("192.0.2.3")}}
	// A /32 block owned by c and the same address borrowed by b from a bigger block: the block wins.
	blocks := []*blockwatch.Block{
		hostBlock("10.244.1.0/24", "x", calico.Borrowed{Ordinal: 5, Addr: addr("10.244.1.5"), Node: "b"}),
		hostBlock("10.244.1.5/32", "c"),
	}
	for i := 0; i < 2; i++ {
		slices.Reverse(blocks)
		routes, _ := Desired(snapOf(blocks, peers), Options{NodeName: "a"})
		var hit []DesiredRoute
		for _, r := range routes {
			if r.Prefix == pfx("10.244.1.5/32") {
				hit = append(hit, r)
			}
		}
		if len(hit) != 1 || hit[0].Owner != "c" || hit[0].Kind != KindBlock {
			t.Fatalf("conflict resolved to %+v", hit)
		}
	}
}

// TestDesiredIncrementalMatchesRebuild drives the incremental set with random block and peer changes
// and checks after each step that it equals a set rebuilt from scratch, and that every prefix whose
// target changed was reported dirty; and that a set built from the parts of an older snapshot and
// then caught up with the current one (as the agent's first list does) equals it too.
func TestDesiredIncrementalMatchesRebuild(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	nodes := []string{"a", "b", "c", "d"}
	cidrs := make([]netip.Prefix, 40)
	for i := range cidrs {
		if i%4 == 3 {
			cidrs[i] = netip.PrefixFrom(netip.AddrFrom16([16]byte{0xfd, 0, 0, 0x10, 0x02, 0x44, 15: byte(i * 64)}), 122)
		} else {
			cidrs[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i), 0}), 26)
		}
	}
	cur := snapOf(nil, map[string]blockwatch.Peer{})
	var past []*blockwatch.Snapshot // the last few snapshots
	inc := newDesiredSet(peerCheck{node: "a"})
	inc.reset(cur, ManagedPools(cur, nil))
	for step := 0; step < 2000; step++ {
		blocks := cur.Blocks.Map()
		next := &blockwatch.Snapshot{Peers: maps.Clone(cur.Peers), Pools: cur.Pools}
		switch rng.IntN(3) {
		case 0, 1:
			cidr := cidrs[rng.IntN(len(cidrs))]
			if rng.IntN(4) == 0 {
				delete(blocks, cidr)
			} else {
				b := &blockwatch.Block{CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: nodes[rng.IntN(len(nodes))]}}
				for k := rng.IntN(3); k > 0; k-- {
					ord := rng.IntN(64)
					a, _ := calico.OrdinalAddr(cidr, ord)
					b.Borrowed = append(b.Borrowed, calico.Borrowed{Ordinal: ord, Addr: a, Node: nodes[rng.IntN(len(nodes))]})
				}
				blocks[cidr] = b
			}
			next.ChangedBlocks = []netip.Prefix{cidr}
		case 2:
			n := nodes[rng.IntN(len(nodes))]
			if rng.IntN(3) == 0 {
				delete(next.Peers, n)
			} else {
				p := blockwatch.Peer{IPv4: netip.AddrFrom4([4]byte{192, 0, 2, byte(rng.IntN(250))})}
				if rng.IntN(2) == 0 {
					p.IPv6 = netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(rng.IntN(250))})
				}
				next.Peers[n] = p
			}
			next.ChangedPeers = []string{n}
		}
		next.Blocks = blockwatch.BlocksOf(blocks)
		before := maps.Clone(inc.targets)
		dirty := inc.update(next)
		full := newDesiredSet(peerCheck{node: "a"})
		full.reset(next, ManagedPools(next, nil))
		if !maps.EqualFunc(inc.targets, full.targets, target.equal) {
			t.Fatalf("step %d: incremental targets differ from a rebuild:\n inc %v\nfull %v", step, inc.targets, full.targets)
		}
		if inc.blocks != full.blocks || inc.unresolvedCount != full.unresolvedCount {
			t.Fatalf("step %d: counts differ: %v/%d vs %v/%d", step, inc.blocks, inc.unresolvedCount, full.blocks, full.unresolvedCount)
		}
		for p, tg := range full.targets {
			if old, ok := before[p]; (!ok || !old.equal(tg)) && !has(dirty, p) {
				t.Fatalf("step %d: %s changed but was not reported dirty", step, p)
			}
		}
		for p := range before {
			if _, ok := full.targets[p]; !ok && !has(dirty, p) {
				t.Fatalf("step %d: %s vanished but was not reported dirty", step, p)
			}
		}
		if len(past) > 0 {
			old := past[rng.IntN(len(past))]
			listed := newDesiredSet(peerCheck{node: "a"})
			listed.begin(old.Peers, old.Nodes, ManagedPools(old, nil), 0)
			var part []*blockwatch.Block
			for _, b := range old.Blocks.All() {
				if part = append(part, b); rng.IntN(8) == 0 {
					listed.addBlocks(part)
					part = nil
				}
			}
			listed.addBlocks(part)
			if !listed.catchUp(next, ManagedPools(next, nil)) {
				t.Fatalf("step %d: catchUp refused the same pools", step)
			}
			if !maps.EqualFunc(listed.targets, full.targets, target.equal) || listed.blocks != full.blocks ||
				listed.unresolvedCount != full.unresolvedCount || listed.resolvedCount() != full.resolvedCount() {
				t.Fatalf("step %d: listed and caught up differs from a rebuild:\n got %v\nwant %v", step, listed.targets, full.targets)
			}
		}
		if past = append(past, next); len(past) > 10 {
			past = past[1:]
		}
		cur = next
	}
}

func has(m map[netip.Prefix]struct{}, p netip.Prefix) bool { _, ok := m[p]; return ok }

// TestDesiredEncap: each route's encapsulation follows its pool (felix's rule): IPIP Always tunnels every
// IPv4 route; CrossSubnet tunnels only towards next hops outside this node's subnet, which is the
// uplink's prefix when given, else the prefix of this node's address in its Calico Node resource (and
// with neither every next hop counts as another subnet); ipipMode on an IPv6 pool is ignored; a VXLAN
// pool's routes to nodes without a VTEP (no Calico Node here) are held; a pool with modes Calico would
// refuse is marked.
func TestDesiredEncap(t *testing.T) {
	peers := map[string]blockwatch.Peer{
		"a":    {IPv4: addr("192.0.2.1"), IPv6: addr("2001:db8::1")},
		"near": {IPv4: addr("192.0.2.2"), IPv6: addr("2001:db8::2")},
		"far":  {IPv4: addr("198.51.100.2"), IPv6: addr("2001:db8:1::2")},
	}
	snap := snapOf([]*blockwatch.Block{
		hostBlock("10.244.1.0/26", "near"), hostBlock("10.244.2.0/26", "far"),
		hostBlock("fd00:10:244::40/122", "far"),
	}, peers)
	type row struct {
		near, far, far6 calico.Encap
		hold            bool
		problem         bool
	}
	for _, tc := range []struct {
		name        string
		ipip, vxlan calico.EncapMode
		ipip6       calico.EncapMode
		uplink      []netip.Prefix
		nodeSubnet  netip.Prefix
		want        row
	}{
		{name: "never", want: row{calico.EncapNone, calico.EncapNone, calico.EncapNone, false, false}},
		{name: "always", ipip: calico.EncapAlways, want: row{calico.EncapIPIP, calico.EncapIPIP, calico.EncapNone, false, false}},
		{name: "cross-subnet, uplink prefix", ipip: calico.EncapCrossSubnet, uplink: []netip.Prefix{pfx("192.0.2.1/24")},
			nodeSubnet: pfx("198.51.100.0/24"), // the uplink's prefix wins over the Node resource
			want:       row{calico.EncapNone, calico.EncapIPIP, calico.EncapNone, false, false}},
		{name: "cross-subnet, Node resource", ipip: calico.EncapCrossSubnet, nodeSubnet: pfx("192.0.2.0/24"),
			want: row{calico.EncapNone, calico.EncapIPIP, calico.EncapNone, false, false}},
		{name: "cross-subnet, no subnet known", ipip: calico.EncapCrossSubnet,
			want: row{calico.EncapIPIP, calico.EncapIPIP, calico.EncapNone, false, false}},
		{name: "ipip on the IPv6 pool", ipip6: calico.EncapAlways, want: row{calico.EncapNone, calico.EncapNone, calico.EncapNone, false, false}},
		{name: "vxlan", vxlan: calico.EncapAlways, want: row{calico.EncapVXLAN, calico.EncapVXLAN, calico.EncapNone, true, false}},
		{name: "unknown mode", ipip: "Sometimes", want: row{calico.EncapNone, calico.EncapNone, calico.EncapNone, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := *snap
			s.Pools = map[string]calico.IPPool{
				"v4": {Name: "v4", CIDR: pfx("10.244.0.0/16"), BlockSize: 26, IPIPMode: tc.ipip, VXLANMode: tc.vxlan},
				"v6": {Name: "v6", CIDR: pfx("fd00:10:244::/48"), BlockSize: 122, IPIPMode: tc.ipip6},
			}
			if tc.nodeSubnet.IsValid() {
				s.Nodes = map[string]calico.Node{"a": {V4: calico.NodeFamily{Addr: addr("192.0.2.1"), Subnet: tc.nodeSubnet}}}
			}
			routes, _ := Desired(&s, Options{NodeName: "a", UplinkPrefixes: tc.uplink})
			got := map[netip.Prefix]DesiredRoute{}
			for _, r := range routes {
				got[r.Prefix] = r
			}
			near, far, far6 := got[pfx("10.244.1.0/26")], got[pfx("10.244.2.0/26")], got[pfx("fd00:10:244::40/122")]
			if g := (row{near.Encap, far.Encap, far6.Encap, far.Hold, far.EncapProblem}); g != tc.want {
				t.Errorf("near, far, far IPv6, note, problem = %+v, want %+v", g, tc.want)
			}
		})
	}
}

// nodeOf decodes a Calico Node resource with the given spec JSON, as blockwatch does.
func nodeOf(t *testing.T, name, spec string) calico.Node {
	t.Helper()
	n, err := calico.DecodeNode([]byte(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"` + name + `"},"spec":` + spec + `}`))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestDesiredVXLAN: a VXLAN pool's route goes via the owner's VTEP address through a tunnel to the
// node IP of its Calico Node (felix's rule), with its MAC, recorded or generated; a node with no
// registered peer IP (a Linux node felix runs) is routed too; CrossSubnet towards a node in this
// node's subnet is flat via the peer IP; a VTEP whose MAC does not parse, or a registered node's absent
// VTEP, holds the route (kept as VPP has it); IPv6 uses the IPv6 VTEP.
func TestDesiredVXLAN(t *testing.T) {
	peers := map[string]blockwatch.Peer{
		"a":    {IPv4: addr("192.0.2.1"), IPv6: addr("2001:db8::1")},
		"near": {IPv4: addr("192.0.2.2")},
		"far":  {IPv4: addr("198.51.100.2"), IPv6: addr("2001:db8:1::2")},
		// Registered, no VTEP yet (calico-node has not written it): held. A node with neither would be
		// unresolved, as any node without a registration.
		"novtep": {IPv4: addr("198.51.100.5")},
	}
	snap := snapOf([]*blockwatch.Block{
		hostBlock("10.244.1.0/26", "near"), hostBlock("10.244.2.0/26", "far"), hostBlock("10.244.3.0/26", "linux"),
		hostBlock("10.244.4.0/26", "nomac"), hostBlock("10.244.5.0/26", "novtep"), hostBlock("fd00:10:244::40/122", "far"),
	}, peers)
	snap.Nodes = map[string]calico.Node{
		"a":    nodeOf(t, "a", `{"bgp":{"ipv4Address":"192.0.2.1/24"}}`),
		"near": nodeOf(t, "near", `{"bgp":{"ipv4Address":"192.0.2.2/24"},"ipv4VXLANTunnelAddr":"10.244.1.0"}`),
		"far": nodeOf(t, "far", `{"bgp":{"ipv4Address":"198.51.100.2/24","ipv6Address":"2001:db8:1::2/64"},"ipv4VXLANTunnelAddr":"10.244.2.0",`+
			`"vxlanTunnelMACAddr":"66:aa:aa:aa:aa:02","ipv6VXLANTunnelAddr":"fd00:10:244::40"}`),
		"linux":  nodeOf(t, "linux", `{"bgp":{"ipv4Address":"198.51.100.3/24"},"ipv4VXLANTunnelAddr":"10.244.3.0"}`),
		"nomac":  nodeOf(t, "nomac", `{"bgp":{"ipv4Address":"198.51.100.4/24"},"ipv4VXLANTunnelAddr":"10.244.4.0","vxlanTunnelMACAddr":"not-a-mac"}`),
		"novtep": nodeOf(t, "novtep", `{"bgp":{"ipv4Address":"198.51.100.5/24"}}`),
	}
	type route struct {
		encap         calico.Encap
		nh, underlay  string
		mac           string
		hold, problem bool
	}
	flat := func(nh string) route {
		return route{encap: calico.EncapNone, nh: nh, underlay: "invalid IP", mac: "00:00:00:00:00:00"}
	}
	vx := func(nh, underlay, mac string) route {
		return route{encap: calico.EncapVXLAN, nh: nh, underlay: underlay, mac: mac}
	}
	held := route{encap: calico.EncapVXLAN, nh: "invalid IP", underlay: "invalid IP", mac: "00:00:00:00:00:00", hold: true}
	gen := func(node string, v6 bool) string { return calico.GeneratedVTEPMAC(node, v6).String() }
	for _, tc := range []struct {
		mode calico.EncapMode
		want map[string]route
	}{
		{calico.EncapAlways, map[string]route{
			"10.244.1.0/26":       vx("10.244.1.0", "192.0.2.2", gen("near", false)),
			"10.244.2.0/26":       vx("10.244.2.0", "198.51.100.2", "66:aa:aa:aa:aa:02"),
			"10.244.3.0/26":       vx("10.244.3.0", "198.51.100.3", gen("linux", false)),
			"10.244.4.0/26":       held,
			"10.244.5.0/26":       held,
			"fd00:10:244::40/122": vx("fd00:10:244::40", "2001:db8:1::2", gen("far", true)),
		}},
		{calico.EncapCrossSubnet, map[string]route{
			"10.244.1.0/26":       flat("192.0.2.2"),
			"10.244.2.0/26":       vx("10.244.2.0", "198.51.100.2", "66:aa:aa:aa:aa:02"),
			"10.244.3.0/26":       vx("10.244.3.0", "198.51.100.3", gen("linux", false)),
			"10.244.4.0/26":       held,
			"10.244.5.0/26":       held,
			"fd00:10:244::40/122": vx("fd00:10:244::40", "2001:db8:1::2", gen("far", true)),
		}},
	} {
		t.Run(string(tc.mode), func(t *testing.T) {
			s := *snap
			s.Pools = map[string]calico.IPPool{
				"v4": {Name: "v4", CIDR: pfx("10.244.0.0/16"), BlockSize: 26, VXLANMode: tc.mode},
				"v6": {Name: "v6", CIDR: pfx("fd00:10:244::/48"), BlockSize: 122, VXLANMode: tc.mode},
			}
			routes, unresolved := Desired(&s, Options{NodeName: "a", UplinkPrefixes: []netip.Prefix{pfx("192.0.2.1/24"), pfx("2001:db8::1/64")}})
			got := map[string]route{}
			for _, r := range routes {
				got[r.Prefix.String()] = route{r.Encap, r.NextHop.String(), r.Underlay.String(), r.VTEPMAC.String(), r.Hold, r.EncapProblem}
				if r.Hold && !strings.Contains(r.EncapNote, "VTEP unknown") {
					t.Errorf("%s: held without the note: %q", r.Prefix, r.EncapNote)
				}
			}
			if !maps.Equal(got, tc.want) {
				t.Errorf("routes\n got %+v\nwant %+v", got, tc.want)
			}
			if len(unresolved) != 0 {
				t.Errorf("unresolved %+v, want none (the Linux node needs no registration)", unresolved)
			}
		})
	}
}
