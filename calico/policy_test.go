package calico

import (
	"net/netip"
	"strings"
	"testing"
)

func TestSelector(t *testing.T) {
	labels := map[string]string{"zone": "a", "rack": "r1", "vpp": "", "kubernetes.io/os": "linux"}
	tests := []struct {
		sel  string
		want bool
	}{
		{"", true},
		{"all()", true},
		{"has(vpp)", true},
		{"!has(vpp)", false},
		{"has(gpu)", false},
		{"zone == 'a'", true},
		{`zone == "b"`, false},
		{"zone != 'b'", true},
		{"gpu != 'x'", true}, // a missing label is != anything
		{"zone in {'a', 'b'}", true},
		{"zone in {}", false},
		{"zone not in {'a'}", false},
		{"gpu not in {'a'}", true},
		{"rack starts with 'r'", true},
		{"rack ends with '1'", true},
		{"rack contains 'x'", false},
		{"gpu contains ''", false},
		{"zone == 'a' && rack == 'r2'", false},
		{"zone == 'b' || rack == 'r1'", true},
		{"!(zone == 'b' || rack == 'r2') && has(kubernetes.io/os)", true},
		{"zone=='a'&&!has(gpu)", true},
		{"kubernetes.io/os == 'linux'", true},
		{"zone notin {'a'}", false},
	}
	for _, tc := range tests {
		s, err := ParseSelector(tc.sel)
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tc.sel, err)
			continue
		}
		if got := s.Matches(labels); got != tc.want {
			t.Errorf("%q matches = %v, want %v", tc.sel, got, tc.want)
		}
	}
	for _, bad := range []string{"zone", "zone = 'a'", "zone == a", "has(zone", "(zone == 'a'", "zone in {'a'", "zone == 'a' &&", "global()", "zone == 'a' extra", "zone ~= 'a'", "'a'"} {
		if _, err := ParseSelector(bad); err == nil {
			t.Errorf("ParseSelector(%q) accepted a selector Calico refuses or this package does not support", bad)
		}
	}
}

func TestWorkloadPools(t *testing.T) {
	pool := func(name, cidr string, mod func(*IPPool)) IPPool {
		p := IPPool{Name: name, CIDR: mustPrefix(cidr), BlockSize: 26}
		if strings.Contains(cidr, ":") {
			p.BlockSize = 122
		}
		if mod != nil {
			mod(&p)
		}
		return p
	}
	pools := []IPPool{
		pool("a-default", "10.1.0.0/16", nil),
		pool("b-disabled", "10.2.0.0/16", func(p *IPPool) { p.Disabled = true }),
		pool("c-tunnel", "10.3.0.0/16", func(p *IPPool) { p.AllowedUses = []string{UseTunnel} }),
		pool("d-lb", "10.4.0.0/16", func(p *IPPool) { p.AllowedUses = []string{UseLoadBalancer} }),
		pool("e-manual", "10.5.0.0/16", func(p *IPPool) { p.AssignmentMode = "Manual" }),
		pool("f-zone-a", "10.6.0.0/16", func(p *IPPool) {
			p.NodeSelector = "zone == 'a'"
			p.AllowedUses = []string{UseWorkload, UseTunnel}
		}),
		pool("g-zone-b", "10.7.0.0/16", func(p *IPPool) { p.NodeSelector = "zone == 'b'" }),
		pool("h-ns", "10.8.0.0/16", func(p *IPPool) { p.NamespaceSelector = "team == 'x'" }),
		pool("i-ns-all", "10.9.0.0/16", func(p *IPPool) { p.NamespaceSelector = "all()" }),
		pool("v6", "fd00::/48", nil),
	}
	names := func(ps []IPPool) string {
		var s []string
		for _, p := range ps {
			s = append(s, p.Name)
		}
		return strings.Join(s, ",")
	}
	got, err := WorkloadPools(pools, false, &Node{Name: "n1", Labels: map[string]string{"zone": "a"}})
	if err != nil || names(got) != "a-default,f-zone-a,i-ns-all" {
		t.Errorf("v4 pools of a zone-a node = %s, %v", names(got), err)
	}
	got, err = WorkloadPools(pools, true, nil)
	if err != nil || names(got) != "v6" {
		t.Errorf("v6 pools = %s, %v", names(got), err)
	}
	// Without the Node resource, pools whose selector needs labels select nothing.
	got, err = WorkloadPools(pools, false, nil)
	if err != nil || names(got) != "a-default,i-ns-all" {
		t.Errorf("v4 pools of a node without Node resource = %s, %v", names(got), err)
	}
	bad := []IPPool{pool("bad", "10.1.0.0/16", func(p *IPPool) { p.NodeSelector = "zone = 'a'" })}
	if _, err := WorkloadPools(bad, false, &Node{}); err == nil || !strings.Contains(err.Error(), "nodeSelector") {
		t.Errorf("bad selector: err = %v", err)
	}
	if NeedsNode(pools[:5]) || !NeedsNode(pools) {
		t.Error("NeedsNode")
	}
}

func TestDecodeResources(t *testing.T) {
	n, err := DecodeNode([]byte(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"n1","labels":{"zone":"a"}},"spec":{}}`))
	if err != nil || n.Name != "n1" || n.Labels["zone"] != "a" {
		t.Errorf("DecodeNode = %+v, %v", n, err)
	}
	r, err := DecodeIPReservation([]byte(`{"kind":"IPReservation","metadata":{"name":"r"},"spec":{"reservedCIDRs":["10.0.0.0/30","10.0.0.9"," fd00::1 ","10.1.2.3/24","bogus"]}}`))
	want := []string{"10.0.0.0/30", "10.0.0.9/32", "fd00::1/128", "10.1.2.0/24"}
	if len(r) != len(want) || err == nil || !strings.Contains(err.Error(), "bogus") {
		t.Fatalf("DecodeIPReservation = %v, %v", r, err)
	}
	for i, w := range want {
		if r[i] != mustPrefix(w) {
			t.Errorf("reservation %d = %s, want %s", i, r[i], w)
		}
	}
	p, err := DecodeIPPool([]byte(`{"metadata":{"name":"p"},"spec":{"cidr":"10.0.0.0/16","namespaceSelector":"all()","allowedUses":["Tunnel"]}}`))
	if err != nil || p.NamespaceSelector != "all()" || p.AllowsWorkloads() {
		t.Errorf("DecodeIPPool = %+v, %v", p, err)
	}
}

func TestReservations(t *testing.T) {
	r := Reservations{mustPrefix("10.0.0.0/30"), mustPrefix("10.0.1.0/25"), mustPrefix("10.0.1.128/26"), mustPrefix("10.0.1.192/27"),
		mustPrefix("10.0.1.224/27"), mustPrefix("10.0.1.230/32"), mustPrefix("10.0.2.0/23")}
	for _, tc := range []struct {
		p    string
		want bool
	}{
		{"10.0.0.0/26", false},
		{"10.0.0.0/30", true},
		{"10.0.0.0/31", true},
		{"10.0.1.0/24", true}, // covered by four ranges together (one listed range inside another adds nothing)
		{"10.0.1.0/26", true},
		{"10.0.2.64/26", true},
		{"10.0.4.0/26", false},
		{"fd00::/122", false},
	} {
		if got := r.CoversWhole(mustPrefix(tc.p)); got != tc.want {
			t.Errorf("CoversWhole(%s) = %v, want %v", tc.p, got, tc.want)
		}
	}
	if !r.Contains(netip.MustParseAddr("10.0.0.3")) || r.Contains(netip.MustParseAddr("10.0.0.4")) {
		t.Error("Contains")
	}
}

func TestNextFreeBlock(t *testing.T) {
	pool := IPPool{Name: "p", CIDR: mustPrefix("10.0.0.0/24"), BlockSize: 26}
	start := BlockStartIndex("n1", pool.CIDR, 26)
	first := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(start * 64)}), 26)
	if got, ok := NextFreeBlock(pool, "n1", nil, nil); !ok || got != first {
		t.Fatalf("NextFreeBlock = %s %v, want %s", got, ok, first)
	}
	// The node's first subnet wholly reserved by two /27s: walk on.
	half := netip.PrefixFrom(first.Addr(), 27)
	other := netip.PrefixFrom(LastAddr(half).Next(), 27)
	got, ok := NextFreeBlock(pool, "n1", nil, Reservations{half, other})
	if !ok || got == first {
		t.Errorf("wholly reserved subnet claimed: %s %v", got, ok)
	}
	// Partly reserved: claimed (Calico claims it and skips the reserved addresses).
	if got, _ := NextFreeBlock(pool, "n1", nil, Reservations{half}); got != first {
		t.Errorf("partly reserved subnet skipped: %s", got)
	}
	if _, ok := NextFreeBlock(pool, "n1", nil, Reservations{mustPrefix("10.0.0.0/24")}); ok {
		t.Error("a pool wholly reserved gave a block")
	}
	used := []netip.Prefix{mustPrefix("10.0.0.0/26"), mustPrefix("10.0.0.64/26"), mustPrefix("10.0.0.128/26")}
	if got, ok := NextFreeBlock(pool, "n1", used, nil); !ok || got != mustPrefix("10.0.0.192/26") {
		t.Errorf("last free subnet: %s %v", got, ok)
	}
}

func TestBlockLimit(t *testing.T) {
	for _, tc := range []struct{ cfg, req, want int }{{0, 0, 20}, {4, 0, 4}, {0, 2, 2}, {4, 9, 4}, {4, 2, 2}} {
		if got := (IPAMConfig{MaxBlocksPerHost: tc.cfg}).BlockLimit(tc.req); got != tc.want {
			t.Errorf("BlockLimit(config %d, request %d) = %d, want %d", tc.cfg, tc.req, got, tc.want)
		}
	}
}

func TestDeleteWhenReleasedAndStepFor(t *testing.T) {
	cidr := mustPrefix("10.0.0.0/26")
	owned := NewBlock(cidr, "host:n1", 1)
	orphan := NewBlock(cidr, "", 1)
	if owned.DeleteWhenReleased() || !orphan.DeleteWhenReleased() {
		t.Error("an empty block is deleted exactly when it has no affinity")
	}
	h := "k8s-pod-network.c1"
	orphan.AutoAssign(1, AllocationAttribute{HandleID: &h}, nil)
	if orphan.Empty() || orphan.DeleteWhenReleased() {
		t.Error("a block holding a pod is not empty")
	}
	win := NewBlock(cidr, "", 1)
	wh := WindowsReservedHandle
	win.AutoAssign(4, AllocationAttribute{HandleID: &wh}, nil)
	if !win.Empty() {
		t.Error("a block holding only Windows-reserved addresses is empty for Calico")
	}

	other := NewBlock(cidr, "host:n2", 1)
	for _, tc := range []struct {
		state string
		b     *Block
		want  AffinityStep
	}{
		{AffinityPending, nil, AffinityCreate},
		{AffinityConfirmed, nil, AffinityCreate},
		{AffinityPending, owned, AffinityConfirm},
		{AffinityPendingDeletion, owned, AffinityConfirm},
		{AffinityConfirmed, owned, AffinityUse},
		{"", owned, AffinityUse},
		{AffinityConfirmed, other, AffinityStale},
		{AffinityPending, NewBlock(cidr, "", 1), AffinityStale},
	} {
		if got := StepFor("n1", tc.state, tc.b); got != tc.want {
			t.Errorf("StepFor(%q, %v) = %s, want %s", tc.state, tc.b != nil, got, tc.want)
		}
	}
}

func TestSortAffinities(t *testing.T) {
	state := map[netip.Prefix]string{
		mustPrefix("10.0.0.0/26"): AffinityConfirmed, mustPrefix("10.0.1.0/26"): AffinityPending,
		mustPrefix("10.0.0.64/26"): "", mustPrefix("10.0.2.0/26"): AffinityPendingDeletion,
	}
	var cidrs []netip.Prefix
	for c := range state {
		cidrs = append(cidrs, c)
	}
	SortAffinities(cidrs, func(c netip.Prefix) string { return state[c] })
	want := []string{"10.0.1.0/26", "10.0.2.0/26", "10.0.0.0/26", "10.0.0.64/26"}
	for i, w := range want {
		if cidrs[i] != mustPrefix(w) {
			t.Fatalf("order %v, want %v", cidrs, want)
		}
	}
}

func TestReleaseWhenUnselected(t *testing.T) {
	p := IPPool{Name: "a", CIDR: mustPrefix("10.0.0.0/24"), BlockSize: 26, NodeSelector: "rack == 'a'"}
	empty := NewBlock(mustPrefix("10.0.0.0/26"), "host:n1", 1)
	rackA, rackB := &Node{Labels: map[string]string{"rack": "a"}}, &Node{Labels: map[string]string{"rack": "b"}}
	if !ReleaseWhenUnselected(p, rackB, empty, "n1") {
		t.Error("an empty block of a pool that no longer selects the node is released")
	}
	for name, tc := range map[string]struct {
		n    *Node
		b    *Block
		node string
	}{"still selected": {rackA, empty, "n1"}, "no labels": {nil, empty, "n1"}, "another node's": {rackB, empty, "n2"}} {
		if ReleaseWhenUnselected(p, tc.n, tc.b, tc.node) {
			t.Errorf("%s: released", name)
		}
	}
	h := "x"
	full := NewBlock(mustPrefix("10.0.0.0/26"), "host:n1", 1)
	full.AutoAssign(1, AllocationAttribute{HandleID: &h}, nil)
	if ReleaseWhenUnselected(p, rackB, full, "n1") {
		t.Error("a block holding an address is released")
	}
}

// TestBlockStartIndexIsCalicos: the start indexes calico-ipam v3.31 was seen to claim first for these
// node names in 10.100.0.0/16 with /26 blocks (test/calicointerop checks it against the real binary).
func TestBlockStartIndexIsCalicos(t *testing.T) {
	pool := mustPrefix("10.100.0.0/16")
	for node, want := range map[string]string{"nodea": "10.100.149.0/26", "nodeb": "10.100.248.128/26", "nodec": "10.100.176.192/26"} {
		got, ok := NextFreeBlock(IPPool{CIDR: pool, BlockSize: 26}, node, nil, nil)
		if !ok || got != mustPrefix(want) {
			t.Errorf("%s claims %s first, calico-ipam claims %s", node, got, want)
		}
	}
	// A pool of more than 2^64 subnets: the index is taken whole.
	v6 := IPPool{CIDR: mustPrefix("fd00:10:244::/48"), BlockSize: 122}
	got, ok := NextFreeBlock(v6, "nodea", nil, nil)
	if !ok || !v6.CIDR.Contains(got.Addr()) || got.Bits() != 122 {
		t.Fatalf("v6 claim %s %v", got, ok)
	}
	if again, _ := NextFreeBlock(v6, "nodea", nil, nil); again != got {
		t.Errorf("v6 start is not stable: %s then %s", got, again)
	}
}

func TestBorrowOrder(t *testing.T) {
	pool := IPPool{CIDR: mustPrefix("10.0.0.0/24"), BlockSize: 26}
	start := BlockStartIndex("n1", pool.CIDR, 26)
	var cidrs []netip.Prefix
	for i := range 4 {
		cidrs = append(cidrs, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 0, 0, byte(64 * i)}), 26))
	}
	cidrs = append(cidrs, mustPrefix("10.0.0.0/28"), mustPrefix("10.9.0.0/26")) // another size; outside
	got := BorrowOrder(pool, "n1", cidrs)
	if len(got) != 4 {
		t.Fatalf("BorrowOrder = %v, want the four /26 of the pool", got)
	}
	for i, c := range got {
		if want := cidrs[(int(start)+i)%4]; c != want {
			t.Errorf("visit %d = %s, want %s (walk from index %d)", i, c, want, start)
		}
	}
}
