package ipamd

import (
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// testState is a node state for node1 read at revision 10: pool p (10.244.0.0/16, /30 blocks) and,
// when blocks is set, affinities to those blocks, each block holding the given number of addresses.
func testState(tb testing.TB, blocks map[string]int) *nodeState {
	return stateWith(tb, 30, blocks, nil)
}

// stateWith is testState with blocks of the given size, whose addresses have the secondary attributes.
func stateWith(tb testing.TB, bits int, blocks map[string]int, secondary map[string]string) *nodeState {
	tb.Helper()
	s := newNodeState("node1", slog.New(slog.DiscardHandler))
	pool, _ := calico.EncodeIPPool(calico.IPPool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: bits})
	s.replace(srcPools, []kv{{Key: calico.IPPoolKey("p"), Value: pool, ModRevision: 3}}, 10)
	var affs []kv
	for c := range blocks {
		aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
		affs = append(affs, kv{Key: calico.HostAffinityKey("node1", netip.MustParsePrefix(c)), Value: aff, ModRevision: 4})
	}
	for _, src := range []source{srcConfig, srcReservations, srcNode, srcAffinity} {
		var kvs []kv
		if src == srcAffinity {
			kvs = affs
		}
		s.replace(src, kvs, 10)
	}
	for c, n := range blocks {
		cidr := netip.MustParsePrefix(c)
		b := calico.NewBlock(cidr, "host:node1", 1)
		for i := range n {
			h := "net1.other" + c + string(rune('a'+i))
			b.AutoAssign(1, calico.AllocationAttribute{HandleID: &h, Secondary: maps.Clone(secondary)}, nil)
		}
		data, _ := calico.EncodeBlock(b)
		s.setBlock(cidr, &kv{Key: calico.BlockKey(cidr), Value: data, ModRevision: 5}, 10)
	}
	return s
}

// decideOn decides the requests as a batch (reqs[0] its leader) on a new view of c's state: the
// view, and the decision's need or the leader's own failure.
func decideOn(c *call, d decision, reqs ...*request) (*view, error) {
	v := newView(c.state, c.conf, &c.read)
	err := v.decideBatch(reqs, d)
	if err == nil {
		err = reqs[0].err
	}
	return v, err
}

func testCall(s *nodeState) *call {
	return &call{conf: &cni.Request{Verb: "ADD", Network: "net1", Node: "node1", Assign: [2]bool{true, false}}, state: s, log: s.log}
}

// TestAddDecision: ADD decides on the state alone, without etcd: an address from the node's block
// with room, written conditional on that block's revision, the handle being absent and the state's
// freshness; with the blocks full, it needs the family's listing to claim; with the listing, it claims
// the next free block and writes its affinity.
func TestAddDecision(t *testing.T) {
	tests := []struct {
		name      string
		blocks    map[string]int
		listing   []string // nil: not read
		want      string   // "": any address of a block not listed (a claim)
		needs     bool
		wantClaim bool
	}{
		{name: "room in the node's block", blocks: map[string]int{"10.244.0.0/30": 1}, want: "10.244.0.1"},
		{name: "full block needs a listing", blocks: map[string]int{"10.244.0.0/30": 4}, needs: true},
		{name: "claim after the listing", blocks: map[string]int{"10.244.0.0/30": 4}, listing: []string{"10.244.0.0/30", "10.244.0.4/30"},
			wantClaim: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := testState(t, tt.blocks)
			if !s.synced() {
				t.Fatal("state not synced")
			}
			c := testCall(s)
			if tt.listing != nil {
				l := &listing{rev: 10}
				for _, p := range tt.listing {
					l.cidrs = append(l.cidrs, netip.MustParsePrefix(p))
				}
				c.read.listings[netaddr.V4] = l
			}
			r := &request{handle: "net1.c1", ifname: "eth0", attr: attribute(c.conf, "net1.c1", "eth0")}
			v, err := decideOn(c, (*view).add, r)
			got, held := r.allocs, !r.changed
			var n *needs
			if tt.needs {
				if !errors.As(err, &n) || !n.listing[netaddr.V4] {
					t.Fatalf("got %v %v, want a need for the ipv4 listing", got, err)
				}
				return
			}
			if err != nil || held || len(got) != 1 || (tt.want != "" && got[0].Addr.String() != tt.want) ||
				(tt.want == "" && slices.Contains(tt.listing, got[0].Block.String())) {
				t.Fatalf("got %v held=%v err=%v, want %q", got, held, err, tt.want)
			}
			p, err := v.writes()
			if err != nil {
				t.Fatal(err)
			}
			if (p.claims == 1) != tt.wantClaim {
				t.Fatalf("claims %d", p.claims)
			}
			blk := netip.PrefixFrom(got[0].Addr, 30).Masked()
			wants := []compare{modRevisionIs(calico.HandleKey("net1.c1"), 0), modRevisionIs(calico.IPAMConfigKey, 0),
				modRevisionIs(calico.NodeKey("node1"), 0), modRevisionIs(calico.IPPoolKey("p"), 3),
				noneChangedSince(calico.IPReservationPrefix, 10)}
			if tt.wantClaim {
				wants = append(wants, absent(calico.BlockKey(blk)), modRevisionIs(calico.HostAffinityKey("node1", blk), 0))
			} else {
				wants = append(wants, modRevisionIs(calico.BlockKey(blk), 5), modRevisionIs(calico.HostAffinityKey("node1", blk), 4))
			}
			for _, want := range wants {
				if !slices.ContainsFunc(p.cmps, func(c compare) bool { return reflect.DeepEqual(c, want) }) {
					t.Errorf("write not conditional on %+v", want)
				}
			}
			// The decision changed only the view: the state's block is as read.
			for cidr, e := range s.blocks {
				if e.b.Free(nil) != 4-tt.blocks[cidr.String()] {
					t.Errorf("deciding changed the state's block %s", cidr)
				}
			}
			// Committed, the state holds the write at its revision; a change of another key older
			// than the write (the pool's deletion, queued behind it) still applies.
			s.committed(p, 20)
			if e := s.blocks[blk]; e == nil || e.rev != 20 || e.b.AttributeOf(mustOrd(t, blk, got[0].Addr)) == nil {
				t.Errorf("state after commit: block %s %+v", blk, e)
			}
			s.event(srcPools, []kvEvent{{KV: kv{Key: calico.IPPoolKey("p")}, Rev: 15, Deleted: true}})
			if len(s.pools) != 0 {
				t.Errorf("the pool's deletion at 15 was dropped after a write at 20: %+v", s.pools)
			}
		})
	}
}

// TestRefusalNeedsFreshRead: a refusal taken on the state is first a need for the handle, every
// source and the node's blocks (with the listing the decision read); taken again on that read, it is
// the answer.
func TestRefusalNeedsFreshRead(t *testing.T) {
	cidr := netip.MustParsePrefix("10.244.0.0/30")
	s := testState(t, map[string]int{cidr.String(): 4})
	cfg, _ := calico.EncodeIPAMConfig(calico.IPAMConfig{AutoAllocateBlocks: false})
	s.replace(srcConfig, []kv{{Key: calico.IPAMConfigKey, Value: cfg, ModRevision: 11}}, 11)
	c := testCall(s)
	c.read.listings[netaddr.V4] = &listing{rev: 11, cidrs: []netip.Prefix{cidr}}
	r := &request{handle: "net1.c1", ifname: "eth0", attr: attribute(c.conf, "net1.c1", "eth0")}
	_, err := decideOn(c, (*view).add, r)
	var n *needs
	if !errors.As(err, &n) || !n.sources || !n.listing[netaddr.V4] || !slices.Equal(n.blocks, []netip.Prefix{cidr}) ||
		!slices.Equal(n.keys, []string{calico.HandleKey("net1.c1")}) {
		t.Fatalf("refusal on the state: %v %+v, want a need for the handle, the sources, block %s and the listing", err, n, cidr)
	}
	// What that read sets: the operation read every source (and the handle, absent).
	c.read.fresh, c.read.keys = true, map[string]*kv{calico.HandleKey("net1.c1"): nil}
	r.served, r.err = false, nil
	if _, err := decideOn(c, (*view).add, r); !errors.As(err, new(*codedError)) || !strings.Contains(err.Error(), "auto_allocate_blocks is off") {
		t.Fatalf("refusal on a fresh read: %v, want it answered", err)
	}
}

// TestReservationsKnownAt: the revision the reservations are known at follows reads and every
// change applied, a deletion included, and not a change older than what is known.
func TestReservationsKnownAt(t *testing.T) {
	s := testState(t, nil)
	if s.reservedRev != 10 {
		t.Fatalf("after a read at 10: %d", s.reservedRev)
	}
	r := kv{Key: calico.IPReservationKey("r"), Value: []byte(`{"spec":{"reservedCIDRs":["10.244.0.1"]}}`), ModRevision: 12}
	s.event(srcReservations, []kvEvent{{KV: r, Rev: 12}})
	if s.reservedRev != 12 || !s.reserved.Contains(netip.MustParseAddr("10.244.0.1")) {
		t.Fatalf("after a creation at 12: %d %v", s.reservedRev, s.reserved)
	}
	s.event(srcReservations, []kvEvent{{KV: kv{Key: r.Key}, Rev: 14, Deleted: true}})
	s.event(srcReservations, []kvEvent{{KV: r, Rev: 13}}) // older than the deletion: dropped
	if s.reservedRev != 14 || len(s.reserved) != 0 {
		t.Fatalf("after a deletion at 14 and a change at 13: %d %v", s.reservedRev, s.reserved)
	}
	s.replace(srcReservations, nil, 20)
	if s.reservedRev != 20 {
		t.Fatalf("after a read at 20: %d", s.reservedRev)
	}
}

func mustOrd(t *testing.T, b netip.Prefix, a netip.Addr) int {
	o, ok := calico.Ordinal(b, a)
	if !ok {
		t.Fatalf("%s not in %s", a, b)
	}
	return o
}

// TestStateOrdersUpdates: an update older than what the state knows is dropped, whichever way it
// came (a watch event, a relist, a transaction's read).
func TestStateOrdersUpdates(t *testing.T) {
	s := testState(t, nil)
	pool := func(rev int64, disabled bool) kv {
		v, _ := calico.EncodeIPPool(calico.IPPool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26, Disabled: disabled})
		return kv{Key: calico.IPPoolKey("p"), Value: v, ModRevision: rev}
	}
	s.event(srcPools, []kvEvent{{KV: pool(12, true), Rev: 12}})
	s.replace(srcPools, []kv{pool(3, false)}, 11) // a relist older than the event
	if len(s.pools) != 1 || !s.pools[0].Disabled {
		t.Fatalf("stale relist applied: %+v", s.pools)
	}
	s.event(srcPools, []kvEvent{{KV: kv{Key: calico.IPPoolKey("p")}, Rev: 13, Deleted: true}})
	if len(s.pools) != 0 {
		t.Fatalf("deleted pool kept: %+v", s.pools)
	}
	// A block is kept only while the node has its affinity.
	aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	cidr := netip.MustParsePrefix("10.244.0.0/26")
	s.event(srcAffinity, []kvEvent{{KV: kv{Key: calico.HostAffinityKey("node1", cidr), Value: aff, ModRevision: 14}, Rev: 14}})
	if s.synced() {
		t.Fatal("synced without the affinity's block")
	}
	s.setBlock(cidr, nil, 14)
	if !s.synced() {
		t.Fatal("not synced with every block read")
	}
	s.event(srcAffinity, []kvEvent{{KV: kv{Key: calico.HostAffinityKey("node1", cidr)}, Rev: 15, Deleted: true}})
	if _, ok := s.blockKnown[cidr]; ok {
		t.Fatal("block kept after its affinity went")
	}
}

// TestStateSameRevisionEvents: one transaction that writes two keys of a source gives two events at
// one revision; both apply.
func TestStateSameRevisionEvents(t *testing.T) {
	s := testState(t, nil)
	a, _ := calico.EncodeIPPool(calico.IPPool{Name: "a", CIDR: netip.MustParsePrefix("10.1.0.0/16"), BlockSize: 26})
	b, _ := calico.EncodeIPPool(calico.IPPool{Name: "b", CIDR: netip.MustParsePrefix("10.2.0.0/16"), BlockSize: 26})
	s.apply(update{src: srcPools, events: []kvEvent{
		{KV: kv{Key: calico.IPPoolKey("a"), Value: a, ModRevision: 11}, Rev: 11},
		{KV: kv{Key: calico.IPPoolKey("b"), Value: b, ModRevision: 11}, Rev: 11},
	}})
	if len(s.pools) != 3 {
		t.Errorf("pools after one transaction added two to one: %+v", s.pools)
	}
}

// TestStateWriteNotUndoneByOlderRead: a key this daemon deleted or wrote at revision 20 is not
// restored by a read of its source at 15 (a relist that was under way), whether or not the write
// was conditional on the whole source.
func TestStateWriteNotUndoneByOlderRead(t *testing.T) {
	cidr, other := netip.MustParsePrefix("10.244.0.0/30"), netip.MustParsePrefix("10.244.0.4/30")
	s := testState(t, map[string]int{cidr.String(): 0})
	aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	pending, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityPending})
	key, otherKey := calico.HostAffinityKey("node1", cidr), calico.HostAffinityKey("node1", other)
	s.committed(&plan{blocks: map[netip.Prefix]*blockEntry{cidr: nil}, affinity: map[string][]byte{key: nil, otherKey: aff}}, 20)
	s.replace(srcAffinity, []kv{{Key: key, Value: aff, ModRevision: 4}, {Key: otherKey, Value: pending, ModRevision: 12}}, 15)
	if _, ok := s.affinity[cidr]; ok {
		t.Errorf("an affinity deleted at 20 came back from a read at 15")
	}
	if a := s.affinity[other]; a.state != calico.AffinityConfirmed || a.rev != 20 {
		t.Errorf("an affinity written at 20 is %+v after a read at 15", a)
	}
	// A read after the write covers both keys.
	s.replace(srcAffinity, []kv{{Key: otherKey, Value: aff, ModRevision: 20}}, 21)
	if len(s.affinity) != 1 || len(s.revs[srcAffinity]) != 1 {
		t.Errorf("after a read at 21: affinities %+v, revisions %v", s.affinity, s.revs[srcAffinity])
	}
}

// TestOverlapKeys: a claim is conditional on the absence of every key of a block of another size in
// use that would overlap it, or, past maxOverlapKeys, on the family's listing.
func TestOverlapKeys(t *testing.T) {
	c := netip.MustParsePrefix("10.244.1.0/26")
	tests := []struct {
		sizes []int
		want  []string
		ok    bool
	}{
		{sizes: []int{26}, ok: true},
		{sizes: []int{24, 26}, want: []string{"10.244.1.0/24"}, ok: true},
		{sizes: []int{26, 28}, want: []string{"10.244.1.0/28", "10.244.1.16/28", "10.244.1.32/28", "10.244.1.48/28"}, ok: true},
		{sizes: []int{26, 32}, ok: false},
	}
	for _, tt := range tests {
		s := testState(t, nil)
		tc := testCall(s)
		v := newView(s, tc.conf, &tc.read)
		v.pools = nil
		for _, bits := range tt.sizes {
			v.pools = append(v.pools, calico.IPPool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: bits})
		}
		keys, ok := v.overlapKeys(c)
		var want []string
		for _, w := range tt.want {
			want = append(want, calico.BlockKey(netip.MustParsePrefix(w)))
		}
		if ok != tt.ok || !slices.Equal(keys, want) {
			t.Errorf("sizes %v: got %v %v, want %v %v", tt.sizes, keys, ok, want, tt.ok)
		}
	}
}

// TestDelReleasesOtherNodesEmptiedBlock: a DEL that empties another node's block (a borrowed address)
// whose pool no longer selects that node reads the node's labels and affinity, then deletes the block
// and that affinity in the release's own write, conditional on both as read.
func TestDelReleasesOtherNodesEmptiedBlock(t *testing.T) {
	s := testState(t, nil)
	sel, _ := calico.EncodeIPPool(calico.IPPool{CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 30, NodeSelector: "rack == 'a'"})
	s.replace(srcPools, []kv{{Key: calico.IPPoolKey("p"), Value: sel, ModRevision: 11}}, 11)
	cidr := netip.MustParsePrefix("10.244.0.8/30")
	b := calico.NewBlock(cidr, "host:node2", 1)
	h := "net1.c1"
	b.AutoAssign(1, calico.AllocationAttribute{HandleID: &h, Secondary: map[string]string{calico.AttrNode: "node1"}}, nil)
	data, _ := calico.EncodeBlock(b)
	c := testCall(s)
	c.conf.Verb = "DEL"
	c.gotBlock(cidr, &kv{Key: calico.BlockKey(cidr), Value: data, ModRevision: 7}, 12)
	hv := calico.NewHandle()
	hv.Add(cidr, 1)
	hdata, _ := calico.EncodeHandle(hv)
	c.read.keys = map[string]*kv{calico.HandleKey(h): {Key: calico.HandleKey(h), Value: hdata, ModRevision: 8}}
	decide := func() (*view, error) { return decideOn(c, (*view).del, &request{handle: h, ifname: "eth0"}) }
	nodeKey, affKey := calico.NodeKey("node2"), calico.HostAffinityKey("node2", cidr)
	_, err := decide()
	var n *needs
	if !errors.As(err, &n) || !slices.Equal(n.keys, []string{nodeKey, affKey}) {
		t.Fatalf("got %v, want a need for node2's Node resource and affinity", err)
	}
	aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	maps.Copy(c.read.keys, map[string]*kv{
		nodeKey: {Key: nodeKey, Value: []byte(`{"metadata":{"name":"node2","labels":{"rack":"b"}}}`), ModRevision: 5},
		affKey:  {Key: affKey, Value: aff, ModRevision: 6},
	})
	v, err := decide()
	if err != nil {
		t.Fatal(err)
	}
	p, err := v.writes()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []compare{modRevisionIs(calico.BlockKey(cidr), 7), modRevisionIs(affKey, 6), modRevisionIs(nodeKey, 5),
		modRevisionIs(calico.IPPoolKey("p"), 11), modRevisionIs(calico.HandleKey(h), 8)} {
		if !slices.ContainsFunc(p.cmps, func(c compare) bool { return reflect.DeepEqual(c, want) }) {
			t.Errorf("write not conditional on %+v", want)
		}
	}
	for _, key := range []string{calico.BlockKey(cidr), affKey, calico.HandleKey(h)} {
		if !slices.ContainsFunc(p.ops, func(o op) bool { return o.IsDelete() && string(o.KeyBytes()) == key }) {
			t.Errorf("write does not delete %s: %+v", key, p.ops)
		}
	}
}

// TestBatchedAddsFitTheTransaction: however many ADDs wait (4*maxBatch here), those the leader's
// write serves keep it within maxTxnOps, in one /26 block (all of its free addresses served) and
// spread over many /30 blocks; those that do not fit are skipped, the view untouched by them.
func TestBatchedAddsFitTheTransaction(t *testing.T) {
	many := map[string]int{}
	for i := range 120 {
		many[netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i / 64), byte(i % 64 * 4)}), 30).String()] = 0
	}
	for name, s := range map[string]*nodeState{"/26": stateWith(t, 26, map[string]int{"10.244.0.0/26": 0}, nil), "/30s": testState(t, many)} {
		t.Run(name, func(t *testing.T) {
			c := testCall(s)
			var reqs []*request
			for i := range 1 + 4*maxBatch {
				h := fmt.Sprintf("net1.w%03d", i)
				reqs = append(reqs, &request{handle: h, ifname: "eth0", attr: attribute(c.conf, h, "eth0")})
			}
			v, err := decideOn(c, (*view).add, reqs...)
			if err != nil {
				t.Fatal(err)
			}
			p, err := v.writes()
			if err != nil {
				t.Fatal(err)
			}
			served, assigned := len(v.handles)-1, 0
			for _, e := range v.blocks {
				assigned += len(e.b.Ordinals(func(*calico.AllocationAttribute) bool { return true }))
			}
			if assigned != served+1 {
				t.Errorf("%d addresses assigned in the view, for %d ADDs", assigned, served+1)
			}
			if len(p.cmps) > maxTxnOps || len(p.ops) > maxTxnOps {
				t.Errorf("%d ADDs served: %d compares, %d operations, want at most %d", served, len(p.cmps), len(p.ops), maxTxnOps)
			}
			if served < maxTxnOps/4 {
				t.Errorf("%d ADDs served, want at least %d", served, maxTxnOps/4)
			}
			t.Logf("%d ADDs served: %d compares, %d operations", served, len(p.cmps), len(p.ops))
		})
	}
}
