package release

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/ipamd"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamdtest"
)

type alloc struct {
	ord          int
	handle, node string
}

// putBlock writes a block with its allocations, the owner's affinity key (for "host:" owners) and
// the allocations' handles, as Calico would have.
func putBlock(t testing.TB, cli *clientv3.Client, cidr, affinity string, allocs ...alloc) {
	t.Helper()
	ctx := context.Background()
	p := netip.MustParsePrefix(cidr)
	b := calico.NewBlock(p, affinity, 1)
	for _, a := range allocs {
		h := a.handle
		attr := calico.AllocationAttribute{HandleID: &h, Secondary: map[string]string{calico.AttrNode: a.node, calico.AttrNamespace: "default", calico.AttrPod: "pod-" + h}}
		if a.node == "" {
			delete(attr.Secondary, calico.AttrNode)
		}
		if err := b.Assign(a.ord, attr); err != nil {
			t.Fatal(err)
		}
		hv := calico.NewHandle()
		if resp, err := cli.Get(ctx, calico.HandleKey(h)); err != nil {
			t.Fatal(err)
		} else if len(resp.Kvs) > 0 {
			if hv, err = calico.DecodeHandle(resp.Kvs[0].Value); err != nil {
				t.Fatal(err)
			}
		}
		hv.Add(p, 1)
		v, _ := calico.EncodeHandle(hv)
		mustPut(t, cli, calico.HandleKey(h), string(v))
	}
	b.BumpSequence()
	v, err := calico.EncodeBlock(b)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, cli, calico.BlockKey(p), string(v))
	if node, ok := strings.CutPrefix(affinity, "host:"); ok {
		a, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
		mustPut(t, cli, calico.HostAffinityKey(node, p), string(a))
	}
}

func mustPut(t testing.TB, cli *clientv3.Client, key, value string, opts ...clientv3.OpOption) {
	t.Helper()
	if _, err := cli.Put(context.Background(), key, value, opts...); err != nil {
		t.Fatal(err)
	}
}

func exists(t testing.TB, cli *clientv3.Client, key string) bool {
	t.Helper()
	resp, err := cli.Get(context.Background(), key, clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count > 0
}

func countPrefix(t testing.TB, cli *clientv3.Client, prefix string) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if err != nil {
		t.Fatal(err)
	}
	return resp.Count
}

func readBlock(t testing.TB, cli *clientv3.Client, cidr string) *calico.Block {
	t.Helper()
	resp, err := cli.Get(context.Background(), calico.BlockKey(netip.MustParsePrefix(cidr)))
	if err != nil || len(resp.Kvs) == 0 {
		t.Fatalf("block %s: %v (absent)", cidr, err)
	}
	b, err := calico.DecodeBlock(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Validate(); err != nil {
		t.Fatalf("block %s after the release: %v", cidr, err)
	}
	return b
}

func readHandle(t testing.TB, cli *clientv3.Client, id string) *calico.Handle {
	t.Helper()
	resp, err := cli.Get(context.Background(), calico.HandleKey(id))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil
	}
	h, err := calico.DecodeHandle(resp.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// seedCluster: dead node n1 owns 10.0.0.0/26 (its pods only), 10.0.0.64/26 (its pods and one
// address n2 borrowed), fd00::/122 (a pod whose handle also holds an IPv4 address) and has borrowed
// an address in n2's 10.0.1.0/26; n2 is alive; a pending orphan affinity of n1 names a block that
// does not exist.
func seedCluster(t testing.TB, cli *clientv3.Client) {
	putBlock(t, cli, "10.0.0.0/26", "host:n1", alloc{0, "net.a", "n1"}, alloc{1, "net.b", "n1"}, alloc{2, "net.dual", "n1"})
	putBlock(t, cli, "10.0.0.64/26", "host:n1", alloc{0, "net.c", "n1"}, alloc{5, "net.n2pod", "n2"})
	putBlock(t, cli, "fd00::/122", "host:n1", alloc{3, "net.dual", "n1"})
	putBlock(t, cli, "10.0.1.0/26", "host:n2", alloc{0, "net.n2own", "n2"}, alloc{1, "net.borrow", "n1"})
	a, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityPending})
	mustPut(t, cli, calico.HostAffinityKey("n1", netip.MustParsePrefix("10.0.2.0/26")), string(a))
	mustPut(t, cli, ipamd.AliveKey("n2"), "x")
}

func opts(cli *clientv3.Client, node string) Options {
	return Options{Client: cli, Node: node, CallTimeout: 3 * time.Second}
}

func revision(t testing.TB, cli *clientv3.Client) int64 {
	resp, err := cli.Get(context.Background(), "any")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// TestDryRunWritesNothing: a plan names every block, allocation, handle and affinity the release
// would change, and etcd's revision does not move.
func TestDryRunWritesNothing(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	before := revision(t, cli)
	p, err := NewPlan(t.Context(), opts(cli, "n1"))
	if err != nil {
		t.Fatal(err)
	}
	if after := revision(t, cli); after != before {
		t.Fatalf("the plan wrote: revision %d -> %d", before, after)
	}
	actions := map[string]BlockAction{}
	for _, b := range p.Blocks {
		actions[b.CIDR.String()] = b.Action
	}
	want := map[string]BlockAction{"10.0.0.0/26": BlockDelete, "10.0.0.64/26": BlockUnown, "fd00::/122": BlockDelete, "10.0.1.0/26": BlockUpdate}
	if !mapsEqual(actions, want) {
		t.Fatalf("block actions %v, want %v", actions, want)
	}
	if p.Addresses() != 6 || len(p.Orphans) != 1 || len(p.Alive) != 0 {
		t.Fatalf("plan: %d addresses (want 6), %d orphan affinities (want 1), alive %v", p.Addresses(), len(p.Orphans), p.Alive)
	}
	var ids []string
	for _, h := range p.Handles {
		ids = append(ids, h.ID)
		if !h.Delete || (h.ID == "net.dual") != (h.Released == 2) {
			t.Errorf("handle %+v", h)
		}
	}
	if want := []string{"net.a", "net.b", "net.borrow", "net.c", "net.dual"}; !slices.Equal(ids, want) {
		t.Fatalf("handles %v, want %v", ids, want)
	}
}

func mapsEqual[K, V comparable](a, b map[K]V) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestReleaseFreesBlocks: after the commit the node's emptied blocks and every affinity key of it
// are gone (their subnets claimable: no block, no affinity), the block with n2's address is left
// without owner and keeps that address, n2's block loses only n1's borrowed address, the handles
// of n1's pods are gone and n2's untouched, a record names what was released, and a new plan finds
// nothing (a rerun releases nothing twice).
func TestReleaseFreesBlocks(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	putBlock(t, cli, "10.0.5.0/26", "host:n1") // empty: deleted too
	o := opts(cli, "n1")
	o.By = "test"
	p, err := NewPlan(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Commit(t.Context(), o, p)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Complete() || len(res.Released) != 6 || len(res.AffinitiesDeleted) != 5 || len(res.BlocksDeleted) != 3 {
		t.Fatalf("result %+v", res)
	}
	for _, k := range []string{"10.0.0.0/26", "fd00::/122", "10.0.5.0/26"} {
		if exists(t, cli, calico.BlockKey(netip.MustParsePrefix(k))) {
			t.Errorf("block %s still there", k)
		}
	}
	if resp, _ := cli.Get(t.Context(), calico.HostAffinityNodePrefix("n1"), clientv3.WithPrefix()); len(resp.Kvs) != 0 {
		t.Errorf("affinity %s left", resp.Kvs[0].Key)
	}
	b := readBlock(t, cli, "10.0.0.64/26")
	if b.Affinity != nil || b.Allocated() != 1 || b.AttributeOf(5).Handle() != "net.n2pod" {
		t.Errorf("10.0.0.64/26: affinity %v, %d allocated", b.Affinity, b.Allocated())
	}
	b = readBlock(t, cli, "10.0.1.0/26")
	if *b.Affinity != "host:n2" || b.Allocated() != 1 || b.Allocations[1] != nil {
		t.Errorf("10.0.1.0/26: affinity %v, allocations %v", *b.Affinity, b.Allocations[:2])
	}
	for _, id := range []string{"net.a", "net.b", "net.c", "net.dual", "net.borrow"} {
		if readHandle(t, cli, id) != nil {
			t.Errorf("handle %s left", id)
		}
	}
	for _, id := range []string{"net.n2pod", "net.n2own"} {
		if h := readHandle(t, cli, id); h == nil || h.Count() != 1 {
			t.Errorf("handle %s of n2: %+v", id, h)
		}
	}
	if res.Record == "" || !exists(t, cli, res.Record) {
		t.Errorf("no release record (%q)", res.Record)
	}
	p, err = NewPlan(t.Context(), o)
	if err != nil {
		t.Fatalf("plan after the release: %v", err)
	}
	if !p.Empty() || p.LastRecord != res.Record {
		t.Fatalf("plan after the release: %+v", p)
	}
}

// TestRefusesLiveNode: a node with a liveness key on a lease, or a route agent registration, is
// refused with the key and the lease's TTL left; --force releases it.
func TestRefusesLiveNode(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	lease, err := cli.Grant(t.Context(), 30)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, cli, ipamd.AliveKey("n1"), "1", clientv3.WithLease(lease.ID))
	mustPut(t, cli, ipamd.DefaultHostsPrefix+"n1/peerip/ipv4/1", "192.0.2.1")
	o := opts(cli, "n1")
	p, err := NewPlan(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Commit(t.Context(), o, p)
	var ae *AliveError
	if !errors.As(err, &ae) || !errors.Is(err, ErrAlive) {
		t.Fatalf("commit of a live node: %v", err)
	}
	msg := err.Error()
	for _, want := range []string{ipamd.AliveKey("n1") + " on lease", "TTL ", "s left", "/vpp-calico/hosts/n1/peerip/ipv4/1 (no lease)", "--force"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal %q does not say %q", msg, want)
		}
	}
	if !exists(t, cli, calico.BlockKey(netip.MustParsePrefix("10.0.0.0/26"))) {
		t.Fatal("refused, yet the block is gone")
	}
	o.Force = true
	res, err := Commit(t.Context(), o, p)
	if err != nil || !res.Forced || len(res.Alive) != 2 || len(res.Released) != 6 {
		t.Fatalf("forced: %+v, %v", res, err)
	}
}

// TestUnknownNode: a name nothing in etcd knows is a clear error; a bad name too.
func TestUnknownNode(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	_, err := NewPlan(t.Context(), opts(cli, "n9"))
	if !errors.Is(err, ErrUnknownNode) || !strings.Contains(err.Error(), `"n9"`) {
		t.Fatalf("unknown node: %v", err)
	}
	if _, err := NewPlan(t.Context(), opts(cli, "a/b")); err == nil || !strings.Contains(err.Error(), "'/'") {
		t.Fatalf("bad name: %v", err)
	}
	// A Calico Node without IPAM state is known: nothing to release.
	mustPut(t, cli, calico.NodePrefix+"n9", "{}")
	if p, err := NewPlan(t.Context(), opts(cli, "n9")); err != nil || !p.Empty() || !p.Calico {
		t.Fatalf("Calico node without blocks: %+v %v", p, err)
	}
}

// TestMalformedBlockSkipped: a block of the node that does not decode, and one that breaks the
// block invariants, are left exactly as they are, named in the plan and the result, with their
// affinity keys; the node's other blocks are released.
func TestMalformedBlockSkipped(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	bad := calico.BlockKey(netip.MustParsePrefix("10.0.3.0/26"))
	mustPut(t, cli, bad, `{"cidr":"10.0.3.0/26","affinity":"host:n1","allocations":[`)
	a, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	mustPut(t, cli, calico.HostAffinityKey("n1", netip.MustParsePrefix("10.0.3.0/26")), string(a))
	broken := calico.BlockKey(netip.MustParsePrefix("10.0.4.0/26"))
	b := calico.NewBlock(netip.MustParsePrefix("10.0.4.0/26"), "host:n1", 1)
	b.Unallocated = b.Unallocated[1:] // ordinal 0 neither free nor allocated
	v, _ := calico.EncodeBlock(b)
	mustPut(t, cli, broken, string(v))
	var logs bytes.Buffer
	o := opts(cli, "n1")
	o.Logger = slog.New(slog.NewTextHandler(&syncWriter{w: &logs}, nil))
	p, err := NewPlan(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	var skipped []string
	for _, s := range p.Skipped {
		skipped = append(skipped, s.Key)
	}
	if !slices.Equal(skipped, []string{bad, broken}) {
		t.Fatalf("skipped %v, want %s and %s", skipped, bad, broken)
	}
	if !strings.Contains(logs.String(), bad) || !strings.Contains(logs.String(), broken) {
		t.Errorf("not logged: %s", logs.String())
	}
	res, err := Commit(t.Context(), o, p)
	if err != nil || len(res.Skipped) != 2 || len(res.Released) != 6 {
		t.Fatalf("commit: %+v %v", res, err)
	}
	if resp, _ := cli.Get(t.Context(), bad); !strings.HasSuffix(string(resp.Kvs[0].Value), `"allocations":[`) {
		t.Error("the malformed block was changed")
	}
	if !exists(t, cli, calico.HostAffinityKey("n1", netip.MustParsePrefix("10.0.3.0/26"))) || !exists(t, cli, broken) {
		t.Error("the malformed blocks' affinity or block was deleted")
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(b)
}

// TestTwoOperators: two releases of the same node planned at once and committed at once: between
// them every address is released exactly once (each handle's count ends at zero, no block double
// released), at most one aborts cleanly, and a third plan finds nothing.
func TestTwoOperators(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	o := opts(cli, "n1")
	p1, err1 := NewPlan(t.Context(), o)
	p2, err2 := NewPlan(t.Context(), o)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	var wg sync.WaitGroup
	res := make([]*Result, 2)
	errs := make([]error, 2)
	for i, p := range []*Plan{p1, p2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = Commit(t.Context(), o, p)
		}()
	}
	wg.Wait()
	released := 0
	for i := range res {
		if errs[i] != nil && !errors.Is(errs[i], ErrAborted) {
			t.Fatalf("operator %d: %v", i, errs[i])
		}
		released += len(res[i].Released)
	}
	if released != 6 {
		t.Fatalf("%d addresses released between the two, want 6 (each once): %v / %v", released, errs[0], errs[1])
	}
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Fatalf("want exactly one to abort: %v / %v", errs[0], errs[1])
	}
	p, err := NewPlan(t.Context(), o)
	if err != nil || !p.Empty() {
		t.Fatalf("third plan: %+v %v", p, err)
	}
	if b := readBlock(t, cli, "10.0.1.0/26"); b.Allocated() != 1 {
		t.Fatalf("n2's block: %d allocated", b.Allocated())
	}
}

// failingKV stops the etcd server before the after+1-th transaction: etcd lost halfway.
type failingKV struct {
	clientv3.KV
	srv   *etcdtest.Server
	after int32
	n     atomic.Int32
}

func (f *failingKV) Txn(ctx context.Context) clientv3.Txn {
	if f.n.Add(1) == f.after+1 {
		f.srv.Stop()
	}
	return f.KV.Txn(ctx)
}

// TestEtcdLostHalfway: etcd stops after two of the release's transactions; the commit fails
// naming the block, the two applied are whole (blocks and handles together), and once etcd is
// back a new plan and commit finish the job without releasing anything twice.
func TestEtcdLostHalfway(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	o := opts(cli, "n1")
	o.CallTimeout = time.Second
	p, err := NewPlan(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	o.KV = &failingKV{KV: cli.KV, srv: srv, after: 2}
	res, err := Commit(t.Context(), o, p)
	if err == nil || res.Complete() || res.Transactions != 2 {
		t.Fatalf("commit with etcd lost: %+v %v", res, err)
	}
	first := len(res.Released)
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	o.KV = nil
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for {
		p, err = NewPlan(ctx, o)
		if err == nil || ctx.Err() != nil {
			break
		}
	}
	if err != nil {
		t.Fatal(err)
	}
	if p.Addresses() != 6-first {
		t.Fatalf("rerun plans %d addresses, want %d", p.Addresses(), 6-first)
	}
	res2, err := Commit(ctx, o, p)
	if err != nil || !res2.Complete() {
		t.Fatalf("rerun: %+v %v", res2, err)
	}
	if first+len(res2.Released) != 6 {
		t.Fatalf("released %d then %d, want 6 in all", first, len(res2.Released))
	}
	for _, id := range []string{"net.a", "net.b", "net.c", "net.dual", "net.borrow"} {
		if readHandle(t, cli, id) != nil {
			t.Errorf("handle %s left", id)
		}
	}
	if h := readHandle(t, cli, "net.n2pod"); h == nil || h.Count() != 1 {
		t.Errorf("n2's handle: %+v", h)
	}
}

// TestComeBackBetweenPlanAndCommit: the node's liveness key appears after the plan: the commit's
// first transaction aborts, naming the key, and nothing is released.
func TestComeBackBetweenPlanAndCommit(t *testing.T) {
	_, cli := etcdtest.Start(t)
	seedCluster(t, cli)
	o := opts(cli, "n1")
	p, err := NewPlan(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	mustPut(t, cli, ipamd.AliveKey("n1"), "back")
	res, err := Commit(t.Context(), o, p)
	if !errors.Is(err, ErrAborted) || !strings.Contains(err.Error(), "came back ("+ipamd.AliveKey("n1")+")") || res.Done() {
		t.Fatalf("commit after the node came back: %+v %v", res, err)
	}
	if b := readBlock(t, cli, "10.0.0.0/26"); b.Allocated() != 3 || *b.Affinity != "host:n1" {
		t.Fatal("released a node that came back")
	}
}

// TestLargeBlockChunked: a /20 block with more handles than one transaction takes is released in
// several transactions, each whole.
func TestLargeBlockChunked(t *testing.T) {
	_, cli := etcdtest.Start(t)
	var allocs []alloc
	for i := range 250 {
		allocs = append(allocs, alloc{i, "net.p" + strconv.Itoa(i), "n1"})
	}
	putBlock(t, cli, "10.1.0.0/20", "host:n1", allocs...)
	o := opts(cli, "n1")
	p, err := NewPlan(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	res, err := Commit(t.Context(), o, p)
	if err != nil || res.Transactions < 3 || len(res.Released) != 250 || len(res.HandlesDeleted) != 250 {
		t.Fatalf("%d transactions, %d released, %d handles deleted: %v", res.Transactions, len(res.Released), len(res.HandlesDeleted), err)
	}
	if exists(t, cli, calico.BlockKey(netip.MustParsePrefix("10.1.0.0/20"))) || countPrefix(t, cli, calico.HandlePrefix) != 0 {
		t.Fatal("block or handles left")
	}
}

// TestReleasedBlockClaimedAgain: a pool of one block, held by a dead node, strict affinity on (no
// borrowing): block-ipam's daemon on another node cannot place a pod; after the release it claims
// the block and places it there.
func TestReleasedBlockClaimedAgain(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	if err := calicotest.PutPool(t.Context(), cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.0.0.0/26"), BlockSize: 26}); err != nil {
		t.Fatal(err)
	}
	conf, _ := calico.EncodeIPAMConfig(calico.IPAMConfig{StrictAffinity: true, AutoAllocateBlocks: true})
	mustPut(t, cli, calico.IPAMConfigKey, string(conf))
	putBlock(t, cli, "10.0.0.0/26", "host:n1", alloc{0, "net.a", "n1"})
	d := ipamdtest.Start(t, ipamdtest.Options{Node: "n3", Endpoints: []string{srv.Endpoint()}, Socket: filepath.Join(ipamdtest.SocketDir(t), "n3.sock")})
	add := func(cid string) *cni.Reply {
		r, err := ipamcall.Call(t.Context(), d.Socket, &cni.Request{Verb: "ADD", ContainerID: cid, IfName: "eth0", Network: "net", Assign: [2]bool{true, false}, Timeout: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := add("before"); r.Err() == nil {
		t.Fatalf("ADD with the only block held by the dead node: %+v", r)
	}
	o := opts(cli, "n1")
	p, err := NewPlan(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Commit(t.Context(), o, p); err != nil {
		t.Fatal(err)
	}
	r := add("after")
	if r.Err() != nil || len(r.Allocations) != 1 {
		t.Fatalf("ADD after the release: %+v %v", r, r.Err())
	}
	if b := readBlock(t, cli, "10.0.0.0/26"); *b.Affinity != "host:n3" {
		t.Fatalf("block after the claim: affinity %s", *b.Affinity)
	}
}
