package blockwatch

import (
	"fmt"
	"maps"
	"net/netip"
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

func affinityValue(t testing.TB, state string) string {
	t.Helper()
	v, err := calico.EncodeAffinity(calico.AffinityValue{State: state})
	if err != nil {
		t.Fatal(err)
	}
	return string(v)
}

func putAffinity(t testing.TB, cli *clientv3.Client, node string, cidr netip.Prefix, state string) int64 {
	t.Helper()
	return put(t, cli, calico.HostAffinityKey(node, cidr), affinityValue(t, state))
}

func putIPAMConfig(t testing.TB, cli *clientv3.Client, strict bool) int64 {
	t.Helper()
	v, err := calico.EncodeIPAMConfig(calico.IPAMConfig{StrictAffinity: strict, AutoAllocateBlocks: true})
	if err != nil {
		t.Fatal(err)
	}
	return put(t, cli, calico.IPAMConfigKey, string(v))
}

// owners maps each block of s that a node owns to that node.
func owners(s *Snapshot) map[netip.Prefix]string {
	out := map[netip.Prefix]string{}
	for cidr, b := range s.Blocks.All() {
		if b.Owner.IsNode() {
			out[cidr] = b.Owner.Node
		}
	}
	return out
}

func TestParseOwnership(t *testing.T) {
	for in, want := range map[string]Ownership{"": OwnershipBlocks, "blocks": OwnershipBlocks,
		"affinities": OwnershipAffinities, "auto": OwnershipAuto} {
		if got, err := ParseOwnership(in); err != nil || got != want {
			t.Errorf("ParseOwnership(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if _, err := ParseOwnership("affinity"); err == nil {
		t.Error("ParseOwnership accepted affinity")
	}
	if err := (Config{Ownership: "affinity"}).Validate(); err == nil || !strings.Contains(err.Error(), "Ownership") {
		t.Errorf("Validate of a bad ownership: %v", err)
	}
	if err := (Config{Ownership: OwnershipAuto, HostsPrefix: "/calico/ipam/v2/host/agents/"}).Validate(); err == nil {
		t.Error("a hosts prefix inside the affinities accepted in auto ownership")
	}
}

// TestInstallAffinities: which affinity states own a block, duplicates, malformed values (held, the
// last good value kept), stale events and deletes, on the pure install path.
func TestInstallAffinities(t *testing.T) {
	w := newUnitWatcher(t)
	c := newCache()
	c.ownership = OwnershipAffinities
	cidr := mustPrefix("10.0.0.0/26")
	created := map[string]int64{}
	step := func(node string, rev int64, value string, del bool) *changes {
		t.Helper()
		ch := &changes{}
		if created[node] == 0 && !del {
			created[node] = rev
		}
		kv := &mvccpb.KeyValue{Key: []byte(calico.HostAffinityKey(node, cidr)), Value: []byte(value), ModRevision: rev, CreateRevision: created[node]}
		if del {
			kv.CreateRevision = 0
			delete(created, node)
		}
		d := w.decode(srcAffinities, kv, del)
		w.install(c, c, &d, ch)
		return ch
	}
	owner := func() string {
		if b, _ := c.blocks.get(cidr); b != nil {
			if b.Owner.Kind != calico.OwnerHost || len(b.Borrowed) != 0 || b.CIDR != cidr {
				t.Fatalf("block %+v", b)
			}
			return b.Owner.Node
		}
		return ""
	}
	if ch := step("a", 10, affinityValue(t, calico.AffinityPending), false); owner() != "" || !ch.empty() {
		t.Fatalf("pending affinity owns the block: %q", owner())
	}
	if ch := step("a", 11, affinityValue(t, calico.AffinityConfirmed), false); owner() != "a" || len(ch.blocks) != 1 {
		t.Fatalf("confirmed: owner %q changes %v", owner(), ch.blocks)
	}
	if ch := step("a", 11, affinityValue(t, calico.AffinityPending), false); owner() != "a" || !ch.empty() {
		t.Fatal("stale event applied")
	}
	if ch := step("a", 12, affinityValue(t, calico.AffinityPendingDeletion), false); owner() != "a" || !ch.empty() {
		t.Fatalf("pendingDeletion: owner %q", owner())
	}
	// A second node's confirmed affinity (Calico #6486): the earlier created one keeps the block.
	if step("b", 13, affinityValue(t, calico.AffinityConfirmed), false); owner() != "a" {
		t.Fatalf("duplicate: owner %q", owner())
	}
	// Malformed: held, the last good state kept; an unknown state is malformed too.
	for i, bad := range []string{"{", `{"state":"claimed"}`} {
		rev := int64(14 + i)
		if ch := step("a", rev, bad, false); owner() != "a" || len(ch.blocks) != 1 && i == 0 || !c.held[cidr].LastGood || c.held[cidr].Revision != rev {
			t.Fatalf("malformed %q: owner %q held %+v", bad, owner(), c.held)
		}
	}
	if ch := step("a", 16, "", true); owner() != "b" || len(c.held) != 0 || len(ch.blocks) != 1 {
		t.Fatalf("delete of a's affinity: owner %q held %v", owner(), c.held)
	}
	if step("b", 17, `{"state":"confirmed","deleted":true}`, false); owner() != "" {
		t.Fatalf("soft-deleted affinity owns: %q", owner())
	}
	// A malformed value of a key never seen good: held without a last good value, no owner.
	if step("c", 18, "[]", false); owner() != "" || c.held[cidr].LastGood || !strings.Contains(c.held[cidr].Reason, "node c") {
		t.Fatalf("malformed new key: owner %q held %+v", owner(), c.held)
	}
	if step("c", 19, affinityValue(t, ""), false); owner() != "c" || len(c.held) != 0 {
		t.Fatalf("state \"\" (older Calico) does not own: owner %q held %v", owner(), c.held)
	}
	step("b", 20, "", true)
	step("c", 21, "", true)
	if c.blocks.n != 0 || len(c.affinities) != 0 || len(c.held) != 0 {
		t.Fatalf("left after deletes: %v %v %v", c.blocks.freeze(), c.affinities, c.held)
	}
	// A foreign key under the prefix is malformed and changes nothing.
	d := w.decode(srcAffinities, &mvccpb.KeyValue{Key: []byte(calico.HostAffinityPrefix + "n1/ipv4/blocks/x"), ModRevision: 22}, false)
	if d.keyErr == nil {
		t.Fatal("foreign affinity key accepted")
	}
}

// blocksAndAffinities writes, as Calico does with strict affinity on, blocks owned round-robin by
// nodes with their confirmed affinities, one pending claim without its block and one block without
// an affinity nor addresses, and registers the nodes.
func blocksAndAffinities(t *testing.T, cli *clientv3.Client, n, nodes int) {
	t.Helper()
	ctx := testCtx(t)
	if err := calicotest.PutPool(ctx, cli, calico.IPPool{Name: "p", CIDR: mustPrefix("10.0.0.0/8"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	for i := range nodes {
		if err := calicotest.PutPeer(ctx, cli, DefaultHostsPrefix, fmt.Sprintf("n%d", i), netip.AddrFrom4([4]byte{192, 0, 2, byte(1 + i)})); err != nil {
			t.Fatal(err)
		}
	}
	for i := range n {
		node := fmt.Sprintf("n%d", i%nodes)
		putBlock(t, cli, calicotest.Block(calicotest.BlockCIDR(i), node, i))
		putAffinity(t, cli, node, calicotest.BlockCIDR(i), calico.AffinityConfirmed)
	}
	putAffinity(t, cli, "n0", calicotest.BlockCIDR(n), calico.AffinityPending)
	putBlock(t, cli, calicotest.Block(calicotest.BlockCIDR(n+1), "", n+1))
}

// TestAffinityOwnership: the same data read from the blocks and from the affinities gives the same
// owners; from the affinities, a pod ADD (a block write) reaches the Watcher not at all, a claim and
// a release do; with strict affinity off the snapshot and the status report the problem.
func TestAffinityOwnership(t *testing.T) {
	_, cli := startEtcd(t)
	putIPAMConfig(t, cli, true)
	blocksAndAffinities(t, cli, 20, 4)

	bh := newHarness(t, cli, nil)
	bh.run()
	fromBlocks := bh.next()
	ah := newHarness(t, cli, func(c *Config) { c.Ownership = OwnershipAffinities })
	ah.run()
	fromAff := ah.next()
	if fromBlocks.Ownership != OwnershipBlocks || fromAff.Ownership != OwnershipAffinities || fromAff.Problem != "" {
		t.Fatalf("ownership %q / %q, problem %q", fromBlocks.Ownership, fromAff.Ownership, fromAff.Problem)
	}
	if got, want := owners(fromAff), owners(fromBlocks); !maps.Equal(got, want) || len(got) != 20 {
		t.Fatalf("owners from the affinities %v\nfrom the blocks %v", got, want)
	}
	if v := ah.counter("vpp_route_agent_ownership_source", "source", "affinities"); v != 1 {
		t.Errorf("ownership gauge %v", v)
	}

	// A pod ADD: the block is rewritten, the affinity watcher hears nothing of it. A peer write
	// after it marks a revision both have applied.
	b := calicotest.Block(calicotest.BlockCIDR(3), "n3", 3)
	calicotest.Allocate(b, "k8s-pod-network.extra", calicotest.PodAttrs("n3", "default", "extra", time.Now()))
	putBlock(t, cli, b)
	mark := put(t, cli, PeerKey(DefaultHostsPrefix, "n1", netaddr.V4), "192.0.2.101")
	s := ah.next()
	if len(s.ChangedBlocks) != 0 || !slices.Equal(s.ChangedPeers, []string{"n1"}) || s.Revision != mark {
		t.Fatalf("after a pod ADD: rev %d (want %d) changed blocks %v peers %v", s.Revision, mark, s.ChangedBlocks, s.ChangedPeers)
	}
	if v := ah.counter("vpp_route_agent_etcd_events_total", "source", "blocks", "type", "put"); v != 0 {
		t.Errorf("affinity watcher received %v block events", v)
	}
	// The block watcher hears the block write. Its watch and the peers' are separate watches, so the
	// marking peer write may reach it first: wait for the count, then check it stays at one.
	bh.waitFor("the marking peer write", func(s *Snapshot) bool { return s.Revision >= mark })
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if bh.counter("vpp_route_agent_etcd_events_total", "source", "blocks", "type", "put") >= 1 {
			break
		}
	}
	if v := bh.counter("vpp_route_agent_etcd_events_total", "source", "blocks", "type", "put"); v != 1 {
		t.Errorf("block watcher received %v block events, want 1", v)
	}

	// A claim (pending, block, confirmed) and a release (pendingDeletion, block and affinity
	// deleted).
	cidr := calicotest.BlockCIDR(40)
	putAffinity(t, cli, "n2", cidr, calico.AffinityPending)
	putBlock(t, cli, calicotest.Block(cidr, "n2", 40))
	rev := putAffinity(t, cli, "n2", cidr, calico.AffinityConfirmed)
	s, _ = ah.waitFor("the claimed block", func(s *Snapshot) bool { return s.Blocks.Get(cidr) != nil })
	if s.Revision != rev || s.Blocks.Get(cidr).Owner.Node != "n2" {
		t.Fatalf("claim: rev %d (want %d), block %+v", s.Revision, rev, s.Blocks.Get(cidr))
	}
	putAffinity(t, cli, "n2", cidr, calico.AffinityPendingDeletion)
	del(t, cli, calico.BlockKey(cidr))
	rev = del(t, cli, calico.HostAffinityKey("n2", cidr))
	ah.waitFor("the released block gone", func(s *Snapshot) bool { return s.Blocks.Get(cidr) == nil && s.Revision == rev })

	// Strict affinity turned off: the affinities go on, with a problem reported; on again: none.
	rev = putIPAMConfig(t, cli, false)
	waitRevision(t, ah.w, rev)
	if st := ah.w.Status(); !strings.Contains(st.Problem, "strict affinity is off") || st.Ownership != OwnershipAffinities {
		t.Fatalf("status after strict affinity off: %+v", st)
	}
	if bh.w.Status().Problem != "" {
		t.Errorf("block watcher reports a problem: %q", bh.w.Status().Problem)
	}
	rev = putIPAMConfig(t, cli, true)
	waitRevision(t, ah.w, rev)
	if st := ah.w.Status(); st.Problem != "" {
		t.Fatalf("status after strict affinity on again: %+v", st)
	}
	// A malformed IPAM config: the problem is that it cannot be read.
	rev = put(t, cli, calico.IPAMConfigKey, "{")
	waitRevision(t, ah.w, rev)
	if st := ah.w.Status(); st.Problem != "" {
		t.Fatalf("a malformed config lost the last good value: %+v", st)
	}
	if v := ah.counter("vpp_route_agent_malformed_values_total"); v != 1 {
		t.Errorf("malformed values %v, want 1", v)
	}
	ah.w.Relist()
	s, _ = ah.waitFor("the relist", func(s *Snapshot) bool { return s.Full && s.RelistReason == ReasonRequested })
	if s.Problem != "" {
		t.Fatalf("a relist lost the last good config: problem %q", s.Problem)
	}
	s, err := List(testCtx(t), Config{Client: cli, Ownership: OwnershipAffinities, Logger: testLogger(t)})
	if err != nil || !strings.Contains(s.Problem, "cannot be read") || s.Blocks.Len() != 20 {
		t.Fatalf("a new watcher with a malformed config: problem %q, %d blocks, %v", s.Problem, s.Blocks.Len(), err)
	}
}

// TestAutoOwnership: auto follows the IPAM config's strict affinity, at start and while running,
// relisting from the other source; the borrowed addresses come back with the blocks.
func TestAutoOwnership(t *testing.T) {
	_, cli := startEtcd(t)
	putIPAMConfig(t, cli, true)
	blocksAndAffinities(t, cli, 6, 3)
	// A borrowed address (as if strict affinity had been off before): only the blocks show it.
	b := calicotest.Block(calicotest.BlockCIDR(2), "n2", 2)
	calicotest.Allocate(b, "k8s-pod-network.borrowed", calicotest.PodAttrs("n0", "default", "borrowed", time.Now()))
	putBlock(t, cli, b)

	h := newHarness(t, cli, func(c *Config) { c.Ownership = OwnershipAuto; c.CompactedRelistSpread = -1 })
	h.run()
	s := h.next()
	if s.Ownership != OwnershipAffinities || len(s.Blocks.Get(b.CIDR).Borrowed) != 0 || s.Blocks.Len() != 6 {
		t.Fatalf("start with strict affinity on: ownership %q blocks %v", s.Ownership, s.Blocks)
	}
	if v := h.counter("vpp_route_agent_etcd_events_total", "source", "blocks", "type", "put"); v != 0 {
		t.Fatalf("block events %v", v)
	}

	putIPAMConfig(t, cli, false)
	s, _ = h.waitFor("the relist from the blocks", func(s *Snapshot) bool { return s.Full })
	if s.RelistReason != ReasonOwnership || s.Ownership != OwnershipBlocks || s.Problem != "" {
		t.Fatalf("after strict affinity off: reason %q ownership %q problem %q", s.RelistReason, s.Ownership, s.Problem)
	}
	if br := s.Blocks.Get(b.CIDR).Borrowed; len(br) != 1 || br[0].Node != "n0" || !slices.Contains(s.ChangedBlocks, b.CIDR) {
		t.Fatalf("borrowed address after the switch: %+v, changed %v", br, s.ChangedBlocks)
	}
	if st := h.w.Status(); st.Ownership != OwnershipBlocks || st.Relists != 1 {
		t.Errorf("status %+v", st)
	}
	if v := h.counter("vpp_route_agent_etcd_relists_total", "reason", ReasonOwnership); v != 1 {
		t.Errorf("ownership relists %v", v)
	}

	rev := putIPAMConfig(t, cli, true)
	s, _ = h.waitFor("the relist from the affinities", func(s *Snapshot) bool { return s.Full })
	if s.RelistReason != ReasonOwnership || s.Ownership != OwnershipAffinities || s.Revision < rev || len(s.Blocks.Get(b.CIDR).Borrowed) != 0 {
		t.Fatalf("after strict affinity on: reason %q ownership %q rev %d", s.RelistReason, s.Ownership, s.Revision)
	}
	// Without the config key, Calico's default: strict affinity off.
	del(t, cli, calico.IPAMConfigKey)
	s, _ = h.waitFor("the relist after the delete", func(s *Snapshot) bool { return s.Full })
	if s.Ownership != OwnershipBlocks {
		t.Fatalf("config deleted: ownership %q", s.Ownership)
	}
}

// TestAutoOwnershipStartsFromBlocks: auto with strict affinity off (or no IPAM config) lists the
// blocks, and reads no affinity.
func TestAutoOwnershipStartsFromBlocks(t *testing.T) {
	_, cli := startEtcd(t)
	blocksAndAffinities(t, cli, 4, 2)
	s, err := List(testCtx(t), Config{Client: cli, Ownership: OwnershipAuto, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if s.Ownership != OwnershipBlocks || s.Blocks.Len() != 5 || s.Problem != "" {
		// 4 owned blocks and the block without affinity.
		t.Fatalf("ownership %q, %d blocks, problem %q", s.Ownership, s.Blocks.Len(), s.Problem)
	}
	putIPAMConfig(t, cli, true)
	s, err = List(testCtx(t), Config{Client: cli, Ownership: OwnershipAuto, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	if s.Ownership != OwnershipAffinities || s.Blocks.Len() != 4 {
		t.Fatalf("with strict affinity: ownership %q, %d blocks", s.Ownership, s.Blocks.Len())
	}
}
