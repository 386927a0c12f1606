package blockwatch

import (
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/logging"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// TestInitialList lists Calico's real values of both families, peers and pools.
func TestInitialList(t *testing.T) {
	_, cli := startEtcd(t)
	for _, v := range loadTestdata(t) {
		put(t, cli, v.Key, string(v.Value))
	}
	ctx := testCtx(t)
	for node, addrs := range map[string][]string{"node-a": {"192.0.2.1", "2001:db8::1"}, "node-b": {"192.0.2.2"}} {
		for _, a := range addrs {
			if err := calicotest.PutPeer(ctx, cli, DefaultHostsPrefix, node, mustAddr(a)); err != nil {
				t.Fatal(err)
			}
		}
	}
	pools := map[string]calico.IPPool{
		"default-ipv4-ippool": {Name: "default-ipv4-ippool", CIDR: mustPrefix("10.244.0.0/16"), BlockSize: 26, NodeSelector: "all()"},
		"default-ipv6-ippool": {Name: "default-ipv6-ippool", CIDR: mustPrefix("fd00:10:244::/48"), BlockSize: 122, Disabled: true,
			NodeSelector: "all()", AllowedUses: []string{"Workload"}},
	}
	for _, p := range pools {
		v, err := calico.EncodeIPPool(p)
		if err != nil {
			t.Fatal(err)
		}
		put(t, cli, calico.IPPoolKey(p.Name), string(v))
	}
	rev := put(t, cli, "/unrelated/key", "x")

	for _, legacy := range []bool{false, true} {
		t.Run(fmt.Sprintf("legacy=%v", legacy), func(t *testing.T) {
			h := newHarness(t, cli, func(c *Config) { c.LegacyHostAffinity = legacy })
			h.run()
			s := h.next()
			if !s.Full || s.RelistReason != ReasonInitial || s.Revision != rev {
				t.Fatalf("first snapshot: full %v reason %q rev %d, want initial at %d", s.Full, s.RelistReason, s.Revision, rev)
			}
			legacyOwner := calico.Owner{}
			if legacy {
				legacyOwner = calico.Owner{Kind: calico.OwnerLegacyHost, Node: "node-old"}
			}
			want := map[netip.Prefix]*Block{
				mustPrefix("10.244.1.64/26"): {CIDR: mustPrefix("10.244.1.64/26"), Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-a"},
					Borrowed: []calico.Borrowed{{Ordinal: 4, Addr: mustAddr("10.244.1.68"), Node: "node-b"}}},
				mustPrefix("fd00:10:244:0:8e1f:1a2b:3c4d:5e40/122"): {CIDR: mustPrefix("fd00:10:244:0:8e1f:1a2b:3c4d:5e40/122"),
					Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-a"}},
				mustPrefix("192.168.45.0/26"): {CIDR: mustPrefix("192.168.45.0/26"), Owner: legacyOwner},
				mustPrefix("203.0.113.0/26"):  {CIDR: mustPrefix("203.0.113.0/26"), Owner: calico.Owner{Kind: calico.OwnerVirtual, Node: "load-balancer"}},
				// deleted-kdd (deleted:true) is absent.
			}
			checkBlocks(t, s, want)
			if s.ChangedBlocks != nil { // the first list has no previous view to differ from
				t.Errorf("ChangedBlocks %v, want none", s.ChangedBlocks)
			}
			wantPeers := map[string]Peer{
				"node-a": {IPv4: mustAddr("192.0.2.1"), IPv6: mustAddr("2001:db8::1")},
				"node-b": {IPv4: mustAddr("192.0.2.2")},
			}
			if !maps.EqualFunc(s.Peers, wantPeers, func(a, b Peer) bool { return addrs(a) == b }) || s.ChangedPeers != nil {
				t.Errorf("peers %v changed %v, want %v", s.Peers, s.ChangedPeers, wantPeers)
			}
			if !maps.EqualFunc(s.Pools, pools, poolEqual) || !s.PoolsChanged {
				t.Errorf("pools %+v (changed %v), want %+v", s.Pools, s.PoolsChanged, pools)
			}
			st := h.w.Status()
			if !st.Synced || st.Revision != rev || st.Relists != 0 || st.LastError != "" {
				t.Errorf("status %+v", st)
			}
			if n := h.counter("vpp_route_agent_etcd_relists_total", "reason", ReasonInitial); n != 1 {
				t.Errorf("relists_total{initial} = %v", n)
			}
			if n := h.counter("vpp_route_agent_malformed_values_total"); n != 0 {
				t.Errorf("malformed_values_total = %v", n)
			}
		})
	}
}

func checkBlocks(t testing.TB, s *Snapshot, want map[netip.Prefix]*Block) {
	t.Helper()
	if !maps.EqualFunc(s.Blocks.Map(), want, (*Block).Equal) {
		for k, b := range s.Blocks.All() {
			t.Logf("got  %s: %+v", k, *b)
		}
		for k, b := range want {
			t.Logf("want %s: %+v", k, *b)
		}
		t.Fatalf("snapshot rev %d: blocks differ", s.Revision)
	}
}

// TestEvents checks creates, updates and deletes of blocks, peers and pools as incremental snapshots.
func TestEvents(t *testing.T) {
	_, cli := startEtcd(t)
	h := newHarness(t, cli, nil)
	h.run()
	if s := h.next(); !s.Full || s.Blocks.Len() != 0 || len(s.ChangedBlocks) != 0 {
		t.Fatalf("initial snapshot of an empty etcd: %+v", s)
	}
	cidr := mustPrefix("10.244.7.0/26")
	b := calicotest.Block(cidr, "node-a", 1)

	// Create.
	rev := putBlock(t, cli, b)
	s := h.next()
	if s.Full || s.Revision != rev || !slices.Equal(s.ChangedBlocks, []netip.Prefix{cidr}) || len(s.ChangedPeers) != 0 || s.PoolsChanged {
		t.Fatalf("create: %+v", s)
	}
	checkBlocks(t, s, map[netip.Prefix]*Block{cidr: {CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-a"}}})
	prev := s

	// A pod allocated on the owner changes no route: no snapshot.
	calicotest.Allocate(b, "k8s-pod-network.x", calicotest.PodAttrs("node-a", "ns", "p", time.Now()))
	h.settled(putBlock(t, cli, b))

	// Borrowed change: node-b takes an address of node-a's block.
	ord := calicotest.Allocate(b, "k8s-pod-network.y", calicotest.PodAttrs("node-b", "ns", "q", time.Now()))
	rev = putBlock(t, cli, b)
	s = h.next()
	addr, _ := calico.OrdinalAddr(cidr, ord)
	want := &Block{CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-a"}, Borrowed: []calico.Borrowed{{Ordinal: ord, Addr: addr, Node: "node-b"}}}
	if s.Revision != rev || !slices.Equal(s.ChangedBlocks, []netip.Prefix{cidr}) {
		t.Fatalf("borrow: %+v", s)
	}
	checkBlocks(t, s, map[netip.Prefix]*Block{cidr: want})
	// The previous snapshot is untouched (copy-on-write).
	if !prev.Blocks.Get(cidr).Equal(&Block{CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-a"}}) {
		t.Fatalf("previous snapshot changed: %+v", prev.Blocks.Get(cidr))
	}

	// Owner change: the block moves to node-b, whose own address is no longer borrowed.
	aff := "host:node-b"
	b.Affinity = &aff
	putBlock(t, cli, b)
	s = h.next()
	checkBlocks(t, s, map[netip.Prefix]*Block{cidr: {CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-b"},
		Borrowed: []calico.Borrowed{{Ordinal: 0, Addr: cidr.Addr(), Node: "node-a"}, {Ordinal: 1, Addr: cidr.Addr().Next(), Node: "node-a"},
			{Ordinal: 2, Addr: cidr.Addr().Next().Next(), Node: "node-a"}, {Ordinal: 3, Addr: cidr.Addr().Next().Next().Next(), Node: "node-a"}}}})

	// deleted:true removes it.
	b.Deleted = true
	putBlock(t, cli, b)
	s = h.next()
	if s.Blocks.Len() != 0 || !slices.Equal(s.ChangedBlocks, []netip.Prefix{cidr}) {
		t.Fatalf("deleted:true: %+v", s)
	}
	// Back, then a real delete.
	b.Deleted = false
	putBlock(t, cli, b)
	if s = h.next(); s.Blocks.Len() != 1 {
		t.Fatalf("recreate: %+v", s)
	}
	del(t, cli, calico.BlockKey(cidr))
	if s = h.next(); s.Blocks.Len() != 0 || !slices.Equal(s.ChangedBlocks, []netip.Prefix{cidr}) {
		t.Fatalf("delete: %+v", s)
	}

	// A v6 block.
	v6 := mustPrefix("fd00:10:244::c0/122")
	putBlock(t, cli, calicotest.Block(v6, "node-c", 2))
	if s = h.next(); s.Blocks.Get(v6) == nil || s.Blocks.Get(v6).Owner.Node != "node-c" {
		t.Fatalf("v6 create: %+v", s)
	}

	// Peers: register, change, unregister one family, then the other.
	ctx := testCtx(t)
	if err := calicotest.PutPeer(ctx, cli, DefaultHostsPrefix, "node-c", mustAddr("192.0.2.3")); err != nil {
		t.Fatal(err)
	}
	if s = h.next(); addrs(s.Peers["node-c"]) != (Peer{IPv4: mustAddr("192.0.2.3")}) || !slices.Equal(s.ChangedPeers, []string{"node-c"}) || len(s.ChangedBlocks) != 0 {
		t.Fatalf("peer register: %+v", s)
	}
	if err := calicotest.PutPeer(ctx, cli, DefaultHostsPrefix, "node-c", mustAddr("2001:db8::3")); err != nil {
		t.Fatal(err)
	}
	if s = h.next(); addrs(s.Peers["node-c"]) != (Peer{IPv4: mustAddr("192.0.2.3"), IPv6: mustAddr("2001:db8::3")}) {
		t.Fatalf("peer v6: %+v", s.Peers)
	}
	// Same value again: no change.
	h.settled(put(t, cli, PeerKey(DefaultHostsPrefix, "node-c", netaddr.V6), "2001:db8::3"))
	del(t, cli, PeerKey(DefaultHostsPrefix, "node-c", netaddr.V4))
	if s = h.next(); addrs(s.Peers["node-c"]) != (Peer{IPv6: mustAddr("2001:db8::3")}) {
		t.Fatalf("peer v4 unregistered: %+v", s.Peers)
	}
	del(t, cli, PeerKey(DefaultHostsPrefix, "node-c", netaddr.V6))
	if s = h.next(); len(s.Peers) != 0 || !slices.Equal(s.ChangedPeers, []string{"node-c"}) {
		t.Fatalf("peer gone: %+v", s)
	}

	// Pools.
	p := calico.IPPool{Name: "p1", CIDR: mustPrefix("10.244.0.0/16"), BlockSize: 26}
	v, _ := calico.EncodeIPPool(p)
	put(t, cli, calico.IPPoolKey("p1"), string(v))
	if s = h.next(); !s.PoolsChanged || s.Pools["p1"].CIDR != p.CIDR || len(s.ChangedBlocks)+len(s.ChangedPeers) != 0 {
		t.Fatalf("pool create: %+v", s)
	}
	del(t, cli, calico.IPPoolKey("p1"))
	if s = h.next(); !s.PoolsChanged || len(s.Pools) != 0 {
		t.Fatalf("pool delete: %+v", s)
	}

	if n := h.counter("vpp_route_agent_etcd_events_total", "source", "blocks", "type", "put"); n != 7 {
		t.Errorf("events_total{blocks,put} = %v, want 7", n)
	}
	if n := h.counter("vpp_route_agent_etcd_events_total", "source", "hosts", "type", "delete"); n != 2 {
		t.Errorf("events_total{hosts,delete} = %v, want 2", n)
	}
	if st := h.w.Status(); !st.Synced || st.Revision != s.Revision {
		t.Errorf("status %+v, last snapshot rev %d", st, s.Revision)
	}
}

// TestHostRegistersAfterBlocks: a node's blocks appear first, its peer IP later.
func TestHostRegistersAfterBlocks(t *testing.T) {
	_, cli := startEtcd(t)
	ctx := testCtx(t)
	if _, err := calicotest.PutBlocks(ctx, cli, 3, func(int) string { return "node-late" }); err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, cli, nil)
	h.run()
	s := h.next()
	if s.Blocks.Len() != 3 || len(s.Peers) != 0 {
		t.Fatalf("initial: %d blocks, peers %v", s.Blocks.Len(), s.Peers)
	}
	if err := calicotest.PutPeer(ctx, cli, DefaultHostsPrefix, "node-late", mustAddr("198.51.100.9")); err != nil {
		t.Fatal(err)
	}
	s = h.next()
	if s.Full || s.Blocks.Len() != 3 || s.Peers["node-late"].IPv4 != mustAddr("198.51.100.9") ||
		!slices.Equal(s.ChangedPeers, []string{"node-late"}) || len(s.ChangedBlocks) != 0 {
		t.Fatalf("after registration: %+v", s)
	}
}

// TestMalformedValues: bad values are counted and skipped; a bad write keeps the last good value,
// also across a relist; the watch keeps going.
func TestMalformedValues(t *testing.T) {
	_, cli := startEtcd(t)
	good := mustPrefix("10.244.1.0/26")
	putBlock(t, cli, calicotest.Block(good, "node-a", 1))
	put(t, cli, calico.BlockKey(mustPrefix("10.244.2.0/26")), "{not json")                  // new key, bad JSON
	put(t, cli, calico.BlockPrefix+"ipv4/block/10.244.3.1-26", `{}`)                        // non-canonical key
	put(t, cli, calico.BlockPrefix+"ipv4/other", `{}`)                                      // foreign key
	put(t, cli, PeerKey(DefaultHostsPrefix, "node-x", netaddr.V4), "2001:db8::1")           // v6 under ipv4
	put(t, cli, PeerKey(DefaultHostsPrefix, "node-y", netaddr.V4), "not-an-ip")             // bad IP
	put(t, cli, calico.IPPoolKey("bad"), `{"metadata":{"name":"bad"},"spec":{"cidr":"x"}}`) // bad pool
	h := newHarness(t, cli, nil)
	h.run()
	s := h.next()
	if s.Blocks.Len() != 1 || s.Blocks.Get(good) == nil || len(s.Peers) != 0 || len(s.Pools) != 0 {
		t.Fatalf("initial: blocks %v peers %v pools %v", s.Blocks, s.Peers, s.Pools)
	}
	// The unreadable block is held: its key names the CIDR, even though no good value was ever seen.
	if h, ok := s.Held[mustPrefix("10.244.2.0/26")]; len(s.Held) != 1 || !ok || h.LastGood || !strings.Contains(h.Reason, "decode block") {
		t.Fatalf("initial: held %+v", s.Held)
	}
	if n := h.counter("vpp_route_agent_malformed_values_total"); n != 6 {
		t.Errorf("malformed after list = %v, want 6", n)
	}

	// A bad write on the good key keeps the last good value and holds the block; counter up.
	put(t, cli, calico.BlockKey(good), `{"cidr":`)
	s, _ = h.waitFor("the good block held", func(s *Snapshot) bool { return s.Held[good] != (Held{}) })
	if !s.Held[good].LastGood || s.Blocks.Get(good) == nil || s.Blocks.Get(good).Owner.Node != "node-a" || !slices.Contains(s.ChangedBlocks, good) {
		t.Fatalf("bad write: held %+v blocks %v changed %v", s.Held, s.Blocks, s.ChangedBlocks)
	}
	cidrMismatch := calicotest.Block(mustPrefix("10.244.9.0/26"), "node-z", 2)
	v, _ := calico.EncodeBlock(cidrMismatch)
	put(t, cli, calico.BlockKey(good), string(v)) // value cidr differs from key
	s, _ = h.waitFor("a new reason", func(s *Snapshot) bool { return strings.Contains(s.Held[good].Reason, "differs") })
	if n := h.counter("vpp_route_agent_malformed_values_total"); n != 8 {
		t.Errorf("malformed = %v, want 8", n)
	}
	// The watch goes on: a peer with a good address arrives, a bad rewrite of it keeps it.
	put(t, cli, PeerKey(DefaultHostsPrefix, "node-a", netaddr.V4), "192.0.2.1")
	s = h.next()
	if s.Peers["node-a"].IPv4 != mustAddr("192.0.2.1") || s.Blocks.Get(good) == nil || s.Blocks.Get(good).Owner.Node != "node-a" {
		t.Fatalf("after bad writes: blocks %v peers %v", s.Blocks, s.Peers)
	}
	put(t, cli, PeerKey(DefaultHostsPrefix, "node-a", netaddr.V4), "fe80::1%eth0")
	p := calico.IPPool{Name: "p", CIDR: mustPrefix("10.244.0.0/16"), BlockSize: 26}
	pv, _ := calico.EncodeIPPool(p)
	put(t, cli, calico.IPPoolKey("p"), string(pv))
	s = h.next()
	if s.Peers["node-a"].IPv4 != mustAddr("192.0.2.1") || s.Pools["p"].CIDR != p.CIDR {
		t.Fatalf("after bad peer: peers %v pools %v", s.Peers, s.Pools)
	}
	put(t, cli, calico.IPPoolKey("p"), `{"metadata":{"name":"other"},"spec":{"cidr":"10.0.0.0/8"}}`) // name mismatch

	// A relist keeps the last good values of keys that are now malformed.
	h.w.Relist()
	s = h.next()
	if !s.Full || s.RelistReason != ReasonRequested || s.Blocks.Get(good) == nil || s.Blocks.Get(good).Owner.Node != "node-a" ||
		s.Peers["node-a"].IPv4 != mustAddr("192.0.2.1") || s.Pools["p"].CIDR != p.CIDR {
		t.Fatalf("relist: %+v", s)
	}
	if len(s.ChangedBlocks)+len(s.ChangedPeers) != 0 || s.PoolsChanged || len(s.Held) != 2 {
		t.Errorf("relist with nothing changed reports changes: %v %v %v (held %v)", s.ChangedBlocks, s.ChangedPeers, s.PoolsChanged, s.Held)
	}
	// Only a delete removes it.
	del(t, cli, calico.BlockKey(good))
	if s = h.next(); s.Blocks.Len() != 0 || !slices.Equal(s.ChangedBlocks, []netip.Prefix{good}) || len(s.Held) != 1 {
		t.Fatalf("delete of a key holding a bad value: %+v", s)
	}
	if st := h.w.Status(); !st.Synced || st.LastError != "" {
		t.Errorf("status %+v", st)
	}
}

// TestPagination lists 100 blocks in pages of 7 while a writer moves blocks between pages: the
// initial snapshot must be exactly etcd's state at its revision.
func TestPagination(t *testing.T) {
	s, cli := startEtcd(t)
	ctx := testCtx(t)
	if _, err := calicotest.PutBlocks(ctx, cli, 100, func(i int) string { return fmt.Sprintf("node-%d", i%5) }); err != nil {
		t.Fatal(err)
	}
	writer := fastClient(t, s.Endpoint())
	h := newHarness(t, cli, func(c *Config) { c.PageSize = 7 })
	var pages, moved atomic.Int32
	h.w.testHookPage = func(src source, page int) {
		if src != srcBlocks {
			return
		}
		pages.Add(1)
		// Move a block from the part already listed to the part not listed yet, and change an owner
		// in the part not listed yet: a mixed view would have 99 or 101 blocks or a stale owner.
		i := int(moved.Add(1)) - 1
		from, to := calicotest.BlockCIDR(i), calicotest.BlockCIDR(1000+i)
		v, _ := calico.EncodeBlock(calicotest.Block(to, "node-moved", i))
		w, _ := calico.EncodeBlock(calicotest.Block(calicotest.BlockCIDR(99-i), "node-new-owner", i))
		_, err := writer.Txn(ctx).Then(clientv3.OpDelete(calico.BlockKey(from)), clientv3.OpPut(calico.BlockKey(to), string(v)),
			clientv3.OpPut(calico.BlockKey(calicotest.BlockCIDR(99-i)), string(w))).Commit()
		if err != nil {
			t.Errorf("writer: %v", err)
		}
	}
	h.run()
	snap := h.next()
	if got := pages.Load(); got != 15 {
		t.Errorf("listed %d block pages, want 15 (100 blocks / 7)", got)
	}
	if snap.Blocks.Len() != 100 {
		t.Errorf("initial snapshot has %d blocks, want 100", snap.Blocks.Len())
	}
	// Etcd's own state at the snapshot's revision.
	resp, err := cli.Get(ctx, calico.BlockPrefix, clientv3.WithPrefix(), clientv3.WithRev(snap.Revision))
	if err != nil {
		t.Fatal(err)
	}
	want := map[netip.Prefix]string{}
	for _, kv := range resp.Kvs {
		k, _ := calico.ParseKey(string(kv.Key))
		b, _ := calico.DecodeBlock(kv.Value)
		want[k.CIDR] = calico.OwnerOf(b, false).Node
	}
	got := map[netip.Prefix]string{}
	for k, b := range snap.Blocks.All() {
		got[k] = b.Owner.Node
	}
	if !maps.Equal(got, want) {
		t.Fatalf("snapshot at revision %d is not etcd's state at that revision:\n got %v\nwant %v", snap.Revision, got, want)
	}
	// The writes made during the list arrive as events afterwards.
	h.w.testHookPage = nil
	final, err := cli.Get(ctx, calico.BlockPrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	last, _ := h.waitFor("the writer's last revision", func(s *Snapshot) bool { return s.Revision >= final.Header.Revision })
	if last.Blocks.Len() != 100 || last.Blocks.Get(calicotest.BlockCIDR(1014)) == nil {
		t.Errorf("after the writes: %d blocks", last.Blocks.Len())
	}
}

// TestCompactionRelist makes the watch fall behind (its connection is cut while others write), compacts
// etcd, and checks the Full "compacted" snapshot. The probe interval is long enough that the client's
// own resumption of the watch, not the stall detection, meets the compaction.
func TestCompactionRelist(t *testing.T) {
	srv, cli := startEtcd(t)
	px := newProxy(t, srv.Endpoint())
	wcli := fastClient(t, px.Endpoint())
	a, b, c, d, e := mustPrefix("10.1.0.0/26"), mustPrefix("10.1.0.64/26"), mustPrefix("10.1.0.128/26"), mustPrefix("10.1.0.192/26"), mustPrefix("10.1.1.0/26")
	putBlock(t, cli, calicotest.Block(a, "node-a", 1))
	putBlock(t, cli, calicotest.Block(b, "node-b", 2))
	h := newHarness(t, wcli, func(c *Config) { c.ProbeInterval = 5 * time.Second })
	h.run()
	if s := h.next(); s.Blocks.Len() != 2 {
		t.Fatalf("initial: %v", s.Blocks)
	}
	putBlock(t, cli, calicotest.Block(c, "node-c", 3))
	if s := h.next(); s.Blocks.Len() != 3 || s.Full {
		t.Fatalf("watch: %v", s.Blocks)
	}

	px.Block()
	putBlock(t, cli, calicotest.Block(d, "node-d", 4))
	del(t, cli, calico.BlockKey(a))
	putBlock(t, cli, calicotest.Block(e, "node-e", 5))
	del(t, cli, calico.BlockKey(e))
	putBlock(t, cli, calicotest.Block(b, "node-b2", 2))
	if err := calicotest.PutPeer(testCtx(t), cli, DefaultHostsPrefix, "node-d", mustAddr("192.0.2.4")); err != nil {
		t.Fatal(err)
	}
	crev, err := srv.Compact(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	px.Unblock()

	s, _ := h.waitFor("a Full snapshot", func(s *Snapshot) bool { return s.Full })
	if s.RelistReason != ReasonCompacted || s.Revision < crev {
		t.Fatalf("relist reason %q at revision %d (compacted at %d)", s.RelistReason, s.Revision, crev)
	}
	want := map[netip.Prefix]*Block{
		b: {CIDR: b, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-b2"}},
		c: {CIDR: c, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-c"}},
		d: {CIDR: d, Owner: calico.Owner{Kind: calico.OwnerHost, Node: "node-d"}},
	}
	checkBlocks(t, s, want)
	if !slices.Equal(s.ChangedBlocks, []netip.Prefix{a, b, d}) || !slices.Equal(s.ChangedPeers, []string{"node-d"}) {
		t.Errorf("relist changes: blocks %v peers %v, want [%s %s %s] [node-d]", s.ChangedBlocks, s.ChangedPeers, a, b, d)
	}
	waitSynced(t, h.w)
	if st := h.w.Status(); st.Relists != 1 {
		t.Errorf("status %+v", st)
	}
	if n := h.counter("vpp_route_agent_etcd_relists_total", "reason", ReasonCompacted); n != 1 {
		t.Errorf("relists_total{compacted} = %v", n)
	}
	// And the new watch works.
	putBlock(t, cli, calicotest.Block(e, "node-e", 5))
	if s, _ = h.waitFor("block e", func(s *Snapshot) bool { return s.Blocks.Get(e) != nil }); s.Full || s.Blocks.Len() != 4 {
		t.Errorf("after relist: %+v", s)
	}
}

func waitSynced(t testing.TB, w *Watcher) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for !w.Status().Synced {
		if time.Now().After(deadline) {
			t.Fatalf("not synced: %+v", w.Status())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestEtcdRestart stops and restarts etcd: no snapshot ever lacks the block that stays, and changes
// another client makes after the restart show up.
func TestEtcdRestart(t *testing.T) {
	srv, cli := startEtcd(t)
	stay, later := mustPrefix("10.2.0.0/26"), mustPrefix("10.2.0.64/26")
	putBlock(t, cli, calicotest.Block(stay, "node-a", 1))
	h := newHarness(t, cli, nil)
	h.run()
	if s := h.next(); s.Blocks.Get(stay) == nil {
		t.Fatal("initial snapshot lacks the block")
	}
	stopStart := time.Now()
	srv.Stop()
	t.Logf("etcd stopped in %s", time.Since(stopStart).Round(time.Millisecond))
	deadline := time.Now().Add(waitLimit)
	for h.w.Status().Synced && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if st := h.w.Status(); st.Synced {
		t.Errorf("still synced with etcd stopped: %+v", st)
	}
	start := time.Now()
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("etcd restarted in %s", time.Since(start).Round(time.Millisecond))
	other := fastClient(t, srv.Endpoint())
	putBlock(t, other, calicotest.Block(later, "node-b", 2))
	t.Logf("written after the restart at +%s", time.Since(start).Round(time.Millisecond))
	_, seen := h.waitFor("the block written after the restart", func(s *Snapshot) bool { return s.Blocks.Get(later) != nil })
	for _, s := range seen {
		if s.Blocks.Get(stay) == nil {
			t.Errorf("snapshot at revision %d (full %v %q) lacks %s", s.Revision, s.Full, s.RelistReason, stay)
		}
	}
	waitSynced(t, h.w)
}

// TestCoalescing: a consumer that does not read gets one snapshot with every change since the last
// one it took.
func TestCoalescing(t *testing.T) {
	_, cli := startEtcd(t)
	h := newHarness(t, cli, nil)
	h.run()
	x, y, z := mustPrefix("10.3.0.0/26"), mustPrefix("10.3.0.64/26"), mustPrefix("10.3.0.128/26")
	putBlock(t, cli, calicotest.Block(x, "node-a", 1))
	waitRevision(t, h.w, putBlock(t, cli, calicotest.Block(y, "node-a", 2)))
	// The initial Full snapshot was never taken: everything folds into it, and everything is new.
	s := h.next()
	if !s.Full || s.RelistReason != ReasonInitial || s.Blocks.Len() != 2 || s.ChangedBlocks != nil {
		t.Fatalf("coalesced initial: full %v %q blocks %d changed %v", s.Full, s.RelistReason, s.Blocks.Len(), s.ChangedBlocks)
	}
	first := s.ReceivedAt
	before := time.Now()
	putBlock(t, cli, calicotest.Block(z, "node-b", 3))
	del(t, cli, calico.BlockKey(x))
	waitRevision(t, h.w, put(t, cli, PeerKey(DefaultHostsPrefix, "node-b", netaddr.V4), "192.0.2.2"))
	s = h.next()
	if s.Full || s.Blocks.Len() != 2 || !slices.Equal(s.ChangedBlocks, []netip.Prefix{x, z}) || !slices.Equal(s.ChangedPeers, []string{"node-b"}) {
		t.Fatalf("coalesced incremental: full %v blocks %d changed %v %v", s.Full, s.Blocks.Len(), s.ChangedBlocks, s.ChangedPeers)
	}
	if s.ReceivedAt.Before(before) || !s.ReceivedAt.After(first) {
		t.Errorf("ReceivedAt %v not within the writes (after %v)", s.ReceivedAt, before)
	}
	// An incremental folded into a requested Full keeps Full.
	putBlock(t, cli, calicotest.Block(x, "node-c", 4))
	h.w.Relist()
	waitRelists(t, h.w, 1)
	s = h.next()
	if !s.Full || s.RelistReason != ReasonRequested || s.Blocks.Get(x) == nil {
		t.Fatalf("incremental + relist: full %v %q blocks %v", s.Full, s.RelistReason, s.Blocks)
	}
	h.settled(s.Revision)
}

func waitRevision(t testing.TB, w *Watcher, rev int64) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for w.Status().Revision < rev {
		if time.Now().After(deadline) {
			t.Fatalf("revision %d not reached: %+v", rev, w.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func waitRelists(t testing.TB, w *Watcher, n uint64) {
	t.Helper()
	deadline := time.Now().Add(waitLimit)
	for w.Status().Relists < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d relists not reached: %+v", n, w.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestRelist: Relist emits a Full snapshot with reason "requested" and nothing changed.
func TestRelist(t *testing.T) {
	_, cli := startEtcd(t)
	if _, err := calicotest.PutBlocks(testCtx(t), cli, 10, func(int) string { return "n" }); err != nil {
		t.Fatal(err)
	}
	// The production probe interval: the test counts relists exactly, and needs no probe.
	h := newHarness(t, cli, func(c *Config) { c.ProbeInterval = DefaultProbeInterval })
	h.run()
	first := h.next()
	h.w.Relist()
	s := h.next()
	if !s.Full || s.RelistReason != ReasonRequested || len(s.ChangedBlocks) != 0 || s.Revision != first.Revision ||
		!maps.EqualFunc(s.Blocks.Map(), first.Blocks.Map(), (*Block).Equal) {
		t.Fatalf("relist: %+v", s)
	}
	if st := h.w.Status(); st.Relists != 1 || !st.Synced {
		t.Errorf("status %+v", st)
	}
	if n := h.counter("vpp_route_agent_etcd_relists_total", "reason", ReasonRequested); n != 1 {
		t.Errorf("relists_total{requested} = %v", n)
	}
}

// TestRunStopsEverything: Run leaves no goroutine behind, and a second concurrent Run is refused.
func TestRunStopsEverything(t *testing.T) {
	_, cli := startEtcd(t)
	// Let the client and server settle before counting.
	if _, err := cli.Get(testCtx(t), "x"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	before := runtime.NumGoroutine()
	for i := range 3 {
		h := newHarness(t, cli, func(c *Config) { c.Registerer = nil })
		stop := h.run()
		h.next()
		if err := h.w.Run(testCtx(t)); err != ErrRunning {
			t.Errorf("second Run: %v", err)
		}
		putBlock(t, cli, calicotest.Block(mustPrefix("10.4.0.0/26"), fmt.Sprintf("node-%d", i), 1))
		h.next()
		h.w.Relist()
		h.next()
		stop()
	}
	deadline := time.Now().Add(10 * time.Second)
	for runtime.NumGoroutine() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines before, %d after:\n%s", before, runtime.NumGoroutine(), buf[:runtime.Stack(buf, true)])
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestTenThousandBlocks lists 10,000 blocks and logs how long it took.
func TestTenThousandBlocks(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	_, cli := startEtcd(t)
	ctx := testCtx(t)
	start := time.Now()
	if _, err := calicotest.PutBlocks(ctx, cli, 10000, func(i int) string { return fmt.Sprintf("node-%d", i%500) }); err != nil {
		t.Fatal(err)
	}
	t.Logf("put 10000 blocks in %s", time.Since(start).Round(time.Millisecond))
	h := newHarness(t, cli, nil)
	start = time.Now()
	stop := h.run()
	s := h.next()
	took := time.Since(start)
	if s.Blocks.Len() != 10000 {
		t.Fatalf("%d blocks", s.Blocks.Len())
	}
	// The view's heap: live heap with it minus live heap without it (the in-process etcd cancels out).
	stop()
	var ms runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&ms)
	with := ms.HeapAlloc
	h.w.view, s = nil, nil
	runtime.GC()
	runtime.ReadMemStats(&ms)
	t.Logf("listed 10000 blocks in %s (race detector: %v); the view holds %.1f MB of heap", took.Round(time.Millisecond),
		raceEnabled, float64(int64(with)-int64(ms.HeapAlloc))/(1<<20))
}

// TestIdleWatchStaysInSync: with nothing written after the list, the watch still answers its progress
// requests (etcd drops them for a watch that starts at a future revision), so an idle etcd causes
// neither a relist nor a loss of sync.
func TestIdleWatchStaysInSync(t *testing.T) {
	_, cli := startEtcd(t)
	putBlock(t, cli, calicotest.Block(mustPrefix("10.3.0.0/26"), "node-a", 1))
	// The production probe interval (1s): a probe may take up to 2s on a loaded machine without counting
	// as a stall, and a watch that stopped answering would still relist within 3¼s, inside the 5s watched.
	h := newHarness(t, cli, func(c *Config) { c.ProbeInterval = DefaultProbeInterval })
	h.run()
	h.next()
	waitSynced(t, h.w)
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if st := h.w.Status(); !st.Synced || st.Relists != 0 {
			t.Fatalf("idle etcd: status %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if n := h.counter("vpp_route_agent_etcd_relists_total", "reason", ReasonWatchError); n != 0 {
		t.Errorf("relists_total{watch-error} = %v", n)
	}
}

// TestPeerLeases: a snapshot tells a registration on a lease (as agents write them) from a key
// without one (written by hand or left over), in the list and in watch events.
func TestPeerLeases(t *testing.T) {
	_, cli := startEtcd(t)
	ctx := testCtx(t)
	lease, err := cli.Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cli.Put(ctx, PeerKey(DefaultHostsPrefix, "live", netaddr.V4), "192.0.2.7", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	put(t, cli, PeerKey(DefaultHostsPrefix, "leftover", netaddr.V4), "192.0.2.7")
	h := newHarness(t, cli, nil)
	h.run()
	s := h.next()
	if p := s.Peers["live"]; !p.IPv4Leased || p.IPv6Leased {
		t.Errorf("listed lease-backed peer: %+v", p)
	}
	if p := s.Peers["leftover"]; p.IPv4Leased || p.IPv4 != mustAddr("192.0.2.7") {
		t.Errorf("listed peer without a lease: %+v", p)
	}
	if _, err := cli.Put(ctx, PeerKey(DefaultHostsPrefix, "live", netaddr.V6), "2001:db8::7", clientv3.WithLease(lease.ID)); err != nil {
		t.Fatal(err)
	}
	if s = h.next(); !s.Peers["live"].IPv6Leased || !s.Peers["live"].IPv4Leased {
		t.Errorf("watched lease-backed peer: %+v", s.Peers["live"])
	}
}

// TestLegacyHostAffinityLoggedOncePerBlock: with LegacyHostAffinity on, a block owned through its
// hostAffinity field is logged once, when the watcher first sees it owned so: not again when its value
// is rewritten with the same owner, nor on a relist; another such block gets its own line.
func TestLegacyHostAffinityLoggedOncePerBlock(t *testing.T) {
	_, cli := startEtcd(t)
	legacy := loadTestdata(t)["legacy-hostaffinity"]
	put(t, cli, legacy.Key, string(legacy.Value))
	logs := &logging.Buffer{}
	h := newHarness(t, cli, func(c *Config) {
		c.LegacyHostAffinity = true
		c.Logger = slog.New(slog.NewTextHandler(logs, nil))
	})
	h.run()
	if s := h.next(); s.Blocks.Len() != 1 {
		t.Fatalf("first snapshot has %d blocks, want the legacy one", s.Blocks.Len())
	}
	first := mustPrefix("192.168.45.0/26")

	// The same owner again: a rewrite, then a relist.
	rev := put(t, cli, legacy.Key, string(legacy.Value))
	for deadline := time.Now().Add(waitLimit); h.w.Status().Revision < rev; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the rewrite at revision %d not seen within %s", rev, waitLimit)
		}
	}
	h.w.Relist()
	h.waitFor("the relist", func(s *Snapshot) bool { return s.RelistReason == ReasonRequested })

	// Another legacy block.
	second := mustPrefix("192.168.46.0/26")
	v := strings.Replace(string(legacy.Value), first.String(), second.String(), 1)
	rev = put(t, cli, calico.BlockKey(second), v)
	h.waitFor("the second block", func(s *Snapshot) bool { return s.Revision >= rev && s.Blocks.Len() == 2 })

	const msg = "block owned through its legacy hostAffinity field"
	for _, b := range []netip.Prefix{first, second} {
		n := 0
		for _, l := range strings.Split(logs.String(), "\n") {
			if strings.Contains(l, msg) && strings.Contains(l, "block="+b.String()+" ") && strings.Contains(l, "node=node-old") {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%q logged %d times for %s, want once:\n%s", msg, n, b, logs.String())
		}
	}
}

// TestPeerIndexes: a node's peer keys /1, /2, ... are read in index order (one per uplink); an older
// agent's /1 alone reads as before; a gap is flagged and what is there is used; deleting /2 leaves /1.
func TestPeerIndexes(t *testing.T) {
	_, cli := startEtcd(t)
	key := func(node string, fam netaddr.Family, i int) string {
		return PeerKeyAt(DefaultHostsPrefix, node, fam, i)
	}
	put(t, cli, key("two", netaddr.V4, 1), "192.0.2.7")
	put(t, cli, key("two", netaddr.V4, 2), "198.51.100.7")
	put(t, cli, key("two", netaddr.V6, 1), "2001:db8::7")
	put(t, cli, key("old", netaddr.V4, 1), "192.0.2.8")
	put(t, cli, key("gap", netaddr.V4, 1), "192.0.2.9")
	put(t, cli, key("gap", netaddr.V4, 3), "198.51.100.9")
	h := newHarness(t, cli, nil)
	h.run()
	s := h.next()
	if got := s.Peers["two"].IPv4s(); !slices.Equal(got, []netip.Addr{mustAddr("192.0.2.7"), mustAddr("198.51.100.7")}) || s.Peers["two"].Gap {
		t.Errorf("two uplinks: IPv4s %v, gap %v", got, s.Peers["two"].Gap)
	}
	if got := s.Peers["two"].IPv6s(); !slices.Equal(got, []netip.Addr{mustAddr("2001:db8::7")}) {
		t.Errorf("two uplinks: IPv6s %v", got)
	}
	if p := s.Peers["old"]; p.IPv4 != mustAddr("192.0.2.8") || p.MoreIPv4.Len() != 0 || p.Gap {
		t.Errorf("an older agent's /1 only: %+v", p)
	}
	if p := s.Peers["gap"]; !p.Gap || !slices.Equal(p.IPv4s(), []netip.Addr{mustAddr("192.0.2.9"), mustAddr("198.51.100.9")}) {
		t.Errorf("/1 and /3: %+v, IPv4s %v", p, p.IPv4s())
	}
	if _, err := cli.Delete(testCtx(t), key("two", netaddr.V4, 2)); err != nil {
		t.Fatal(err)
	}
	s, _ = h.waitFor("/2 deleted", func(s *Snapshot) bool { return s.Peers["two"].MoreIPv4.Len() == 0 })
	if p := s.Peers["two"]; p.IPv4 != mustAddr("192.0.2.7") || p.Gap {
		t.Errorf("after /2 went: %+v", p)
	}
}
