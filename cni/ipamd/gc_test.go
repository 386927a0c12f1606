package ipamd

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"sync/atomic"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcheck"
)

// slowKV is a KV behind a slow link, once armed: a response arrives perByte per byte of the
// values it carries after etcd sent it, or not at all if the call's deadline comes first.
type slowKV struct {
	clientv3.KV
	armed   atomic.Bool
	perByte time.Duration
}

func (s *slowKV) arrive(ctx context.Context, kvs int) error {
	if !s.armed.Load() {
		return nil
	}
	t := time.NewTimer(time.Duration(kvs) * s.perByte)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *slowKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	resp, err := s.KV.Get(ctx, key, opts...)
	if err != nil {
		return nil, err
	}
	n := 0
	for _, kv := range resp.Kvs {
		n += len(kv.Value)
	}
	if err := s.arrive(ctx, n); err != nil {
		return nil, err
	}
	return resp, nil
}

func (s *slowKV) Txn(ctx context.Context) clientv3.Txn {
	return &slowTxn{Txn: s.KV.Txn(ctx), kv: s, ctx: ctx}
}

type slowTxn struct {
	clientv3.Txn
	kv  *slowKV
	ctx context.Context
}

func (t *slowTxn) If(cs ...clientv3.Cmp) clientv3.Txn   { t.Txn = t.Txn.If(cs...); return t }
func (t *slowTxn) Then(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Then(ops...); return t }
func (t *slowTxn) Else(ops ...clientv3.Op) clientv3.Txn { t.Txn = t.Txn.Else(ops...); return t }

func (t *slowTxn) Commit() (*clientv3.TxnResponse, error) {
	resp, err := t.Txn.Commit()
	if err != nil {
		return nil, err
	}
	n := 0
	for _, r := range resp.Responses {
		if rr := r.GetResponseRange(); rr != nil {
			for _, kv := range rr.Kvs {
				n += len(kv.Value)
			}
		}
	}
	if err := t.kv.arrive(t.ctx, n); err != nil {
		return nil, err
	}
	return resp, nil
}

// TestGCSnapshotOfALargeCluster: GC reads the blocks of the whole cluster. Behind a link where
// reading them all takes about three CallTimeouts, the single read GC used to make cannot finish
// within its deadline (checked here as the control), while the paged snapshot, each page well
// within a CallTimeout, reads them all and GC releases the node's stale address.
func TestGCSnapshotOfALargeCluster(t *testing.T) {
	const (
		callTimeout = 400 * time.Millisecond
		blocks      = 2048 // 10.100.0.0/15 in /26 blocks of other nodes
	)
	slow := &slowKV{}
	srv := startServerKV(t, Config{CallTimeout: callTimeout}, nil, func(kv clientv3.KV) clientv3.KV { slow.KV = kv; return slow })
	size := putOtherNodesBlocks(t, srv.cli, blocks, 50)
	if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest("c1", 5*time.Second)); err != nil || r.Err() != nil {
		t.Fatal(err, r.Err())
	}
	// A page of gcPageSize blocks arrives in a quarter of a CallTimeout; all the blocks in about
	// blocks/gcPageSize/4 = 2.6 CallTimeouts.
	slow.perByte = callTimeout / time.Duration(4*gcPageSize*size)
	slow.armed.Store(true)

	// The control: GC's former snapshot, every block in one read.
	_, err := srv.etcd.txn(t.Context(), nil, []op{prefixOp(calico.BlockPrefix+"ipv4/block/", false), prefixOp(calico.BlockPrefix+"ipv6/block/", false)}, nil)
	if !errors.Is(err, errUnavailable) {
		t.Fatalf("reading every block in one round trip: %v, want a deadline", err)
	}

	start := time.Now()
	r, err := ipamcall.Call(context.Background(), srv.sock, &cni.Request{Verb: "GC", Network: "net1", HaveAttachments: true, Timeout: 20 * time.Second})
	if err != nil || r.Err() != nil || r.Released != 1 {
		t.Fatalf("GC: %+v %v", r, err)
	}
	if min := int64(blocks/gcPageSize + 1); r.RoundTrips < min {
		t.Errorf("GC took %d etcd round trips, want at least %d (one per page)", r.RoundTrips, min)
	}
	t.Logf("GC over %d blocks of %d bytes: %d round trips, %v (CallTimeout %v)", blocks+1, size, r.RoundTrips, time.Since(start).Round(time.Millisecond), callTimeout)
	slow.armed.Store(false)
	if err := ipamcheck.Check(t.Context(), srv.cli, ipamcheck.Options{}); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

// TestGCManyStaleHandles releases more stale allocations than one transaction holds, in /26 blocks
// (many blocks, one handle each per address) and in a /24 block (one block whose candidates do not
// fit in one transaction), keeping the one valid attachment.
func TestGCManyStaleHandles(t *testing.T) {
	for _, tc := range []struct {
		bits, stale int
	}{{26, 120}, {26, 130}, {24, 130}, {24, 250}} {
		t.Run(fmt.Sprintf("/%d-%d", tc.bits, tc.stale), func(t *testing.T) {
			srv := startServer(t, Config{}, nil, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: tc.bits})
			for i := range tc.stale + 1 {
				if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest(fmt.Sprintf("c%03d", i), 5*time.Second)); err != nil || r.Err() != nil {
					t.Fatal(err, r.Err())
				}
			}
			keep := types.GCAttachment{ContainerID: fmt.Sprintf("c%03d", tc.stale), IfName: "eth0"}
			r, err := ipamcall.Call(context.Background(), srv.sock, &cni.Request{Verb: "GC", Network: "net1", HaveAttachments: true,
				ValidAttachments: []types.GCAttachment{keep}, Timeout: 20 * time.Second})
			if err != nil || r.Err() != nil || r.Released != tc.stale {
				t.Fatalf("GC released %d of %d: %v %v", r.Released, tc.stale, err, r.Err())
			}
			resp, err := srv.cli.Get(t.Context(), calico.HandlePrefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
			if err != nil || resp.Count != 1 {
				t.Errorf("handles left: %d (%v), want 1", resp.Count, err)
			}
			if err := ipamcheck.Check(t.Context(), srv.cli, ipamcheck.Options{}); err != nil {
				t.Fatalf("invariants: %v", err)
			}
		})
	}
}

// flakyKV fails, once armed, the first read of a page after the first (a read at a fixed revision)
// with err.
type flakyKV struct {
	clientv3.KV
	armed atomic.Bool
	err   error
}

func (f *flakyKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	if clientv3.OpGet(key, opts...).Rev() != 0 && f.armed.CompareAndSwap(true, false) {
		return nil, f.err
	}
	return f.KV.Get(ctx, key, opts...)
}

// TestGCSnapshotSurvivesAPageError: a page of GC's snapshot that fails for a transient reason is
// read again, and a compacted revision restarts the listing; GC then releases what is stale.
func TestGCSnapshotSurvivesAPageError(t *testing.T) {
	for _, pageErr := range []error{rpctypes.ErrLeaderChanged, rpctypes.ErrCompacted} {
		t.Run(pageErr.Error(), func(t *testing.T) {
			flaky := &flakyKV{err: pageErr}
			srv := startServerKV(t, Config{}, nil, func(kv clientv3.KV) clientv3.KV { flaky.KV = kv; return flaky })
			putOtherNodesBlocks(t, srv.cli, gcPageSize+50, 1) // two pages
			if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest("c1", 5*time.Second)); err != nil || r.Err() != nil {
				t.Fatal(err, r.Err())
			}
			flaky.armed.Store(true)
			r, err := ipamcall.Call(context.Background(), srv.sock, &cni.Request{Verb: "GC", Network: "net1", HaveAttachments: true, Timeout: 10 * time.Second})
			if err != nil || r.Err() != nil || r.Released != 1 {
				t.Fatalf("GC: %+v %v", r, err)
			}
			if flaky.armed.Load() {
				t.Fatal("no page failed")
			}
		})
	}
}

// putOtherNodesBlocks writes n /26 blocks of 10.100.0.0/15 affine to nodes node2, node3, ... (nodes
// of them, round robin), with their confirmed affinities, 100 keys to a transaction. It returns the
// size of a block's value.
func putOtherNodesBlocks(t *testing.T, cli *clientv3.Client, n, nodes int) (size int) {
	t.Helper()
	confirmed, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	var ops []clientv3.Op
	for i := range n {
		a, _ := calico.OrdinalAddr(netip.MustParsePrefix("10.100.0.0/15"), i*64)
		cidr, node := netip.PrefixFrom(a, 26), fmt.Sprintf("node%d", i%nodes+2)
		v, err := calico.EncodeBlock(calico.NewBlock(cidr, "host:"+node, uint64(i)))
		if err != nil {
			t.Fatal(err)
		}
		size = len(v)
		ops = append(ops, clientv3.OpPut(calico.BlockKey(cidr), string(v)), clientv3.OpPut(calico.HostAffinityKey(node, cidr), string(confirmed)))
		if len(ops) >= 100 || i == n-1 {
			if _, err := cli.Txn(t.Context()).Then(ops...).Commit(); err != nil {
				t.Fatal(err)
			}
			ops = ops[:0]
		}
	}
	return size
}
