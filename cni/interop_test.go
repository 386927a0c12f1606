package cni_test

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/libcni"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
)

// Tests of what block-ipam does with data Calico's own IPAM writes (issue 10). Each scenario is built
// from the form calico-ipam v3.31 leaves in etcd; test/calicointerop runs the real calico-ipam.

// putCalicoBlock stores a block from ../calico/testdata with the handles its allocations name and
// the confirmed affinity of its owner, as calico-ipam leaves them.
func (e *env) putCalicoBlock(file string) *calico.Block {
	e.t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "calico", "testdata", file))
	if err != nil {
		e.t.Fatal(err)
	}
	var f struct {
		Key   string          `json:"key"`
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(raw, &f); err != nil {
		e.t.Fatal(err)
	}
	b, err := calico.DecodeBlock(f.Value)
	if err != nil {
		e.t.Fatal(err)
	}
	e.put(f.Key, f.Value)
	handles := map[string]*calico.Handle{}
	for ord := range b.Allocations {
		if a := b.AttributeOf(ord); a != nil && a.Handle() != "" {
			if handles[a.Handle()] == nil {
				handles[a.Handle()] = calico.NewHandle()
			}
			handles[a.Handle()].Add(b.CIDR, 1)
		}
	}
	for id, h := range handles {
		data, _ := calico.EncodeHandle(h)
		e.put(calico.HandleKey(id), data)
	}
	if o := calico.OwnerOf(b, false); o.Kind == calico.OwnerHost {
		aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
		e.put(calico.HostAffinityKey(o.Node, b.CIDR), aff)
	}
	return b
}

// putNode stores node's Calico Node resource with the label rack.
func (e *env) putNode(node, rack string) {
	e.t.Helper()
	e.put(calico.NodeKey(node), []byte(`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"`+node+`","labels":{"rack":"`+rack+`"}},"spec":{}}`))
}

func (e *env) putAffinity(node, cidr, state string) {
	e.t.Helper()
	aff, _ := calico.EncodeAffinity(calico.AffinityValue{State: state})
	e.put(calico.HostAffinityKey(node, mustPrefix(cidr)), aff)
}

// TestCalicoDeletedPodBlock (defect 1): after calico-ipam's DEL a block keeps the sequence entry of the
// ordinal it freed. block-ipam must DEL its pods there, ADD into it, take the freed address with IP=
// and borrow from it, never refuse it as corrupt.
func TestCalicoDeletedPodBlock(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.50.0.0/16", 26)
	e.putCalicoBlock("ipam/calico-del-stale-seq.json") // node-y's 10.50.12.0/26: c0 at 0, c2 at 2, 1 freed by Calico
	nodeY := e.list(netOpts{name: "k8s-pod-network", ipam: e.ipam("node-y", nil)})

	// DEL of a pod calico-ipam allocated (no ifname attribute: it is eth0's).
	e.mustDel(nodeY, rt("c0", "eth0"))
	if a := e.block("10.50.12.0/26").AttributeOf(0); a != nil {
		t.Fatalf("ordinal 0 still held by %q after DEL", a.Handle())
	}
	// ADD assigns in that block (the head of its FIFO), without claiming another.
	if got := addrs(e.mustAdd(nodeY, rt("n1", "eth0")))[0]; got != mustPrefix("10.50.12.3/32") {
		t.Fatalf("ADD on node-y got %s, want 10.50.12.3 from its existing block", got)
	}
	// The ordinal calico-ipam freed, by request.
	if got := addrs(e.mustAdd(nodeY, rt("n2", "eth0", [2]string{"IP", "10.50.12.1"})))[0]; got != mustPrefix("10.50.12.1/32") {
		t.Fatalf("IP=10.50.12.1 got %s", got)
	}
	if n := len(e.snapshot().Blocks); n != 1 {
		t.Fatalf("%d blocks, want node-y's only", n)
	}
	// The steady-state path too: the next ADD and DELs decide on the daemon's watch-fed node state.
	e.mustAdd(nodeY, rt("n3", "eth0"))
	for _, c := range []string{"n1", "n2", "n3", "c2"} {
		e.mustDel(nodeY, rt(c, "eth0"))
	}
	if b := e.block("10.50.12.0/26"); b.Allocated() != 0 {
		t.Fatalf("%d addresses left in node-y's block", b.Allocated())
	}

	// Borrowing: a node whose pool has no other subnet borrows from such a block.
	e2 := newEnv(t)
	e2.putPool("p", "10.50.12.0/26", 26)
	e2.putCalicoBlock("ipam/calico-del-stale-seq.json")
	got := addrs(e2.mustAdd(e2.list(netOpts{ipam: e2.ipam("node-z", nil)}), rt("z1", "eth0")))[0]
	if !mustPrefix("10.50.12.0/26").Contains(got.Addr()) {
		t.Fatalf("node-z got %s, want an address borrowed from node-y's block", got)
	}
}

// TestIPReservations (defect 2): automatic assignment skips reserved addresses, claims pass over
// subnets wholly reserved (here by two ranges together), a specific-address request is not checked
// (as Calico's AssignIP), and a reservation created after the daemon read its node state is honoured.
func TestIPReservations(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.61.0.0/26", 26)
	e.put(calico.IPReservationKey("low"), []byte(`{"kind":"IPReservation","apiVersion":"projectcalico.org/v3","metadata":{"name":"low"},"spec":{"reservedCIDRs":["10.61.0.0/30","10.61.0.5"]}}`))
	l := e.list(netOpts{ipam: e.ipam("node1", nil)})
	var got []string
	for _, c := range []string{"a", "b", "c"} {
		got = append(got, addrs(e.mustAdd(l, rt(c, "eth0")))[0].Addr().String())
	}
	if strings.Join(got, ",") != "10.61.0.4,10.61.0.6,10.61.0.7" {
		t.Fatalf("addresses %v, want 10.61.0.4, .6, .7 (.0-.3 and .5 reserved)", got)
	}
	if a := addrs(e.mustAdd(l, rt("d", "eth0", [2]string{"IP", "10.61.0.1"})))[0]; a != mustPrefix("10.61.0.1/32") {
		t.Fatalf("IP= of a reserved address got %s", a)
	}
	// A reservation appearing after the daemon read its node state (its watch must deliver it).
	e.put(calico.IPReservationKey("late"), []byte(`{"kind":"IPReservation","apiVersion":"projectcalico.org/v3","metadata":{"name":"late"},"spec":{"reservedCIDRs":["10.61.0.8/29"]}}`))
	if a := addrs(e.mustAdd(l, rt("e", "eth0")))[0]; a != mustPrefix("10.61.0.16/32") {
		t.Fatalf("after a new reservation of .8/29 got %s, want 10.61.0.16", a)
	}

	// Claims: of the two /26 of the pool, the one node2 would start at is reserved by two /27s.
	e2 := newEnv(t)
	pool := calico.IPPool{Name: "q", CIDR: mustPrefix("10.62.0.0/25"), BlockSize: 26}
	e2.putPool(pool.Name, pool.CIDR.String(), 26)
	first, _ := calico.NextFreeBlock(pool, "node2", nil, nil)
	lo, hi := netip.PrefixFrom(first.Addr(), 27), netip.PrefixFrom(calico.LastAddr(netip.PrefixFrom(first.Addr(), 27)).Next(), 27)
	e2.put(calico.IPReservationKey("r"), []byte(`{"kind":"IPReservation","apiVersion":"projectcalico.org/v3","metadata":{"name":"r"},"spec":{"reservedCIDRs":["`+lo.String()+`","`+hi.String()+`"]}}`))
	a := addrs(e2.mustAdd(e2.list(netOpts{ipam: e2.ipam("node2", nil)}), rt("x", "eth0")))[0]
	if first.Contains(a.Addr()) || !pool.CIDR.Contains(a.Addr()) {
		t.Fatalf("node2 got %s: want the pool's other /26, not the wholly reserved %s", a, first)
	}
}

// TestEmptyOrphanBlockDeleted (defect 3): a block without affinity (what calicoctl delete node leaves
// of a block still holding pods) is deleted when block-ipam frees its last address, by DEL and by
// GC; a block with affinity is kept.
func TestEmptyOrphanBlockDeleted(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.63.0.0/16", 26)
	l := e.list(netOpts{ipam: e.ipam("node1", nil)})
	a1 := addrs(e.mustAdd(l, rt("c1", "eth0")))[0]
	e.mustAdd(l, rt("c2", "eth0"))
	cidr := netip.PrefixFrom(a1.Addr(), 26).Masked()

	// What Calico's node removal does to a block that still holds addresses: affinity null, the
	// affinity key gone.
	orphan := func() {
		b := e.block(cidr.String())
		b.Affinity = nil
		data, _ := calico.EncodeBlock(b)
		e.put(calico.BlockKey(cidr), data)
		if _, err := e.cli.Delete(t.Context(), calico.HostAffinityKey("node1", cidr)); err != nil {
			t.Fatal(err)
		}
	}
	orphan()
	e.mustDel(l, rt("c1", "eth0"))
	if b := e.block(cidr.String()); b.Allocated() != 1 {
		t.Fatalf("block after the first DEL holds %d", b.Allocated())
	}
	e.mustDel(l, rt("c2", "eth0"))
	if b := e.snapshot().Blocks[cidr]; b != nil {
		t.Fatalf("empty block without affinity kept: %+v", b)
	}
	// Its subnet is claimable again: node1's next ADD claims the same subnet.
	if got := addrs(e.mustAdd(l, rt("c3", "eth0")))[0]; !cidr.Contains(got.Addr()) {
		t.Fatalf("next claim got %s, want the freed subnet %s", got, cidr)
	}
	// A block with affinity stays when emptied.
	e.mustDel(l, rt("c3", "eth0"))
	if b := e.block(cidr.String()); b.Affinity == nil || *b.Affinity != "host:node1" {
		t.Fatalf("emptied affine block: %+v", b)
	}

	// GC releasing the last address of an orphaned block deletes it too.
	e.mustAdd(l, rt("c4", "eth0"))
	orphan()
	// A runtime without cached attachments, so that libcni issues no DEL of its own.
	if err := newRuntime(t.TempDir()).GCNetworkList(t.Context(), l, &libcni.GCArgs{}); err != nil {
		t.Fatal(err)
	}
	if b := e.snapshot().Blocks[cidr]; b != nil {
		t.Fatalf("GC left an empty block without affinity: %+v", b)
	}
}

// TestPendingAffinityAdopted (defect 4): a pending affinity Calico left without its block is adopted
// by the node's next ADD, even when the daemon's node state holds a block with room: exactly
// that block is created and the affinity confirmed. A pending affinity of a block that is the node's
// is confirmed; one whose block belongs to another node is deleted.
func TestPendingAffinityAdopted(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.64.0.0/16", 26)
	l := e.list(netOpts{ipam: e.ipam("node1", nil)})
	first := addrs(e.mustAdd(l, rt("c1", "eth0")))[0] // the node state now holds a block with room
	e.putAffinity("node1", "10.64.200.0/26", calico.AffinityPending)
	got := addrs(e.mustAdd(l, rt("c2", "eth0")))[0]
	if got != mustPrefix("10.64.200.0/32") {
		t.Fatalf("ADD got %s, want the first address of the pending claim's block 10.64.200.0/26 (first ADD: %s)", got, first)
	}
	b := e.block("10.64.200.0/26")
	if b.Affinity == nil || *b.Affinity != "host:node1" {
		t.Fatalf("adopted block affinity %v", b.Affinity)
	}
	// (checkInvariants at the end requires every affinity confirmed and matching its block.)

	// Pending affinity of node1's own block: confirmed by the ADD that uses it.
	e.putAffinity("node1", "10.64.200.0/26", calico.AffinityPending)
	e.mustAdd(l, rt("c3", "eth0"))
	// Pending affinity of node2's block: deleted.
	other := addrs(e.mustAdd(e.list(netOpts{ipam: e.ipam("node2", nil)}), rt("o1", "eth0")))[0]
	ocidr := netip.PrefixFrom(other.Addr(), 26).Masked()
	e.putAffinity("node1", ocidr.String(), calico.AffinityPending)
	if a := addrs(e.mustAdd(l, rt("c4", "eth0")))[0]; ocidr.Contains(a.Addr()) {
		t.Fatalf("node1 assigned %s from node2's block through a stale affinity", a)
	}
	for key := range e.snapshot().Affinities {
		if strings.Contains(key, "/host/node1/") && strings.HasSuffix(key, calico.EncodeCIDR(ocidr)) {
			t.Fatalf("stale affinity %s kept", key)
		}
	}
}

// TestPoolRulesOfCalico: allowedUses, nodeSelector against the Calico Node's labels, a node without
// Node resource, an unparseable selector, and maxBlocksPerHost without borrowing.
func TestPoolRulesOfCalico(t *testing.T) {
	e := newEnv(t)
	e.putPool("a-rack-a", "10.65.0.0/24", 26, func(p *calico.IPPool) { p.NodeSelector = "rack == 'a' && !has(drain)" })
	e.putPool("b-rack-b", "10.66.0.0/24", 26, func(p *calico.IPPool) { p.NodeSelector = "rack in {'b', 'c'}" })
	e.putPool("c-tunnel", "10.67.0.0/24", 26, func(p *calico.IPPool) { p.AllowedUses = []string{calico.UseTunnel} })
	e.putNode("node-a", "a")
	e.putNode("node-b", "b")
	for node, want := range map[string]string{"node-a": "10.65.0.0/24", "node-b": "10.66.0.0/24"} {
		got := addrs(e.mustAdd(e.list(netOpts{ipam: e.ipam(node, nil)}), rt("c-"+node, "eth0")))[0]
		if !mustPrefix(want).Contains(got.Addr()) {
			t.Errorf("%s got %s, want an address of %s", node, got, want)
		}
	}
	_, err := e.add(e.list(netOpts{ipam: e.ipam("node-x", nil)}), rt("x", "eth0"))
	wantCode(t, err, 7, "Calico Node resource")
	_, err = e.add(e.list(netOpts{ipam: e.ipam("node-a", map[string]any{"ipv4_pools": []string{"c-tunnel"}})}), rt("t", "eth0"))
	wantCode(t, err, 7, "does not allow Workload")
	// Named pools are used without their selector (Calico: requested pools are used unconditionally).
	e.mustAdd(e.list(netOpts{ipam: e.ipam("node-a", map[string]any{"ipv4_pools": []string{"b-rack-b"}})}), rt("named", "eth0"))

	// maxBlocksPerHost: node-a holds one block of a /24 pool with room for four; at the limit it
	// neither claims nor borrows, as Calico.
	e.putIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true, MaxBlocksPerHost: 1})
	l := e.list(netOpts{ipam: e.ipam("node-a", nil)})
	for i := 1; i < 64; i++ {
		e.mustAdd(l, rt(fmt.Sprintf("fill%d", i), "eth0"))
	}
	_, err = e.add(l, rt("over", "eth0"))
	wantCode(t, err, cni.ErrPoolExhausted, "limit")

	bad := newEnv(t)
	bad.putPool("p", "10.68.0.0/24", 26, func(p *calico.IPPool) { p.NodeSelector = "rack = 'a'" })
	_, err = bad.add(bad.list(netOpts{ipam: bad.ipam("node1", nil)}), rt("c", "eth0"))
	wantCode(t, err, cni.ErrDatastore, "nodeSelector")
}

// TestReleaseWhereBlockMoved: DEL releases by the block the handle names, not by where the pool's
// current block size would put the address (Calico's ReleaseIPs looks there and misses); a handle
// naming a block that no longer exists is corrected (Calico's releaseByHandle leaves it, and
// `calicoctl ipam check` then reports it as leaked).
func TestReleaseWhereBlockMoved(t *testing.T) {
	e := newEnv(t)
	e.putPool("p", "10.69.0.0/16", 26)
	l := e.list(netOpts{ipam: e.ipam("node1", nil)})
	a := addrs(e.mustAdd(l, rt("c1", "eth0")))[0]
	e.mustAdd(l, rt("c2", "eth0"))
	e.putPool("p", "10.69.0.0/16", 28) // the pool's block size changed since
	e.mustDel(l, rt("c1", "eth0"))
	if b := e.block(netip.PrefixFrom(a.Addr(), 26).Masked().String()); b.Allocated() != 1 {
		t.Fatalf("after DEL the /26 holds %d, want 1 (c2)", b.Allocated())
	}

	// A handle naming a block that is gone.
	h := calico.NewHandle()
	h.Add(mustPrefix("10.69.255.0/26"), 1)
	data, _ := calico.EncodeHandle(h)
	e.put(calico.HandleKey("net1.gone"), data)
	e.mustDel(l, rt("gone", "eth0"))
	if _, ok := e.snapshot().Handles["net1.gone"]; ok {
		t.Fatal("handle of a vanished block kept after DEL")
	}
}

// TestReleaseWhenPoolNoLongerSelects: after the node's labels change, its next ADD uses the pool that
// now selects it and releases (deletes with its affinity) its empty block of the pool that no longer
// does; a block still holding an address stays the node's.
func TestReleaseWhenPoolNoLongerSelects(t *testing.T) {
	e := newEnv(t)
	e.putPool("a", "10.70.0.0/24", 26, func(p *calico.IPPool) { p.NodeSelector = "rack == 'a'" })
	e.putPool("b", "10.71.0.0/24", 26, func(p *calico.IPPool) { p.NodeSelector = "rack == 'b'" })
	label := func(rack string) { e.putNode("node1", rack) }
	label("a")
	l := e.list(netOpts{ipam: e.ipam("node1", nil)})
	a1 := addrs(e.mustAdd(l, rt("c1", "eth0")))[0]
	blockA := netip.PrefixFrom(a1.Addr(), 26).Masked()
	e.mustDel(l, rt("c1", "eth0"))
	// A second node1 block in pool a that keeps an address (requested explicitly).
	keep, _ := calico.OrdinalAddr(netip.PrefixFrom(blockA.Addr(), 25).Masked(), 0)
	if netip.PrefixFrom(keep, 26).Masked() == blockA {
		keep, _ = calico.OrdinalAddr(netip.PrefixFrom(blockA.Addr(), 25).Masked(), 64)
	}
	e.mustAdd(l, rt("k", "eth0", [2]string{"IP", keep.String()}))
	blockKeep := netip.PrefixFrom(keep, 26).Masked()

	label("b")
	if got := addrs(e.mustAdd(l, rt("c2", "eth0")))[0]; !mustPrefix("10.71.0.0/24").Contains(got.Addr()) {
		t.Fatalf("after relabelling got %s, want pool b", got)
	}
	s := e.snapshot()
	if s.Blocks[blockA] != nil {
		t.Fatalf("empty block %s of the pool that no longer selects node1 kept", blockA)
	}
	if b := s.Blocks[blockKeep]; b == nil || calico.OwnerOf(b, false).Node != "node1" {
		t.Fatalf("block %s holding an address: %+v, want kept by node1", blockKeep, b)
	}
}

// TestDelReleasesWhenPoolNoLongerSelects: the DEL that empties a block whose pool no longer selects
// the block's node deletes the block and the node's affinity (Calico's ensureConsistentAffinity); a
// block emptied in a pool that still selects its node stays.
func TestDelReleasesWhenPoolNoLongerSelects(t *testing.T) {
	e := newEnv(t)
	e.putPool("a", "10.72.0.0/24", 26, func(p *calico.IPPool) { p.NodeSelector = "rack == 'a'" })
	label := func(rack string) { e.putNode("node1", rack) }
	label("a")
	l := e.list(netOpts{ipam: e.ipam("node1", nil)})
	a := addrs(e.mustAdd(l, rt("c1", "eth0")))[0]
	e.mustAdd(l, rt("c2", "eth0"))
	block := netip.PrefixFrom(a.Addr(), 26).Masked()
	e.mustDel(l, rt("c1", "eth0"))
	label("b")
	e.mustDel(l, rt("c2", "eth0"))
	s := e.snapshot()
	if s.Blocks[block] != nil {
		t.Fatalf("emptied block %s of a pool that no longer selects node1 kept", block)
	}
	for key := range s.Affinities {
		if strings.HasSuffix(key, calico.EncodeCIDR(block)) {
			t.Fatalf("affinity %s kept", key)
		}
	}
	// Still selected: emptied and kept.
	label("a")
	a = addrs(e.mustAdd(l, rt("c3", "eth0")))[0]
	e.mustDel(l, rt("c3", "eth0"))
	if b := e.snapshot().Blocks[netip.PrefixFrom(a.Addr(), 26).Masked()]; b == nil {
		t.Fatal("emptied block of a pool that still selects node1 deleted")
	}
}
