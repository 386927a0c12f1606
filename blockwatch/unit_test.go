package blockwatch

import (
	"log/slog"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string // substring of the error; "" for valid
	}{
		{"defaults", Config{}, ""},
		{"ipv4 only", Config{BlockPrefix: calico.BlockPrefix + "ipv4/"}, ""},
		{"relocated", Config{BlockPrefix: "/test1/assignment/", HostsPrefix: "/test1/hosts/", PoolPrefix: "/test1/pools/"}, ""},
		{"no trailing slash", Config{HostsPrefix: "/vpp-calico/hosts"}, `HostsPrefix "/vpp-calico/hosts" must start and end with "/"`},
		{"relative", Config{PoolPrefix: "pools/"}, "must start and end"},
		{"overlap", Config{HostsPrefix: "/calico/"}, "overlap"},
		{"whole ipam", Config{BlockPrefix: calico.IPAMPrefix}, "holds more than Calico's blocks"},
		{"inside a block key", Config{BlockPrefix: calico.BlockPrefix + "ipv4/block/10.0.0.0-26/"}, "not a family prefix"},
		{"page size", Config{PageSize: -1}, "PageSize -1"},
		{"timeout", Config{RequestTimeout: -time.Second}, "RequestTimeout"},
		{"probe", Config{ProbeInterval: -time.Second}, "ProbeInterval"},
	}
	for _, tc := range tests {
		err := tc.cfg.Validate()
		if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%s: Validate() = %v, want %q", tc.name, err, tc.want)
		}
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New accepted a config without Client")
	}
}

func TestPeerKeyFormats(t *testing.T) {
	for _, a := range []string{"192.0.2.1", "2001:db8::1"} {
		addr := mustAddr(a)
		fam := netaddr.V4
		if addr.Is6() {
			fam = netaddr.V6
		}
		if got, want := calicotest.PeerKey(DefaultHostsPrefix, "n1", addr), PeerKey(DefaultHostsPrefix, "n1", fam); got != want {
			t.Errorf("calicotest.PeerKey = %q, PeerKey = %q", got, want)
		}
	}
	if got := PeerKey(DefaultHostsPrefix, "node-1", netaddr.V6); got != "/vpp-calico/hosts/node-1/peerip/ipv6/1" {
		t.Errorf("PeerKey = %q", got)
	}
}

func TestDecodePeers(t *testing.T) {
	d := newDecoder(Config{}.withDefaults())
	tests := []struct {
		key, value string
		want       netip.Addr
		wantErr    string
	}{
		{DefaultHostsPrefix + "n1/peerip/ipv4/1", "192.0.2.1", mustAddr("192.0.2.1"), ""},
		{DefaultHostsPrefix + "n1/peerip/ipv4/1", "192.0.2.1\n", mustAddr("192.0.2.1"), ""},
		{DefaultHostsPrefix + "n1/peerip/ipv4/1", "::ffff:192.0.2.1", mustAddr("192.0.2.1"), ""},
		{DefaultHostsPrefix + "n1/peerip/ipv6/1", "2001:db8::1", mustAddr("2001:db8::1"), ""},
		{DefaultHostsPrefix + "n1/peerip/ipv4/1", "2001:db8::1", netip.Addr{}, "family"},
		{DefaultHostsPrefix + "n1/peerip/ipv6/1", "192.0.2.1", netip.Addr{}, "family"},
		{DefaultHostsPrefix + "n1/peerip/ipv6/1", "::ffff:192.0.2.1", netip.Addr{}, "family"},
		{DefaultHostsPrefix + "n1/peerip/ipv6/1", "fe80::1%eth0", netip.Addr{}, "zones"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/1", "0.0.0.0", mustAddr("0.0.0.0"), ""}, // judged by the agent
		{DefaultHostsPrefix + "n1/peerip/ipv4/1", "192.0.2.300", netip.Addr{}, "peer address"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/2", "192.0.2.1", mustAddr("192.0.2.1"), ""}, // a second uplink's
		{DefaultHostsPrefix + "n1/peerip/ipv6/16", "2001:db8::1", mustAddr("2001:db8::1"), ""},
		{DefaultHostsPrefix + "n1/peerip/ipv4/17", "192.0.2.1", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/0", "192.0.2.1", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/02", "192.0.2.1", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/x", "192.0.2.1", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1/peerip/ipv5/1", "192.0.2.1", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1/lease", "x", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/1/bfd", "192.0.2.1", netip.MustParseAddr("192.0.2.1"), ""},
		{DefaultHostsPrefix + "n1/peerip/ipv6/2/bfd", "192.0.2.1", netip.Addr{}, "family"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/1/echo", "192.0.2.1", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1/peerip/ipv4/1/bfd/x", "192.0.2.1", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "n1", "x", netip.Addr{}, "want"},
		{DefaultHostsPrefix + "/peerip/ipv4/1", "192.0.2.1", netip.Addr{}, "bad node name"},
		{"/elsewhere/n1/peerip/ipv4/1", "192.0.2.1", netip.Addr{}, "not under"},
	}
	for _, tc := range tests {
		id, err := d.peerKey(tc.key)
		var a netip.Addr
		if err == nil {
			a, err = peerAddr(id, []byte(tc.value))
		}
		if tc.wantErr == "" && (err != nil || a != tc.want || id.node != "n1") || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("%s = %q: got %v %v %v, want %v %q", tc.key, tc.value, id, a, err, tc.want, tc.wantErr)
		}
	}
}

func TestDecodeBlockKeys(t *testing.T) {
	def := newDecoder(Config{}.withDefaults())
	reloc := newDecoder(Config{BlockPrefix: "/t/assignment/"}.withDefaults())
	v4only := newDecoder(Config{BlockPrefix: calico.BlockPrefix + "ipv4/"}.withDefaults())
	tests := []struct {
		d       decoder
		key     string
		want    string
		wantErr string
	}{
		{def, calico.BlockPrefix + "ipv4/block/10.244.1.64-26", "10.244.1.64/26", ""},
		{def, calico.BlockPrefix + "ipv6/block/fd00:10:244::c0-122", "fd00:10:244::c0/122", ""},
		{def, calico.BlockPrefix + "ipv4/block/10.244.1.65-26", "", "not canonical"},
		{def, calico.BlockPrefix + "ipv6/block/10.244.1.64-26", "", "ipv4 prefix under ipv6"},
		{def, calico.BlockPrefix + "ipv4/blocks", "", "expected"},
		{reloc, "/t/assignment/ipv4/block/10.0.0.0-26", "10.0.0.0/26", ""},
		{reloc, "/t/assignment/ipv4/block/10.0.0.0-26/x", "", "block key"},
		{v4only, calico.BlockPrefix + "ipv4/block/10.0.0.0-26", "10.0.0.0/26", ""},
	}
	for _, tc := range tests {
		got, err := tc.d.blockCIDR(tc.key)
		if tc.wantErr == "" && (err != nil || got != mustPrefix(tc.want)) || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
			t.Errorf("blockCIDR(%q) = %v, %v; want %s %q", tc.key, got, err, tc.want, tc.wantErr)
		}
	}
}

func TestDecodePools(t *testing.T) {
	d := newDecoder(Config{}.withDefaults())
	if _, err := d.poolName(calico.IPPoolPrefix + "a/b"); err == nil {
		t.Error("pool name with a slash accepted")
	}
	name, err := d.poolName(calico.IPPoolKey("p1"))
	if err != nil || name != "p1" {
		t.Fatalf("poolName = %q, %v", name, err)
	}
	p, err := pool("p1", []byte(`{"spec":{"cidr":"10.0.0.0/16"}}`))
	if err != nil || p.Name != "p1" || p.BlockSize != 26 {
		t.Errorf("pool without metadata.name: %+v, %v", p, err)
	}
	if _, err := pool("p1", []byte(`{"metadata":{"name":"p2"},"spec":{"cidr":"10.0.0.0/16"}}`)); err == nil {
		t.Error("pool whose name differs from its key accepted")
	}
}

// newUnitWatcher is a Watcher for the pure parts (no Run): a client that is never used.
func newUnitWatcher(t *testing.T) *Watcher {
	t.Helper()
	w, err := New(Config{Client: &clientv3.Client{}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// TestInstallRevisions: an event no newer than the key's applied revision is ignored; a malformed
// value keeps the last good one; deleted:true and a delete remove the key.
func TestInstallRevisions(t *testing.T) {
	w := newUnitWatcher(t)
	c := newCache()
	cidr := mustPrefix("10.0.0.0/26")
	key := calico.BlockKey(cidr)
	enc := func(node string) []byte {
		v, err := calico.EncodeBlock(calicotest.Block(cidr, node, 1))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	var created int64 // the key's create revision, as etcd reports it
	step := func(rev int64, value []byte, del bool) *changes {
		ch := &changes{}
		if created == 0 && !del {
			created = rev
		}
		kv := &mvccpb.KeyValue{Key: []byte(key), Value: value, ModRevision: rev, CreateRevision: created}
		if del {
			kv.CreateRevision, created = 0, 0
		}
		d := w.decode(srcBlocks, kv, del)
		w.install(c, c, &d, ch)
		return ch
	}
	owner := func() string {
		if b, _ := c.blocks.get(cidr); b != nil {
			return b.Owner.Node
		}
		return ""
	}
	if ch := step(10, enc("a"), false); owner() != "a" || len(ch.blocks) != 1 {
		t.Fatalf("create: owner %q, changes %v", owner(), ch.blocks)
	}
	if ch := step(9, enc("b"), false); owner() != "a" || !ch.empty() {
		t.Fatalf("stale put applied: owner %q", owner())
	}
	if ch := step(10, nil, true); owner() != "a" || !ch.empty() {
		t.Fatalf("stale delete applied")
	}
	created = 10 // the stale delete is not etcd's history
	if ch := step(11, []byte("{"), false); owner() != "a" || len(ch.blocks) != 1 || c.blockRevs[cidr] != 11 || !c.held[cidr].LastGood {
		t.Fatalf("malformed value: owner %q, rev %d, held %+v", owner(), c.blockRevs[cidr], c.held)
	}
	if ch := step(11, enc("c"), false); owner() != "a" || !ch.empty() {
		t.Fatalf("put at the malformed value's revision applied")
	}
	if ch := step(12, enc("b"), false); owner() != "b" || len(ch.blocks) != 1 || len(c.held) != 0 {
		t.Fatalf("update: owner %q, held %v", owner(), c.held)
	}
	b := calicotest.Block(cidr, "b", 1)
	b.Deleted = true
	v, _ := calico.EncodeBlock(b)
	if ch := step(13, v, false); owner() != "" || len(ch.blocks) != 1 {
		t.Fatalf("deleted:true: owner %q", owner())
	}
	// Gone keys have no revision: a later create applies.
	if step(14, enc("d"), false); owner() != "d" {
		t.Fatalf("recreate: owner %q", owner())
	}
	if ch := step(15, nil, true); c.blocks.n != 0 || len(c.blockRevs) != 0 || len(ch.blocks) != 1 {
		t.Fatalf("delete left %v %v", c.blocks.freeze(), c.blockRevs)
	}
	// A malformed value for a key never seen good stays absent from Blocks, and is held.
	if ch := step(16, []byte("{"), false); c.blocks.n != 0 || len(ch.blocks) != 1 || c.held[cidr].LastGood || c.held[cidr].Revision != 16 {
		t.Fatalf("malformed new key: blocks %v held %v", c.blocks.freeze(), c.held)
	}
	if ch := step(17, nil, true); len(c.held) != 0 || len(ch.blocks) != 1 {
		t.Fatalf("delete of a held key: held %v", c.held)
	}
}

// TestRelistKeepsOnlySameIncarnation: at a relist, a malformed value keeps the previous view's good
// value only if the key has not been deleted and re-created since.
func TestRelistKeepsOnlySameIncarnation(t *testing.T) {
	w := newUnitWatcher(t)
	cidr := mustPrefix("10.0.0.0/26")
	v, _ := calico.EncodeBlock(calicotest.Block(cidr, "a", 1))
	prev := newCache()
	d := w.decode(srcBlocks, &mvccpb.KeyValue{Key: []byte(calico.BlockKey(cidr)), Value: v, ModRevision: 10, CreateRevision: 5}, false)
	w.install(prev, prev, &d, nil)
	for _, tc := range []struct {
		created int64
		kept    bool
	}{{5, true}, {10, true}, {11, false}} {
		next := newCache()
		d := w.decode(srcBlocks, &mvccpb.KeyValue{Key: []byte(calico.BlockKey(cidr)), Value: []byte("{"), ModRevision: 20, CreateRevision: tc.created}, false)
		w.install(next, prev, &d, nil)
		if _, ok := next.blocks.get(cidr); ok != tc.kept {
			t.Errorf("malformed value created at %d over a good value of revision 10: kept %v, want %v", tc.created, ok, tc.kept)
		}
	}
}

// TestCopyOnWrite: a snapshot's maps never change after it is handed out.
func TestCopyOnWrite(t *testing.T) {
	w := newUnitWatcher(t)
	c := newCache()
	put := func(cidr netip.Prefix, node string, rev int64) {
		v, _ := calico.EncodeBlock(calicotest.Block(cidr, node, 1))
		d := w.decode(srcBlocks, &mvccpb.KeyValue{Key: []byte(calico.BlockKey(cidr)), Value: v, ModRevision: rev, CreateRevision: rev}, false)
		w.install(c, c, &d, &changes{})
	}
	x, y := mustPrefix("10.0.0.0/26"), mustPrefix("10.0.0.64/26")
	put(x, "a", 1)
	s1 := c.snapshot(&changes{}, false, "")
	put(y, "a", 2)
	put(x, "b", 3)
	s2 := c.snapshot(&changes{}, false, "")
	if s1.Blocks.Len() != 1 || s1.Blocks.Get(x).Owner.Node != "a" || s2.Blocks.Len() != 2 || s2.Blocks.Get(x).Owner.Node != "b" {
		t.Fatalf("s1 %v s2 %v", s1.Blocks, s2.Blocks)
	}
	// An unchanged map is shared, not copied.
	s3 := c.snapshot(&changes{}, false, "")
	s3.Peers["probe"] = Peer{}
	if _, ok := s2.Peers["probe"]; !ok {
		t.Error("unchanged peers map was copied")
	}
}

func TestCoalesce(t *testing.T) {
	p := func(s ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, x := range s {
			out = append(out, mustPrefix(x))
		}
		return out
	}
	t0 := time.Now()
	old := &Snapshot{Revision: 5, Full: true, RelistReason: ReasonCompacted, ChangedBlocks: p("10.0.0.0/26", "10.0.1.0/26"),
		ChangedPeers: []string{"a", "c"}, ReceivedAt: t0}
	s := &Snapshot{Revision: 7, ChangedBlocks: p("10.0.0.64/26", "10.0.1.0/26"), ChangedPeers: []string{"b"}, PoolsChanged: true,
		ReceivedAt: t0.Add(time.Second)}
	got := coalesce(old, s)
	if got.Revision != 7 || !got.Full || got.RelistReason != ReasonCompacted || !got.PoolsChanged || !got.ReceivedAt.Equal(t0) ||
		!slices.Equal(got.ChangedBlocks, p("10.0.0.0/26", "10.0.0.64/26", "10.0.1.0/26")) ||
		!slices.Equal(got.ChangedPeers, []string{"a", "b", "c"}) {
		t.Errorf("coalesce = %+v", got)
	}
	// A newer Full keeps its own reason.
	got = coalesce(&Snapshot{Full: true, RelistReason: ReasonInitial}, &Snapshot{Full: true, RelistReason: ReasonRequested})
	if got.RelistReason != ReasonRequested {
		t.Errorf("reason %q", got.RelistReason)
	}
	// Folded into the first list's snapshot, whose every block and peer is new, a change set means
	// nothing: there is none.
	got = coalesce(&Snapshot{Full: true, RelistReason: ReasonInitial}, &Snapshot{ChangedBlocks: p("10.0.0.64/26"), ChangedPeers: []string{"b"}})
	if !got.Full || got.RelistReason != ReasonInitial || got.ChangedBlocks != nil || got.ChangedPeers != nil {
		t.Errorf("coalesced into the first list's = %+v", got)
	}
	got = coalesce(&Snapshot{}, &Snapshot{})
	if got.Full || got.ChangedBlocks != nil || got.ChangedPeers != nil {
		t.Errorf("empty coalesce = %+v", got)
	}
}

// TestBlocksCopyOnWrite: Blocks handed out stay as they were while the set changes (a change copies
// only the shard it touches), and count their blocks.
func TestBlocksCopyOnWrite(t *testing.T) {
	var s blockSet
	blk := func(i int, owner string) (netip.Prefix, *Block) {
		cidr := calicotest.BlockCIDR(i)
		return cidr, &Block{CIDR: cidr, Owner: calico.Owner{Kind: calico.OwnerHost, Node: owner}}
	}
	for i := range 1000 {
		s.set(blk(i, "a"))
	}
	before := s.freeze()
	c0, b0 := blk(0, "b")
	s.set(c0, b0)
	s.delete(calicotest.BlockCIDR(1))
	s.set(blk(1000, "c"))
	after := s.freeze()
	if before.Len() != 1000 || before.Get(c0).Owner.Node != "a" || before.Get(calicotest.BlockCIDR(1)) == nil ||
		before.Get(calicotest.BlockCIDR(1000)) != nil {
		t.Fatalf("a frozen set changed: len %d", before.Len())
	}
	if after.Len() != 1000 || after.Get(c0) != b0 || after.Get(calicotest.BlockCIDR(1)) != nil || after.Get(calicotest.BlockCIDR(1000)) == nil {
		t.Fatalf("after: len %d", after.Len())
	}
	shared := 0
	for i := range numShards {
		if before.shards[i] != nil && after.shards[i] != nil && reflect.ValueOf(before.shards[i]).Pointer() == reflect.ValueOf(after.shards[i]).Pointer() {
			shared++
		}
	}
	if shared < numShards-3 {
		t.Errorf("%d of %d shards shared after 3 changes", shared, numShards)
	}
	if n := len(after.Map()); n != after.Len() {
		t.Errorf("Map has %d blocks, Len %d", n, after.Len())
	}
	if got, ok := (Blocks{}).Lookup(c0); got != nil || ok || (Blocks{}).Len() != 0 {
		t.Error("the zero Blocks is not empty")
	}
}
