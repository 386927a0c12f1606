package blockwatch

import (
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/netaddr"
)

// keyModel is what the randomized test knows of one key: its last write, and the good values of its
// current incarnation (since the last delete). When the last write is malformed, the Watcher keeps
// the last good value it saw of that incarnation, or the key is absent if it saw none: which one
// depends on what a relist skipped, so any of them is accepted.
type keyModel[V any] struct {
	want    V
	present bool
	bad     bool
	since   []V
}

func (m *keyModel[V]) good(v V) {
	m.want, m.present, m.bad = v, true, false
	m.since = append(m.since, v)
}

// gone is a delete (hard) or a soft delete (deleted:true, which keeps the incarnation).
func (m *keyModel[V]) gone(hard bool) {
	var zero V
	m.want, m.present, m.bad = zero, false, false
	if hard {
		m.since = nil
	}
}

func (m *keyModel[V]) malformed() { m.bad = true }

// accepts reports whether the Watcher's value got (present or not) is allowed.
func (m *keyModel[V]) accepts(got V, present bool, eq func(a, b V) bool) bool {
	if !m.bad {
		return present == m.present && (!present || eq(got, m.want))
	}
	return !present || slices.ContainsFunc(m.since, func(v V) bool { return eq(v, got) })
}

// TestRandomized writes a random sequence of good, malformed and deleted blocks, peers, pools and
// Calico Nodes, with relists and compactions in between, while a slow consumer reads snapshots.
// Every snapshot's change set must name everything that differs from the snapshot read before it
// (coalescing included), and the last snapshot must match a model of the package's rules (keyModel).
func TestRandomized(t *testing.T) {
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	srv, cli := startEtcd(t)
	h := newHarness(t, cli, nil)
	h.run()

	cidrs := make([]netip.Prefix, 16)
	for i := range cidrs {
		cidrs[i] = calicotest.BlockCIDR(i)
	}
	cidrs[15] = mustPrefix("fd00:10:244::c0/122")
	nodes := []string{"n0", "n1", "n2", "n3"}

	blocks := map[netip.Prefix]*keyModel[*Block]{}
	for _, c := range cidrs {
		blocks[c] = &keyModel[*Block]{}
	}
	peers := map[peerID]*keyModel[netip.Addr]{}
	for _, n := range append(nodes, "final") {
		peers[peerID{node: n}], peers[peerID{node: n, v6: true}] = &keyModel[netip.Addr]{}, &keyModel[netip.Addr]{}
	}
	pools := map[string]*keyModel[calico.IPPool]{}
	for i := range 3 {
		pools[fmt.Sprintf("pool-%d", i)] = &keyModel[calico.IPPool]{}
	}
	calicoNodes := map[string]*keyModel[calico.Node]{}
	for _, n := range append(nodes, "final") {
		calicoNodes[n] = &keyModel[calico.Node]{}
	}

	// The consumer checks change sets as it goes and hands back the last snapshot.
	type result struct {
		last  *Snapshot
		count int
	}
	// The three watches are independent streams: the end is a marker written last to each prefix.
	marker := mustPrefix("10.200.0.0/26")
	final := func(s *Snapshot) bool {
		_, pool := s.Pools["final"]
		_, node := s.Nodes["final"]
		return s != nil && s.Blocks.Get(marker) != nil && s.Peers["final"].IPv4.IsValid() && pool && node
	}
	putNode := func(name string, addr netip.Addr) int64 {
		v := nodeValue(name, `{"bgp":{"ipv4Address":"`+addr.String()+`/24"}}`)
		n, err := node(name, []byte(v))
		if err != nil {
			t.Fatal(err)
		}
		calicoNodes[name].good(n)
		return put(t, cli, calico.NodeKey(name), v)
	}
	stop := make(chan struct{})
	done := make(chan result, 1)
	go func() {
		var prev *Snapshot
		var res result
		stopped := false
		for {
			var s *Snapshot
			select {
			case s = <-h.w.Updates():
			case <-stop:
				stop, stopped = nil, true
				if res.last != nil && final(res.last) {
					done <- res
					return
				}
				continue
			}
			res.count++
			if prev != nil {
				checkChanges(t, prev, s)
			}
			prev, res.last = s, s
			if stopped && final(s) {
				done <- res
				return
			}
			time.Sleep(time.Duration(rand.IntN(3)) * time.Millisecond) // a slow consumer: snapshots coalesce
		}
	}()

	var lastRev int64
	for op := range 300 {
		switch r := rng.IntN(100); {
		case r < 40: // good block
			cidr := cidrs[rng.IntN(len(cidrs))]
			b := calicotest.Block(cidr, nodes[rng.IntN(len(nodes))], op)
			if rng.IntN(3) == 0 {
				calicotest.Allocate(b, fmt.Sprintf("h%d", op), calicotest.PodAttrs(nodes[rng.IntN(len(nodes))], "ns", "p", time.Unix(0, 0)))
			}
			if rng.IntN(8) == 0 {
				b.Affinity = nil
			}
			lastRev = putBlock(t, cli, b)
			owner := calico.OwnerOf(b, false)
			blocks[cidr].good(&Block{CIDR: cidr, Owner: owner, Borrowed: calico.BorrowedAddrs(b, owner)})
		case r < 48: // malformed block: keeps the last good value
			cidr := cidrs[rng.IntN(len(cidrs))]
			lastRev = put(t, cli, calico.BlockKey(cidr), `{"cidr":"10.`)
			blocks[cidr].malformed()
		case r < 52: // deleted:true
			cidr := cidrs[rng.IntN(len(cidrs))]
			b := calicotest.Block(cidr, "n0", op)
			b.Deleted = true
			lastRev = putBlock(t, cli, b)
			blocks[cidr].gone(false)
		case r < 62:
			cidr := cidrs[rng.IntN(len(cidrs))]
			lastRev = del(t, cli, calico.BlockKey(cidr))
			blocks[cidr].gone(true)
		case r < 75: // peers
			node := nodes[rng.IntN(len(nodes))]
			fam, v6 := netaddr.V4, rng.IntN(2) == 0
			m := peers[peerID{node: node, v6: v6}]
			addr := netip.AddrFrom4([4]byte{192, 0, 2, byte(rng.IntN(250) + 1)})
			if v6 {
				fam, addr = netaddr.V6, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(rng.IntN(250) + 1)})
			}
			key := PeerKey(DefaultHostsPrefix, node, fam)
			switch rng.IntN(4) {
			case 0:
				lastRev = del(t, cli, key)
				m.gone(true)
			case 1:
				lastRev = put(t, cli, key, "not-an-address")
				m.malformed()
			default:
				lastRev = put(t, cli, key, addr.String())
				m.good(addr)
			}
		case r < 82: // pools
			name := fmt.Sprintf("pool-%d", rng.IntN(3))
			switch rng.IntN(3) {
			case 0:
				lastRev = del(t, cli, calico.IPPoolKey(name))
				pools[name].gone(true)
			case 1:
				lastRev = put(t, cli, calico.IPPoolKey(name), `{"spec":{"cidr":"10.0.0.0/16","blockSize":8}}`)
				pools[name].malformed()
			default:
				p := calico.IPPool{Name: name, CIDR: netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(rng.IntN(200)), 0, 0}), 16).Masked(),
					BlockSize: 26, NodeSelector: "all()", Disabled: rng.IntN(2) == 0}
				v, err := calico.EncodeIPPool(p)
				if err != nil {
					t.Fatal(err)
				}
				lastRev = put(t, cli, calico.IPPoolKey(name), string(v))
				pools[name].good(p)
			}
		case r < 90:
			h.w.Relist()
		case r < 92:
			if _, err := srv.Compact(testCtx(t)); err != nil && !errors.Is(err, rpctypes.ErrCompacted) {
				t.Fatal(err)
			}
		case r < 96: // Calico Nodes
			name := nodes[rng.IntN(len(nodes))]
			switch rng.IntN(4) {
			case 0:
				lastRev = del(t, cli, calico.NodeKey(name))
				calicoNodes[name].gone(true)
			case 1:
				lastRev = put(t, cli, calico.NodeKey(name), `{"metadata":`)
				calicoNodes[name].malformed()
			default:
				lastRev = putNode(name, netip.AddrFrom4([4]byte{192, 0, 2, byte(rng.IntN(250) + 1)}))
			}
		default:
			// Unrelated keys move the revision without touching the view.
			lastRev = put(t, cli, "/calico/resources/v3/projectcalico.org/workloadendpoints/x", fmt.Sprint(op))
		}
	}
	putBlock(t, cli, calicotest.Block(marker, "n0", 0))
	put(t, cli, PeerKey(DefaultHostsPrefix, "final", netaddr.V4), "198.51.100.1")
	peers[peerID{node: "final"}].good(mustAddr("198.51.100.1"))
	fp := calico.IPPool{Name: "final", CIDR: mustPrefix("10.201.0.0/16"), BlockSize: 26, NodeSelector: "all()"}
	fv, _ := calico.EncodeIPPool(fp)
	lastRev = put(t, cli, calico.IPPoolKey("final"), string(fv))
	pools["final"] = &keyModel[calico.IPPool]{}
	pools["final"].good(fp)
	lastRev = putNode("final", mustAddr("198.51.100.1"))
	close(stop)
	var res result
	select {
	case res = <-done:
	case <-time.After(waitLimit):
		t.Fatalf("consumer did not see the markers written up to revision %d (status %+v)", lastRev, h.w.Status())
	}
	last := res.last
	t.Logf("%d snapshots read, status %+v", res.count, h.w.Status())
	nBlocks := last.Blocks.Len() // but the marker
	if last.Blocks.Get(marker) != nil {
		nBlocks--
	}
	for cidr, m := range blocks {
		if b, ok := last.Blocks.Lookup(cidr); !m.accepts(b, ok, (*Block).Equal) {
			t.Errorf("block %s: got %+v (present %v), model %+v", cidr, b, ok, *m)
		}
	}
	for id, m := range peers {
		p, ok := last.Peers[id.node]
		a := p.IPv4
		if id.v6 {
			a = p.IPv6
		}
		if !m.accepts(a, ok && a.IsValid(), func(a, b netip.Addr) bool { return a == b }) {
			t.Errorf("peer %+v: got %v, model %+v", id, a, *m)
		}
	}
	for name, m := range pools {
		if p, ok := last.Pools[name]; !m.accepts(p, ok, poolEqual) {
			t.Errorf("pool %s: got %+v (present %v), model %+v", name, p, ok, *m)
		}
	}
	for name, m := range calicoNodes {
		if n, ok := last.Nodes[name]; !m.accepts(n, ok, nodeEqual) {
			t.Errorf("node %s: got %+v (present %v), model %+v", name, n, ok, *m)
		}
	}
	if nBlocks > len(cidrs) || len(last.Pools) > len(pools) || len(last.Peers) > len(nodes)+1 || len(last.Nodes) > len(calicoNodes) {
		t.Errorf("unexpected keys: %d blocks, %d pools, %d peers, %d nodes", nBlocks, len(last.Pools), len(last.Peers), len(last.Nodes))
	}
}

// checkChanges checks that cur's change set names every difference from prev.
func checkChanges(t *testing.T, prev, cur *Snapshot) {
	t.Helper()
	for _, k := range slices.Concat(slices.Collect(maps.Keys(prev.Blocks.Map())), slices.Collect(maps.Keys(cur.Blocks.Map()))) {
		if !prev.Blocks.Get(k).Equal(cur.Blocks.Get(k)) {
			if _, ok := slices.BinarySearchFunc(cur.ChangedBlocks, k, netip.Prefix.Compare); !ok {
				t.Errorf("snapshot %d (full %v): block %s changed since %d but is not in ChangedBlocks %v",
					cur.Revision, cur.Full, k, prev.Revision, cur.ChangedBlocks)
			}
		}
	}
	for _, n := range slices.Concat(slices.Collect(maps.Keys(prev.Peers)), slices.Collect(maps.Keys(cur.Peers))) {
		if prev.Peers[n] != cur.Peers[n] && !slices.Contains(cur.ChangedPeers, n) {
			t.Errorf("snapshot %d: peer %s changed but is not in ChangedPeers %v", cur.Revision, n, cur.ChangedPeers)
		}
	}
	if !maps.EqualFunc(prev.Pools, cur.Pools, poolEqual) && !cur.PoolsChanged {
		t.Errorf("snapshot %d: pools changed but PoolsChanged is false", cur.Revision)
	}
	for _, n := range slices.Concat(slices.Collect(maps.Keys(prev.Nodes)), slices.Collect(maps.Keys(cur.Nodes))) {
		p, pok := prev.Nodes[n]
		c, cok := cur.Nodes[n]
		if (pok != cok || !nodeEqual(p, c)) && !slices.Contains(cur.ChangedNodes, n) {
			t.Errorf("snapshot %d: node %s changed but is not in ChangedNodes %v", cur.Revision, n, cur.ChangedNodes)
		}
	}
	if (prev.Tunnel != cur.Tunnel || !slices.Equal(prev.TunnelProblems, cur.TunnelProblems)) && !cur.TunnelChanged {
		t.Errorf("snapshot %d: tunnel changed but TunnelChanged is false", cur.Revision)
	}
	if cur.Revision < prev.Revision {
		t.Errorf("revision went back from %d to %d", prev.Revision, cur.Revision)
	}
}
