package calicointerop_test

import (
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
)

// Node and pod names have no dashes: Calico's WorkloadEndpoint names join them with dashes.

// batch returns n ADDs (or DELs) of plugin p on node for pods prefix0..prefix(n-1).
func batch(del bool, p plugin, node, prefix string, n int, f families) []op {
	var ops []op
	for i := range n {
		ops = append(ops, op{del: del, p: p, node: node, cid: fmt.Sprintf("%s%d", prefix, i), f: f})
	}
	return ops
}

// TestOtherNodesConcurrently: calico-ipam on one node and block-ipam on another allocate at the same
// time from one pool; then each DELs half of the other's pods (same network, same handle); then both
// allocate again in blocks the other plugin released in.
func TestOtherNodesConcurrently(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.100.0.0/16", 26, ""), nodeRes("nodea", nil), nodeRes("nodeb", nil))
	w.run(append(batch(false, calicoIPAM, "nodea", "ca", 12, v4only), batch(false, blockIPAM, "nodeb", "bb", 12, v4only)...))
	w.check()
	var ca, bb []*pod
	for i := range 12 {
		ca, bb = append(ca, w.pods[fmt.Sprintf("ca%d", i)]), append(bb, w.pods[fmt.Sprintf("bb%d", i)])
	}
	if got := w.ownersOf(ca...); !slices.Equal(got, []string{"nodea"}) {
		t.Fatalf("calico-ipam's pods on nodea are in blocks of %v", got)
	}
	if got := w.ownersOf(bb...); !slices.Equal(got, []string{"nodeb"}) {
		t.Fatalf("block-ipam's pods on nodeb are in blocks of %v", got)
	}

	// DELs across: each plugin releases pods the other allocated.
	var dels []op
	for i := range 6 {
		dels = append(dels, op{del: true, p: calicoIPAM, node: "nodeb", cid: fmt.Sprintf("bb%d", i), f: v4only},
			op{del: true, p: blockIPAM, node: "nodea", cid: fmt.Sprintf("ca%d", i), f: v4only})
	}
	w.run(dels)
	w.check()

	// Both allocate again, in the blocks whose ordinals the other plugin freed.
	blocks := len(w.snapshot().Blocks)
	w.run(append(batch(false, calicoIPAM, "nodeb", "cb", 6, v4only), batch(false, blockIPAM, "nodea", "ba", 6, v4only)...))
	if got := len(w.snapshot().Blocks); got != blocks {
		t.Errorf("%d blocks after re-allocating into freed ordinals, want still %d", got, blocks)
	}
	w.check()
}

// TestSameNodeConcurrently: both plugins on one node at once share its blocks; DELs across; the
// addresses calico-ipam's DEL freed (their sequence entries kept) are reused by block-ipam; the blocks
// stay affine when emptied.
func TestSameNodeConcurrently(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.101.0.0/16", 26, ""), nodeRes("nodec", nil))
	w.run(append(batch(false, calicoIPAM, "nodec", "c", 15, v4only), batch(false, blockIPAM, "nodec", "b", 15, v4only)...))
	w.check()
	blocks := len(w.snapshot().Blocks)

	var dels []op
	for i := range 8 {
		p := calicoIPAM
		if i%2 == 1 {
			p = blockIPAM
		}
		dels = append(dels, op{del: true, p: p, node: "nodec", cid: fmt.Sprintf("c%d", i), f: v4only},
			op{del: true, p: p, node: "nodec", cid: fmt.Sprintf("b%d", i), f: v4only})
	}
	w.run(dels)
	w.check()
	stale := 0
	for _, b := range w.snapshot().Blocks {
		for k := range b.SequenceNumberForAllocation {
			var ord int
			fmt.Sscan(k, &ord)
			if b.Allocations[ord] == nil {
				stale++
			}
		}
	}
	if stale == 0 {
		t.Errorf("no freed ordinal kept its sequence entry: calico-ipam's DEL path was not exercised")
	}

	w.run(append(batch(false, calicoIPAM, "nodec", "cc", 10, v4only), batch(false, blockIPAM, "nodec", "bc", 10, v4only)...))
	if got := len(w.snapshot().Blocks); got != blocks {
		t.Errorf("%d blocks, want still %d: an allocator passed over blocks with freed ordinals", got, blocks)
	}
	w.check()

	// Everything released, half by each plugin: the node's blocks stay, empty and affine.
	var all []op
	i := 0
	for cid := range w.pods {
		p := calicoIPAM
		if i%2 == 0 {
			p = blockIPAM
		}
		i++
		all = append(all, op{del: true, p: p, node: "nodec", cid: cid, f: v4only})
	}
	w.run(all)
	w.check()
	for c, b := range w.snapshot().Blocks {
		if o := calico.OwnerOf(b, false); o.Node != "nodec" || !b.Empty() {
			t.Errorf("block %s after all DELs: owner %q, empty %v", c, o.Node, b.Empty())
		}
	}
}

// TestReleaseAcross: `calicoctl ipam release` (Calico's ReleaseIPs path, which drops the sequence
// entry) of a leaked block-ipam address, then the kubelet's late DEL of that pod through block-ipam
// (nothing left to release); and block-ipam's DEL of a calico-ipam pod after calicoctl released it.
func TestReleaseAcross(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.102.0.0/16", 26, ""), nodeRes("noded", nil))
	leakB := w.mustAdd(blockIPAM, "noded", "lb", v4only)
	leakC := w.mustAdd(calicoIPAM, "noded", "lc", v4only)
	w.mustAdd(blockIPAM, "noded", "kb", v4only)
	w.mustAdd(calicoIPAM, "noded", "kc", v4only)
	w.check()

	// The two pods vanish without DEL: ipam check reports their addresses as leaked; calicoctl
	// releases them.
	leakB.noEndpoint, leakC.noEndpoint = true, true
	w.syncEndpoints()
	out := w.calicoctl("", "ipam", "check", "--show-problem-ips")
	if !strings.Contains(out, "Found 2 IPs that are allocated in IPAM but not actually in use") {
		t.Fatalf("ipam check did not see the two leaks:\n%s", out)
	}
	for _, pd := range []*pod{leakB, leakC} {
		w.calicoctl("", "ipam", "release", "--ip="+pd.addrs[0].String())
	}
	w.mustDel(blockIPAM, "noded", "lb", v4only)
	w.mustDel(blockIPAM, "noded", "lc", v4only)
	w.check()
	// Their addresses are free again: the next ADDs may take them.
	w.mustAdd(blockIPAM, "noded", "nb", v4only)
	w.mustAdd(calicoIPAM, "noded", "nc", v4only)
	w.check()
}

// TestNodeDeletion: `calicoctl delete node` releases the addresses of the node's WorkloadEndpoints and
// its affinities: empty blocks are deleted, a block still holding an address (a pod without endpoint)
// loses its affinity. block-ipam's late DEL of that pod empties the block, which it then deletes, as
// Calico would; the subnets are claimable again by either plugin.
func TestNodeDeletion(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.103.0.0/24", 28, ""), nodeRes("gone", nil), nodeRes("stays", nil))
	w.run([]op{
		{p: calicoIPAM, node: "gone", cid: "g1", f: v4only}, {p: calicoIPAM, node: "gone", cid: "g2", f: v4only},
		{p: blockIPAM, node: "gone", cid: "g3", f: v4only}, {p: blockIPAM, node: "gone", cid: "g4", f: v4only},
		{p: calicoIPAM, node: "stays", cid: "s1", f: v4only}, {p: blockIPAM, node: "stays", cid: "s2", f: v4only},
	})
	w.check()
	// g5 has no endpoint (its kubelet never wrote one): node deletion cannot know it.
	g5 := w.mustAdd(blockIPAM, "gone", "g5", v4only)
	g5.noEndpoint = true
	w.syncEndpoints()
	g5block, _ := w.blockOf(g5.addrs[0])

	w.calicoctl("", "delete", "node", "gone")
	for _, cid := range []string{"g1", "g2", "g3", "g4"} {
		delete(w.pods, cid) // released by the node deletion
	}
	s := w.snapshot()
	for c, b := range s.Blocks {
		if o := calico.OwnerOf(b, false); o.Node == "gone" {
			t.Fatalf("block %s still owned by the deleted node", c)
		}
		if c != g5block && b.Affinity == nil {
			t.Fatalf("block %s without affinity and without g5", c)
		}
	}
	if b := s.Blocks[g5block]; b == nil || b.Affinity != nil {
		t.Fatalf("g5's block %s after node deletion: %+v, want kept without affinity", g5block, b)
	}

	// The late DEL of g5 (block-ipam, still configured with the old node name).
	w.mustDel(blockIPAM, "gone", "g5", v4only)
	if b := w.snapshot().Blocks[g5block]; b != nil {
		t.Fatalf("block %s left empty without affinity was kept: its subnet is lost to claims", g5block)
	}
	w.check()
	// The freed subnets are claimable again, by either plugin.
	w.apply(nodeRes("newc", nil), nodeRes("newb", nil))
	w.run(append(batch(false, calicoIPAM, "newc", "nc", 3, v4only), batch(false, blockIPAM, "newb", "nb", 3, v4only)...))
	w.check()
}

// TestReservations: an IPReservation holds a whole block (by two ranges together) and single
// addresses in others: neither plugin hands out a reserved address or claims the reserved block;
// a specific-address request (IP=) is not checked against reservations by either.
func TestReservations(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.104.0.0/24", 26, ""), nodeRes("nodee", nil), nodeRes("nodef", nil),
		`{"apiVersion":"projectcalico.org/v3","kind":"IPReservation","metadata":{"name":"r"},"spec":{"reservedCIDRs":["10.104.0.0/27","10.104.0.32/27","10.104.0.64/29","10.104.0.128/29","10.104.0.192/29","10.104.0.200"]}}`)
	reserved := calico.Reservations{}
	for _, s := range []string{"10.104.0.0/26", "10.104.0.64/29", "10.104.0.128/29", "10.104.0.192/29", "10.104.0.200/32"} {
		reserved = append(reserved, netip.MustParsePrefix(s))
	}
	w.run(append(batch(false, calicoIPAM, "nodee", "ce", 6, v4only), batch(false, blockIPAM, "nodef", "bf", 6, v4only)...))
	w.check()
	for cid, pd := range w.pods {
		for _, a := range pd.addrs {
			if reserved.Contains(a) {
				t.Errorf("%s (%s) got the reserved address %s", cid, pd.by, a)
			}
		}
	}
	if b := w.snapshot().Blocks[netip.MustParsePrefix("10.104.0.0/26")]; b != nil {
		t.Errorf("the wholly reserved subnet 10.104.0.0/26 was claimed: %v", *b.Affinity)
	}
	// Specific addresses: not checked against reservations, by either plugin. Pick a reserved
	// address in each node's own block.
	for _, tc := range []struct {
		p    plugin
		node string
		of   string
	}{{calicoIPAM, "nodee", "ce0"}, {blockIPAM, "nodef", "bf0"}} {
		blk, _ := w.blockOf(w.pods[tc.of].addrs[0])
		want, _ := calico.OrdinalAddr(blk, 1)
		got := w.mustAdd(tc.p, tc.node, "ip"+tc.of, v4only, [2]string{"IP", want.String()})
		if got.addrs[0] != want {
			t.Errorf("%s IP=%s got %v", tc.p, want, got.addrs)
		}
	}
	w.check()
}

// TestBorrowingBothWays: a pool of four /30 blocks, two claimed by each plugin's node and full. With
// strict affinity off, calico-ipam borrows a freed address of block-ipam's node's block and block-ipam
// one of calico-ipam's node's; each borrowed address records its node; the other plugin DELs it.
func TestBorrowingBothWays(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.105.0.0/28", 30, ""), nodeRes("nodeg", nil), nodeRes("nodeh", nil))
	for i := range 8 {
		w.mustAdd(calicoIPAM, "nodeg", fmt.Sprintf("g%d", i), v4only)
	}
	for i := range 8 {
		w.mustAdd(blockIPAM, "nodeh", fmt.Sprintf("h%d", i), v4only)
	}
	w.check()
	if _, err := w.add(blockIPAM, "nodeh", "hfull", v4only); err == nil {
		t.Fatal("block-ipam ADD in a full pool succeeded")
	}
	if _, err := w.add(calicoIPAM, "nodeg", "gfull", v4only); err == nil {
		t.Fatal("calico-ipam ADD in a full pool succeeded")
	}

	// calico-ipam frees two of nodeh's (block-ipam's) addresses; calico-ipam on nodeg borrows one.
	w.mustDel(calicoIPAM, "nodeh", "h0", v4only)
	w.mustDel(calicoIPAM, "nodeh", "h1", v4only)
	gb := w.mustAdd(calicoIPAM, "nodeg", "gb", v4only)
	// block-ipam frees two of nodeg's (calico-ipam's) addresses; block-ipam on nodeh takes its own
	// free address first, then borrows one of nodeg's.
	w.mustDel(blockIPAM, "nodeg", "g0", v4only)
	w.mustDel(blockIPAM, "nodeg", "g1", v4only)
	own := w.mustAdd(blockIPAM, "nodeh", "hown", v4only)
	hb := w.mustAdd(blockIPAM, "nodeh", "hb", v4only)
	w.check()
	for _, tc := range []struct {
		pd          *pod
		owner, node string
	}{{gb, "nodeh", "nodeg"}, {own, "nodeh", "nodeh"}, {hb, "nodeg", "nodeh"}} {
		found := false
		for _, a := range w.snapshot().Allocations {
			if a.Addr == tc.pd.addrs[0] {
				found = true
				if a.Owner != tc.owner || a.Node != tc.node {
					t.Errorf("%s (%s) got %s in a block of %q recorded for node %q; want block of %q, node %q",
						tc.pd.cid, tc.pd.by, a.Addr, a.Owner, a.Node, tc.owner, tc.node)
				}
			}
		}
		if !found {
			t.Errorf("%s's address %s is not allocated", tc.pd.cid, tc.pd.addrs[0])
		}
	}
	// Each borrowed address released by the other plugin.
	w.mustDel(blockIPAM, "nodeg", "gb", v4only)
	w.mustDel(calicoIPAM, "nodeh", "hb", v4only)
	w.check()
}

// TestDualStackIPv6: dual-stack pods from both plugins, on their own nodes and on one shared node at
// once; DELs across.
func TestDualStackIPv6(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("v4", "10.106.0.0/24", 26, ""), poolRes("v6", "fd00:106::/120", 122, ""),
		nodeRes("nodei", nil), nodeRes("nodej", nil), nodeRes("nodek", nil))
	both := families{v4: true, v6: true}
	var ops []op
	for i := range 5 {
		ops = append(ops,
			op{p: calicoIPAM, node: "nodei", cid: fmt.Sprintf("ci%d", i), f: both},
			op{p: blockIPAM, node: "nodej", cid: fmt.Sprintf("bj%d", i), f: both},
			op{p: calicoIPAM, node: "nodek", cid: fmt.Sprintf("ck%d", i), f: both},
			op{p: blockIPAM, node: "nodek", cid: fmt.Sprintf("bk%d", i), f: both})
	}
	w.run(ops)
	w.check()
	for cid, pd := range w.pods {
		if len(pd.addrs) != 2 || !pd.addrs[0].Is4() || !pd.addrs[1].Is6() {
			t.Fatalf("%s (%s) got %v, want one IPv4 and one IPv6 address", cid, pd.by, pd.addrs)
		}
	}
	var dels []op
	for i := range 3 {
		dels = append(dels,
			op{del: true, p: blockIPAM, node: "nodei", cid: fmt.Sprintf("ci%d", i), f: both},
			op{del: true, p: calicoIPAM, node: "nodej", cid: fmt.Sprintf("bj%d", i), f: both},
			op{del: true, p: blockIPAM, node: "nodek", cid: fmt.Sprintf("ck%d", i), f: both},
			op{del: true, p: calicoIPAM, node: "nodek", cid: fmt.Sprintf("bk%d", i), f: both})
	}
	w.run(dels)
	w.check()
	w.run(append(batch(false, blockIPAM, "nodek", "bk2nd", 4, both), batch(false, calicoIPAM, "nodek", "ck2nd", 4, both)...))
	w.check()
}

// TestStrictAffinityLimitAndPendingClaim: with strict affinity and maxBlocksPerHost 1 (calicoctl ipam
// configure), a node whose one block is full gets no address from either plugin, and neither
// borrows; a pending affinity as an interrupted Calico claim leaves it is adopted by block-ipam's next
// ADD (exactly that block), which calico-ipam then allocates from too.
func TestStrictAffinityLimitAndPendingClaim(t *testing.T) {
	w := newWorld(t)
	w.apply(poolRes("pool", "10.107.0.0/24", 28, ""), nodeRes("nodel", nil), nodeRes("nodem", nil))
	w.calicoctl("", "ipam", "configure", "--strictaffinity=true", "--max-blocks-per-host=1")
	for i := range 8 {
		w.mustAdd(calicoIPAM, "nodel", fmt.Sprintf("cl%d", i), v4only)
		w.mustAdd(blockIPAM, "nodel", fmt.Sprintf("bl%d", i), v4only)
	}
	w.check()
	if n := len(w.snapshot().Blocks); n != 1 {
		t.Fatalf("%d blocks, want nodel's one", n)
	}
	for _, p := range []plugin{calicoIPAM, blockIPAM} {
		if pd, err := w.add(p, "nodel", "over"+strings.ReplaceAll(string(p), "-", ""), v4only); err == nil {
			t.Errorf("%s gave %v beyond the node's one block under strict affinity", p, pd.addrs)
		}
	}
	// Under strict affinity, no IP= into another node's block either, from either plugin.
	free := w.pods["cl7"].addrs[0]
	w.mustDel(calicoIPAM, "nodel", "cl7", v4only)
	for _, p := range []plugin{calicoIPAM, blockIPAM} {
		if _, err := w.add(p, "nodem", "mip"+strings.ReplaceAll(string(p), "-", ""), v4only, [2]string{"IP", free.String()}); err == nil {
			t.Errorf("%s IP=%s into nodel's block under strict affinity succeeded", p, free)
		}
	}

	// The pending affinity of an interrupted claim of nodem, to a subnet without block.
	var pending netip.Prefix
	s := w.snapshot()
	for i := range 16 {
		c := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 107, 0, byte(16 * i)}), 28)
		if s.Blocks[c] == nil {
			pending = c
			break
		}
	}
	w.put(calico.HostAffinityKey("nodem", pending), `{"state":"pending","deleted":false}`)
	got := w.mustAdd(blockIPAM, "nodem", "bm0", v4only)
	if !pending.Contains(got.addrs[0]) {
		t.Fatalf("block-ipam on nodem got %v, want an address of the pending claim %s", got.addrs, pending)
	}
	c := w.mustAdd(calicoIPAM, "nodem", "cm0", v4only)
	if !pending.Contains(c.addrs[0]) {
		t.Fatalf("calico-ipam on nodem got %v, want an address of its block %s", c.addrs, pending)
	}
	w.check()
}

// TestPoolSelection: nodeSelector against the Calico Node's labels, allowedUses and disabled pools,
// decided alike by both plugins.
func TestPoolSelection(t *testing.T) {
	w := newWorld(t)
	w.apply(
		poolRes("rack-a", "10.108.0.0/24", 26, `,"nodeSelector":"rack == 'a'"`),
		poolRes("rack-b", "10.109.0.0/24", 26, `,"nodeSelector":"rack in {'b', 'c'} && !has(drain)"`),
		poolRes("tunnel", "10.110.0.0/24", 26, `,"allowedUses":["Tunnel"]`),
		poolRes("off", "10.111.0.0/24", 26, `,"disabled":true`),
		nodeRes("nodena", map[string]string{"rack": "a"}), nodeRes("nodenb", map[string]string{"rack": "b"}))
	want := map[string]netip.Prefix{"nodena": netip.MustParsePrefix("10.108.0.0/24"), "nodenb": netip.MustParsePrefix("10.109.0.0/24")}
	var ops []op
	for node := range want {
		for i := range 3 {
			ops = append(ops, op{p: calicoIPAM, node: node, cid: fmt.Sprintf("c%s%d", node, i), f: v4only},
				op{p: blockIPAM, node: node, cid: fmt.Sprintf("b%s%d", node, i), f: v4only})
		}
	}
	w.run(ops)
	w.check()
	for cid, pd := range w.pods {
		if !want[pd.node].Contains(pd.addrs[0]) {
			t.Errorf("%s (%s on %s) got %s, want an address of %s", cid, pd.by, pd.node, pd.addrs[0], want[pd.node])
		}
	}
	// nodena moves to rack b; its pods go, released by either plugin at once: whichever DEL empties
	// nodena's block of rack-a deletes it with its affinity (both do what Calico's
	// ensureConsistentAffinity does), and both then allocate from rack-b.
	w.apply(nodeRes("nodena", map[string]string{"rack": "b"}))
	var dels []op
	i := 0
	for cid, pd := range w.pods {
		if pd.node == "nodena" {
			p := []plugin{calicoIPAM, blockIPAM}[i%2]
			i++
			dels = append(dels, op{del: true, p: p, node: "nodena", cid: cid, f: v4only})
		}
	}
	w.run(dels)
	for c, b := range w.snapshot().Blocks {
		if want["nodena"].Contains(c.Addr()) {
			t.Errorf("block %s of rack-a (%v) kept after nodena left the rack and its pods were deleted", c, *b.Affinity)
		}
	}
	moved := w.mustAdd(blockIPAM, "nodena", "bmoved", v4only)
	movedC := w.mustAdd(calicoIPAM, "nodena", "cmoved", v4only)
	for _, pd := range []*pod{moved, movedC} {
		if !want["nodenb"].Contains(pd.addrs[0]) {
			t.Errorf("%s on nodena after relabelling got %s, want rack-b's %s", pd.by, pd.addrs[0], want["nodenb"])
		}
	}
	w.check()

	// A node no pool selects: both refuse.
	w.apply(nodeRes("nodenc", map[string]string{"rack": "c", "drain": "yes"}))
	for _, p := range []plugin{calicoIPAM, blockIPAM} {
		if pd, err := w.add(p, "nodenc", "x"+strings.ReplaceAll(string(p), "-", ""), v4only); err == nil {
			t.Errorf("%s gave %v to a node no workload pool selects", p, pd.addrs)
		}
	}
	w.check()
}

// TestClaimsTheSubnetCalicoWould: for the same node names, block-ipam claims first the very subnets
// calico-ipam claims (each on its own etcd), in an IPv4 pool and in an IPv6 /48 of 2^74 subnets.
func TestClaimsTheSubnetCalicoWould(t *testing.T) {
	nodes := []string{"nodeq", "noder", "nodes", "nodet"}
	both := families{v4: true, v6: true}
	first := map[plugin]map[string][]netip.Prefix{}
	for _, p := range []plugin{calicoIPAM, blockIPAM} {
		w := newWorld(t)
		w.apply(poolRes("v4", "10.112.0.0/16", 26, ""), poolRes("v6", "fd00:112::/48", 122, ""))
		first[p] = map[string][]netip.Prefix{}
		for _, n := range nodes {
			w.apply(nodeRes(n, nil))
			pd := w.mustAdd(p, n, "p"+n, both)
			for _, a := range pd.addrs {
				c, _ := w.blockOf(a)
				first[p][n] = append(first[p][n], c)
			}
		}
		w.check()
	}
	for _, n := range nodes {
		if !slices.Equal(first[calicoIPAM][n], first[blockIPAM][n]) {
			t.Errorf("%s: calico-ipam claimed %v, block-ipam %v", n, first[calicoIPAM][n], first[blockIPAM][n])
		}
	}
}

// TestBorrowsWhereCalicoWould: a pool of eight /30 blocks, all claimed and filled by one node, an
// address freed in three of them; three other nodes borrow one address each. block-ipam borrows from
// the same blocks, in the same order, as calico-ipam on an identical etcd.
func TestBorrowsWhereCalicoWould(t *testing.T) {
	borrowers := []string{"nodeu", "nodev", "nodew"}
	got := map[plugin][]netip.Prefix{}
	for _, p := range []plugin{calicoIPAM, blockIPAM} {
		w := newWorld(t)
		w.apply(poolRes("pool", "10.113.0.0/27", 30, ""), nodeRes("nodefill", nil), nodeRes("nodeu", nil),
			nodeRes("nodev", nil), nodeRes("nodew", nil))
		for i := range 32 {
			w.mustAdd(blockIPAM, "nodefill", fmt.Sprintf("f%d", i), v4only)
		}
		for cid, pd := range w.pods {
			if a := pd.addrs[0].As4(); a[3] == 4 || a[3] == 16 || a[3] == 24 {
				w.mustDel(blockIPAM, "nodefill", cid, v4only)
			}
		}
		for _, n := range borrowers {
			pd := w.mustAdd(p, n, "b"+n, v4only)
			c, _ := w.blockOf(pd.addrs[0])
			got[p] = append(got[p], c)
		}
		w.check()
	}
	t.Logf("borrowed from, in order: calico-ipam %v, block-ipam %v", got[calicoIPAM], got[blockIPAM])
	if !slices.Equal(got[calicoIPAM], got[blockIPAM]) {
		t.Errorf("borrowed from: calico-ipam %v, block-ipam %v", got[calicoIPAM], got[blockIPAM])
	}
}
