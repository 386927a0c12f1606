package calico

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
)

func attr(handle, node string) AllocationAttribute {
	return AllocationAttribute{HandleID: &handle, Secondary: map[string]string{AttrNode: node}}
}

func mustValid(t *testing.T, b *Block) {
	t.Helper()
	if err := b.Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestAutoAssignFIFO follows one /29 block through assignments and releases: addresses come from the
// head of unallocated, released ones go to its tail, attributes are shared and compacted, sequence
// numbers record the block's number at allocation time.
func TestAutoAssignFIFO(t *testing.T) {
	b := NewBlock(mustPrefix("10.0.0.0/29"), "host:n1", 100)
	skip := func(a netip.Addr) bool { return a == mustAddr("10.0.0.1") }

	got := b.AutoAssign(2, attr("h1", "n1"), skip)
	if !slices.Equal(got, []int{0, 2}) {
		t.Fatalf("first assign = %v, want [0 2] (ordinal 1 is skipped)", got)
	}
	b.BumpSequence()
	if !slices.Equal(b.Unallocated, []int{1, 3, 4, 5, 6, 7}) {
		t.Fatalf("unallocated = %v: a skipped ordinal must stay in place", b.Unallocated)
	}
	if len(b.Attributes) != 1 {
		t.Fatalf("two assignments of one attribute made %d attributes", len(b.Attributes))
	}
	if s, _ := b.SequenceOf(2); s != 100 || b.SequenceNumber != 101 {
		t.Fatalf("sequence of ordinal 2 = %d, block at %d; want 100 and 101", s, b.SequenceNumber)
	}
	mustValid(t, b)

	if got := b.AutoAssign(1, attr("h2", "n1"), skip); !slices.Equal(got, []int{3}) {
		t.Fatalf("second assign = %v, want [3]", got)
	}
	if s, _ := b.SequenceOf(3); s != 101 {
		t.Fatalf("sequence of ordinal 3 = %d, want 101", s)
	}
	mustValid(t, b)

	// Releasing h1's addresses drops its attribute and renumbers h2's.
	if err := b.Release(b.Ordinals(func(a *AllocationAttribute) bool { return a.Handle() == "h1" })...); err != nil {
		t.Fatal(err)
	}
	mustValid(t, b)
	if len(b.Attributes) != 1 || b.Attributes[0].Handle() != "h2" || *b.Allocations[3] != 0 {
		t.Fatalf("attributes after release: %+v, allocations[3] = %v", b.Attributes, *b.Allocations[3])
	}
	if !slices.Equal(b.Unallocated, []int{1, 4, 5, 6, 7, 0, 2}) {
		t.Fatalf("unallocated = %v: released ordinals go to the tail", b.Unallocated)
	}
	if _, ok := b.SequenceOf(0); ok {
		t.Fatal("released ordinal kept its sequence entry")
	}

	// Exhaust the block: every non-skipped address, then nothing.
	if got := b.AutoAssign(100, attr("h3", "n2"), skip); len(got) != 6 {
		t.Fatalf("assigned %d of the 6 remaining usable addresses", len(got))
	}
	if b.Free(skip) != 0 || b.Free(nil) != 1 {
		t.Fatalf("free = %d (skipping) / %d, want 0 / 1", b.Free(skip), b.Free(nil))
	}
	if got := b.AutoAssign(1, attr("h4", "n1"), skip); got != nil {
		t.Fatalf("full block assigned %v", got)
	}
	mustValid(t, b)
}

func TestAssignAndReleaseErrors(t *testing.T) {
	b := NewBlock(mustPrefix("fd00::/126"), "host:n1", 1)
	if err := b.Assign(2, attr("h", "n1")); err != nil {
		t.Fatal(err)
	}
	mustValid(t, b)
	if !slices.Equal(b.Unallocated, []int{0, 1, 3}) {
		t.Fatalf("unallocated = %v", b.Unallocated)
	}
	tests := []struct {
		name string
		err  error
	}{
		{"assign allocated", b.Assign(2, attr("x", "n1"))},
		{"assign out of range", b.Assign(4, attr("x", "n1"))},
		{"release free", b.Release(0)},
		{"release out of range", b.Release(-1)},
		{"release twice", b.Release(2, 2)},
	}
	for _, tc := range tests {
		var ae *AssignError
		if !errors.As(tc.err, &ae) {
			t.Errorf("%s: err = %v, want *AssignError", tc.name, tc.err)
		}
	}
	mustValid(t, b)
	if b.Allocated() != 1 {
		t.Fatal("a failed call changed the block")
	}
}

// TestAssignToPreV323Block: a block without sequenceNumberForAllocation gets the map, with entries for
// the allocations it already had, so the block stays valid.
func TestAssignToPreV323Block(t *testing.T) {
	b := NewBlock(mustPrefix("10.0.0.0/30"), "host:n1", 7)
	b.AutoAssign(1, attr("old", "n1"), nil)
	b.SequenceNumberForAllocation = nil
	b.AutoAssign(1, attr("new", "n1"), nil)
	mustValid(t, b)
	if len(b.SequenceNumberForAllocation) != 2 {
		t.Fatalf("sequence map = %v", b.SequenceNumberForAllocation)
	}
}

func TestHandleAddRemove(t *testing.T) {
	h := NewHandle()
	p, q := mustPrefix("10.0.0.0/26"), mustPrefix("fd00::/122")
	h.Add(p, 2)
	h.Add(q, 1)
	if h.Count() != 3 || h.Block["10.0.0.0/26"] != 2 {
		t.Fatalf("handle = %+v", h)
	}
	h.Remove(p, 1)
	h.Remove(q, 5)
	if h.Count() != 1 || len(h.Block) != 1 {
		t.Fatalf("handle after remove = %+v", h)
	}
	data, err := EncodeHandle(h)
	if err != nil || string(data) != `{"block":{"10.0.0.0/26":1},"deleted":false}` {
		t.Fatalf("encode = %s, %v", data, err)
	}
}

func TestFreeBlock(t *testing.T) {
	p := mustPrefix
	tests := []struct {
		name  string
		pool  string
		size  int
		start uint64
		used  []netip.Prefix
		want  string // "" = none
	}{
		{"empty pool from start", "10.0.0.0/24", 26, 0, nil, "10.0.0.0/26"},
		{"start index", "10.0.0.0/24", 26, 2, nil, "10.0.0.128/26"},
		{"start index wraps modulo", "10.0.0.0/24", 26, 6, nil, "10.0.0.128/26"},
		{"skip used", "10.0.0.0/24", 26, 1, []netip.Prefix{p("10.0.0.64/26")}, "10.0.0.128/26"},
		{"wrap around", "10.0.0.0/24", 26, 3, []netip.Prefix{p("10.0.0.192/26")}, "10.0.0.0/26"},
		{"larger used block covers two", "10.0.0.0/24", 26, 0, []netip.Prefix{p("10.0.0.0/25")}, "10.0.0.128/26"},
		{"smaller used block inside", "10.0.0.0/24", 26, 0, []netip.Prefix{p("10.0.0.8/29")}, "10.0.0.64/26"},
		{"used block covering the pool", "10.0.0.0/24", 26, 0, []netip.Prefix{p("10.0.0.0/16")}, ""},
		{"full", "10.0.0.0/25", 26, 0, []netip.Prefix{p("10.0.0.0/26"), p("10.0.0.64/26")}, ""},
		{"other family ignored", "10.0.0.0/25", 26, 0, []netip.Prefix{p("fd00::/122")}, "10.0.0.0/26"},
		{"outside pool ignored", "10.0.0.0/25", 26, 0, []netip.Prefix{p("10.0.1.0/24")}, "10.0.0.0/26"},
		{"merged adjacent", "10.0.0.0/24", 26, 0, []netip.Prefix{p("10.0.0.0/26"), p("10.0.0.64/27"), p("10.0.0.96/27")}, "10.0.0.128/26"},
		{"top of address space", "255.255.255.0/24", 26, 3, []netip.Prefix{p("255.255.255.192/26")}, "255.255.255.0/26"},
		{"whole v4 space", "0.0.0.0/0", 30, 0, nil, "0.0.0.0/30"},
		{"ipv6", "fd00::/120", 122, 1, []netip.Prefix{p("fd00::40/122")}, "fd00::80/122"},
		{"ipv6 huge pool", "fd00::/48", 122, 5, []netip.Prefix{p("fd00::140/122")}, "fd00::180/122"},
		{"ipv6 top", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/120", 122, 3,
			[]netip.Prefix{p("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffc0/122")}, "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ff00/122"},
		{"block as large as pool", "10.0.0.0/26", 26, 9, nil, "10.0.0.0/26"},
		{"block larger than pool", "10.0.0.0/26", 25, 0, nil, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := FreeBlock(p(tc.pool), tc.size, tc.start, tc.used)
			if tc.want == "" {
				if ok {
					t.Fatalf("got %s, want none", got)
				}
				return
			}
			if !ok || got != p(tc.want) {
				t.Fatalf("got %s (%v), want %s", got, ok, tc.want)
			}
		})
	}
}

// TestFreeBlockFillsPool claims every block of a pool one by one from many start points: every claim is
// new, none overlaps, and the pool ends full.
func TestFreeBlockFillsPool(t *testing.T) {
	pool := mustPrefix("10.1.0.0/22")
	var used []netip.Prefix
	for i := range 16 {
		b, ok := FreeBlock(pool, 26, uint64(i*7), used)
		if !ok {
			t.Fatalf("claim %d: pool full too early", i)
		}
		for _, u := range used {
			if u.Overlaps(b) {
				t.Fatalf("claim %d: %s overlaps %s", i, b, u)
			}
		}
		used = append(used, b)
	}
	if b, ok := FreeBlock(pool, 26, 3, used); ok {
		t.Fatalf("full pool gave %s", b)
	}
}

func TestLastAddrAndStart(t *testing.T) {
	if got := LastAddr(mustPrefix("10.0.0.64/26")); got != mustAddr("10.0.0.127") {
		t.Errorf("LastAddr = %s", got)
	}
	if got := LastAddr(mustPrefix("fd00::/64")); got != mustAddr("fd00::ffff:ffff:ffff:ffff") {
		t.Errorf("LastAddr v6 = %s", got)
	}
	a := BlockStartIndex("node-a", mustPrefix("10.0.0.0/16"), 26)
	if a >= 1024 || a != BlockStartIndex("node-a", mustPrefix("10.0.0.0/16"), 26) {
		t.Errorf("start index %d is not a stable index below 1024", a)
	}
	if BlockStartIndex("node-a", mustPrefix("10.0.0.0/16"), 26) == BlockStartIndex("node-b", mustPrefix("10.0.0.0/16"), 26) {
		t.Log("node-a and node-b hash to the same start (allowed, unlikely)")
	}
}
