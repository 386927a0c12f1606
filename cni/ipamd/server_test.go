package ipamd

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/cni"
	"github.com/vpp-route-agent/vpp-route-agent/cni/shim"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcall"
	"github.com/vpp-route-agent/vpp-route-agent/internal/ipamcheck"
)

// testServer is a daemon for node1 on a real etcd, serving sock; stop stops it (also done at cleanup).
type testServer struct {
	*Server
	sock string
	cli  *clientv3.Client
	stop func()
}

// startServer runs a daemon for node1 on a real etcd, with the pools (pool p, 10.244.0.0/16, when
// none is given); cfg.Pause may call cli, which is set before the daemon starts.
func startServer(t testing.TB, cfg Config, cli **clientv3.Client, pools ...calico.IPPool) *testServer {
	t.Helper()
	return startServerKV(t, cfg, cli, nil, pools...)
}

// startServerKV is startServer with the daemon's operations on wrap(its client) (wrap nil: the
// client itself); its followers keep the client.
func startServerKV(t testing.TB, cfg Config, cli **clientv3.Client, wrap func(clientv3.KV) clientv3.KV, pools ...calico.IPPool) *testServer {
	t.Helper()
	_, c := etcdtest.Start(t)
	if cli != nil {
		*cli = c
	}
	cfg.Client = c
	return startServerOn(t, cfg, c, wrap, pools...)
}

// startServerOn runs a daemon for node1 on cfg.Client, c being a client of the same etcd for the
// test's own reads and writes (see startServerKV).
func startServerOn(t testing.TB, cfg Config, c *clientv3.Client, wrap func(clientv3.KV) clientv3.KV, pools ...calico.IPPool) *testServer {
	t.Helper()
	if len(pools) == 0 {
		pools = []calico.IPPool{{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26}}
	}
	for _, p := range pools {
		v, _ := calico.EncodeIPPool(p)
		if _, err := c.Put(t.Context(), calico.IPPoolKey(p.Name), string(v)); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Node = "node1"
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if wrap != nil {
		srv.etcd.kv = wrap(srv.etcd.kv)
	}
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); srv.Run(ctx) }()
	go func() { defer wg.Done(); srv.Serve(ctx, l) }()
	stop := func() { cancel(); wg.Wait() }
	t.Cleanup(stop)
	for end := time.Now().Add(10 * time.Second); !srv.Synced() && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
	return &testServer{Server: srv, sock: sock, cli: c, stop: stop}
}

// pauseOnce returns cfg with a Pause that, the first time, closes stuck and waits for release to be
// closed, or for the operation's context to end (a test that fails before releasing stops its
// server, and does not hang).
func pauseOnce(cfg Config) (_ Config, stuck, release chan struct{}) {
	stuck, release = make(chan struct{}), make(chan struct{})
	var once sync.Once
	cfg.Pause = func(ctx context.Context) {
		once.Do(func() {
			close(stuck)
			select {
			case <-release:
			case <-ctx.Done():
			}
		})
	}
	return cfg, stuck, release
}

func addRequest(cid string, timeout time.Duration) *cni.Request {
	return &cni.Request{Verb: "ADD", ContainerID: cid, IfName: "eth0", Network: "net1", Assign: [2]bool{true, false}, Timeout: timeout}
}

func healthz(srv *Server) int {
	rec := httptest.NewRecorder()
	srv.HealthHandler(nil).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/healthz", nil))
	return rec.Code
}

// TestHealthzFollowsTheStateLoop: /healthz (and the systemd watchdog, through HealthyWithin) says ok
// while the state loop is idle or runs an operation within its deadline, and fails when the loop is
// stuck past it; it recovers when the loop turns again.
func TestHealthzFollowsTheStateLoop(t *testing.T) {
	// The pause ignores its context: a loop stuck in a call that does not honour its deadline.
	cfg, stuck, release := pauseOnce(Config{HealthWindow: 300 * time.Millisecond})
	srv := startServer(t, cfg, nil)
	sock := srv.sock
	if code := healthz(srv.Server); code != http.StatusOK {
		t.Fatalf("idle: /healthz %d", code)
	}
	go ipamcall.Call(context.Background(), sock, addRequest("c1", time.Second))
	<-stuck
	if code := healthz(srv.Server); code != http.StatusOK {
		t.Fatalf("within the operation's deadline: /healthz %d", code)
	}
	// The operation's deadline is 0.9 s after its start; the window 0.3 s beyond it.
	deadline := time.Now().Add(10 * time.Second)
	for healthz(srv.Server) == http.StatusOK && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if code := healthz(srv.Server); code != http.StatusServiceUnavailable {
		t.Fatalf("stuck past the deadline: /healthz %d, want 503", code)
	}
	if srv.HealthyWithin(300 * time.Millisecond) {
		t.Fatal("stuck past the deadline: HealthyWithin true")
	}
	close(release)
	for healthz(srv.Server) != http.StatusOK && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if code := healthz(srv.Server); code != http.StatusOK {
		t.Fatalf("loop turning again: /healthz %d", code)
	}
}

// TestHungUpRequestIsDropped: a request whose plugin hangs up while it waits in the queue is not run.
func TestHungUpRequestIsDropped(t *testing.T) {
	cfg, stuck, release := pauseOnce(Config{})
	srv := startServer(t, cfg, nil)
	sock, cli := srv.sock, srv.cli
	first := make(chan error, 1)
	go func() {
		r, err := ipamcall.Call(context.Background(), sock, addRequest("c1", 20*time.Second))
		if err == nil {
			err = r.Err()
		}
		first <- err
	}()
	<-stuck
	// The second plugin gives up: its context ends while its request waits behind c1's.
	ctx, cancel := context.WithCancel(context.Background())
	second := make(chan error, 1)
	go func() {
		_, err := ipamcall.Call(ctx, sock, addRequest("c2", 20*time.Second))
		second <- err
	}()
	for deadline := time.Now().Add(10 * time.Second); srv.Queued() == 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the second request never queued")
		}
	}
	cancel()
	<-second
	time.Sleep(100 * time.Millisecond)
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	// c2 was dropped; a third ADD runs after it in the same loop, so c2's turn has passed.
	r, err := ipamcall.Call(context.Background(), sock, addRequest("c3", 20*time.Second))
	if err != nil || r.Err() != nil {
		t.Fatal(err, r.Err())
	}
	resp, err := cli.Get(t.Context(), calico.HandleKey("net1.c2"))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 0 {
		t.Fatal("the ADD of a plugin that hung up was run")
	}
}

// TestHangupNoticedWhileWaiting: a plugin that closes its connection while its request runs is
// noticed at once (the operation's context ends), and one that keeps its side open after the request
// is not taken for a hang-up: the daemon reads the frame's length, and one goroutine blocked in a
// read of the connection (no epoll) returns only when the plugin goes. The old half-close by the
// plugin, which reads as EOF, would be a hang-up now.
func TestHangupNoticedWhileWaiting(t *testing.T) {
	var paused atomic.Pointer[context.Context]
	stuck := make(chan struct{}, 2)
	srv := startServer(t, Config{Pause: func(ctx context.Context) {
		paused.Store(&ctx)
		stuck <- struct{}{}
		<-ctx.Done()
	}}, nil)
	env, stdin, err := ipamcall.Frame(addRequest("c1", time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	var records []byte
	for k, v := range env {
		records = shim.AppendRecord(records, k, []byte(v))
	}
	frame := shim.Seal(shim.AppendRecord(records, shim.KeyStdin, stdin))
	conn, err := net.Dial("unix", srv.sock)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Write(frame); err != nil {
		t.Fatal(err)
	}
	<-stuck // the request was read whole and runs, the connection still open
	ctx := *paused.Load()
	if ctx.Err() != nil {
		t.Fatal("a plugin waiting with its side open was taken for a hang-up")
	}
	conn.Close()
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the plugin's hang-up was not noticed (its request runs to its one-minute deadline)")
	}
}

// TestDeletedPoolLeavesState: a pool deleted while an ADD that would claim from it is being written
// fails the write (conditional on the pool's mod revision), the retry claims from the pool left, and
// the deletion, whose watch event queued behind the write, still reaches the node state.
func TestDeletedPoolLeavesState(t *testing.T) {
	var once sync.Once
	var cli *clientv3.Client
	// Pool a sorts before p: ADD claims from it first.
	srv := startServer(t, Config{Pause: func(context.Context) {
		once.Do(func() {
			cli.Delete(context.Background(), calico.IPPoolKey("a"))
			time.Sleep(200 * time.Millisecond) // the watch event queues behind this operation
		})
	}}, &cli, calico.IPPool{Name: "p", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26},
		calico.IPPool{Name: "a", CIDR: netip.MustParsePrefix("10.245.0.0/16"), BlockSize: 26})
	sock := srv.sock
	r, err := ipamcall.Call(context.Background(), sock, addRequest("c1", 5*time.Second))
	if err != nil || r.Code != 0 || len(r.Allocations) != 1 {
		t.Fatalf("ADD: %+v %v", r, err)
	}
	if a := r.Allocations[0].Addr; !netip.MustParsePrefix("10.244.0.0/16").Contains(a) {
		t.Errorf("ADD got %s from the pool deleted before its write", a)
	}
	time.Sleep(300 * time.Millisecond) // the deletion's event reaches the loop
	srv.stop()
	if len(srv.state.pools) != 1 || srv.state.pools[0].Name != "p" {
		t.Errorf("the node state still holds the deleted pool: %+v", srv.state.pools)
	}
}

// TestBatchKeepsOrderPerContainer: an ADD queued behind a DEL of the same container is not served by
// an earlier ADD's write, ahead of the DEL: the DEL runs first, and the ADD's address stays held.
func TestBatchKeepsOrderPerContainer(t *testing.T) {
	cfg, stuck, release := pauseOnce(Config{})
	srv := startServer(t, cfg, nil)
	sock, cli := srv.sock, srv.cli
	go ipamcall.Call(context.Background(), sock, addRequest("z", 5*time.Second))
	<-stuck
	type result struct {
		r   *cni.Reply
		err error
	}
	var results [3]chan result
	for i, req := range []*cni.Request{addRequest("y", 5*time.Second),
		{Verb: "DEL", ContainerID: "x", IfName: "eth0", Network: "net1", Timeout: 5 * time.Second}, addRequest("x", 5*time.Second)} {
		results[i] = make(chan result, 1)
		go func() {
			r, err := ipamcall.Call(context.Background(), sock, req)
			results[i] <- result{r, err}
		}()
		for end := time.Now().Add(5 * time.Second); srv.Queued() != i+1; time.Sleep(time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("request %d not queued", i)
			}
		}
	}
	close(release)
	var addX result
	for i := range results {
		r := <-results[i]
		if r.err != nil || r.r.Code != 0 {
			t.Fatalf("request %d: %+v %v", i, r.r, r.err)
		}
		addX = r
	}
	resp, err := cli.Get(t.Context(), calico.HandleKey("net1.x"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatalf("ADD x answered %v, but its handle is gone (%v): the DEL queued before it ran after it", addX.r.Allocations, err)
	}
}

// TestGCRetriesOnFreshHandle: GC's write is conditional on the handles it corrects; when one changes
// under it, the failure branch reads it again and the next attempt succeeds (it does not decide on
// the stale handle again until its deadline).
func TestGCRetriesOnFreshHandle(t *testing.T) {
	var armed atomic.Bool
	var cli *clientv3.Client
	srv := startServer(t, Config{Pause: func(ctx context.Context) {
		if armed.CompareAndSwap(true, false) {
			// Rewrite the handle as it is: a new mod revision.
			resp, err := cli.Get(ctx, calico.HandleKey("net1.c1"))
			if err != nil || len(resp.Kvs) != 1 {
				t.Errorf("handle: %v", err)
				return
			}
			cli.Put(ctx, calico.HandleKey("net1.c1"), string(resp.Kvs[0].Value))
		}
	}}, &cli)
	if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest("c1", 5*time.Second)); err != nil || r.Err() != nil {
		t.Fatal(err, r.Err())
	}
	armed.Store(true)
	r, err := ipamcall.Call(context.Background(), srv.sock, &cni.Request{Verb: "GC", Network: "net1", HaveAttachments: true, Timeout: 3 * time.Second})
	if err != nil || r.Err() != nil || r.Released != 1 || r.Attempts < 2 {
		t.Fatalf("GC: %+v %v", r, err)
	}
	if resp, err := cli.Get(t.Context(), calico.HandleKey("net1.c1")); err != nil || len(resp.Kvs) != 0 {
		t.Fatalf("handle after GC: %v %v", resp.Kvs, err)
	}
}

// delRequest is a DEL of container cid's eth0 on net1.
func delRequest(cid string, timeout time.Duration) *cni.Request {
	return &cni.Request{Verb: "DEL", ContainerID: cid, IfName: "eth0", Network: "net1", Timeout: timeout}
}

// armedPause returns a Pause that, once armed, closes paused and waits for release (or its
// context) the first time it runs.
func armedPause() (pause func(context.Context), armed *atomic.Bool, paused, release chan struct{}) {
	armed = &atomic.Bool{}
	paused, release = make(chan struct{}), make(chan struct{})
	return func(ctx context.Context) {
		if armed.CompareAndSwap(true, false) {
			close(paused)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
	}, armed, paused, release
}

// waitQueued waits until n requests are queued for the state loop.
func waitQueued(t *testing.T, srv *testServer, n int) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); srv.Queued() < n; time.Sleep(time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("%d of %d requests queued", srv.Queued(), n)
		}
	}
}

// queue sends the requests one after another, each once the one before it is queued for the state
// loop (busy meanwhile), and returns their replies (code 999 when the call fails).
func queue(t *testing.T, srv *testServer, reqs ...*cni.Request) []chan *cni.Reply {
	t.Helper()
	replies := make([]chan *cni.Reply, len(reqs))
	for i, req := range reqs {
		replies[i] = make(chan *cni.Reply, 1)
		go func() {
			r, err := ipamcall.Call(context.Background(), srv.sock, req)
			if err != nil {
				r = &cni.Reply{Code: 999, Msg: err.Error()}
			}
			replies[i] <- r
		}()
		waitQueued(t, srv, i+1)
	}
	return replies
}

// TestBatchedDels: DELs that queue while the state loop is busy are decided on one view and written
// in one transaction by the first of them. Among them, a DEL of a container that has nothing (it
// succeeds: DEL is idempotent) and one whose handle etcd holds undecodable: the transaction,
// conditional on the handle values the blocks imply, fails on that one; its failure branch reads
// the handles, the bad DEL gets its error, and the others are written in the next transaction.
func TestBatchedDels(t *testing.T) {
	pause, armed, paused, release := armedPause()
	srv := startServer(t, Config{Pause: pause}, nil)
	call := func(req *cni.Request) *cni.Reply {
		r, err := ipamcall.Call(context.Background(), srv.sock, req)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	const n = 40
	cids := []string{"hold", "bad"}
	for i := range n {
		cids = append(cids, fmt.Sprintf("d%02d", i))
	}
	for _, cid := range cids {
		if r := call(addRequest(cid, 5*time.Second)); r.Err() != nil {
			t.Fatal(r.Err())
		}
	}
	badKey := calico.HandleKey("net1.bad")
	good, err := srv.cli.Get(t.Context(), badKey)
	if err != nil || len(good.Kvs) != 1 {
		t.Fatalf("handle of bad: %v", err)
	}
	if _, err := srv.cli.Put(t.Context(), badKey, "{not json"); err != nil {
		t.Fatal(err)
	}

	armed.Store(true)
	hold := make(chan *cni.Reply, 1)
	go func() { hold <- call(delRequest("hold", 5*time.Second)) }()
	<-paused
	queued := append(slices.Clone(cids[1:]), "ghost")
	replies := make([]chan *cni.Reply, len(queued))
	for i, cid := range queued {
		replies[i] = make(chan *cni.Reply, 1)
		go func() { replies[i] <- call(delRequest(cid, 5*time.Second)) }()
		waitQueued(t, srv, i+1)
	}
	close(release)
	if r := <-hold; r.Err() != nil {
		t.Fatal(r.Err())
	}
	roundTrips, batched := int64(0), 0
	for i, cid := range queued {
		r := <-replies[i]
		roundTrips += r.RoundTrips
		batched += r.Batched
		switch {
		case cid == "bad" && r.Code != ErrDatastore:
			t.Errorf("DEL of the container with an undecodable handle: %+v, want code %d", r, ErrDatastore)
		case cid != "bad" && r.Err() != nil:
			t.Errorf("DEL %s: %v", cid, r.Err())
		}
	}
	if batched != len(queued)-1 || roundTrips > 3 {
		t.Errorf("%d queued DELs: %d served by another's write, %d etcd round trips in all; want %d and at most 3",
			len(queued), batched, roundTrips, len(queued)-1)
	}
	t.Logf("%d queued DELs: %d served by the first one's write, %d etcd round trips in all", len(queued), batched, roundTrips)

	// Repaired, the bad handle still holds its address, and releases as any other; then the
	// datastore is clean.
	if _, err := srv.cli.Put(t.Context(), badKey, string(good.Kvs[0].Value)); err != nil {
		t.Fatal(err)
	}
	held := 0
	for _, b := range ipamcheck.MustRead(t, srv.cli).Blocks {
		held += len(b.Ordinals(func(a *calico.AllocationAttribute) bool { return a.Handle() != "" }))
	}
	if held != 1 {
		t.Errorf("%d addresses held after the DELs, want 1 (bad's)", held)
	}
	if r := call(delRequest("bad", 5*time.Second)); r.Err() != nil {
		t.Fatal(r.Err())
	}
	if err := ipamcheck.Check(t.Context(), srv.cli, ipamcheck.Options{}); err != nil {
		t.Fatalf("invariants: %v", err)
	}
	if resp, err := srv.cli.Get(t.Context(), calico.HandlePrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("handles left: %v %v", resp, err)
	}
}

// TestBatchedDelsKeepOrderPerContainer: a DEL queued behind an ADD of the same container is not
// served by an earlier DEL's write ahead of the ADD, and a DEL taken along runs before an ADD of its
// container queued after it.
func TestBatchedDelsKeepOrderPerContainer(t *testing.T) {
	pause, armed, paused, release := armedPause()
	srv := startServer(t, Config{Pause: pause}, nil)
	for _, cid := range []string{"z", "y", "w"} {
		if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest(cid, 5*time.Second)); err != nil || r.Err() != nil {
			t.Fatal(err, r.Err())
		}
	}
	armed.Store(true)
	go ipamcall.Call(context.Background(), srv.sock, delRequest("z", 5*time.Second))
	<-paused
	// Queued: DEL y (leads the next batch), ADD x, DEL x (after ADD x: not taken along), DEL w (taken
	// along), ADD w (after DEL w).
	reqs := []*cni.Request{delRequest("y", 5*time.Second), addRequest("x", 5*time.Second), delRequest("x", 5*time.Second),
		delRequest("w", 5*time.Second), addRequest("w", 5*time.Second)}
	replies := queue(t, srv, reqs...)
	close(release)
	for i := range reqs {
		if r := <-replies[i]; r.Err() != nil {
			t.Fatalf("%s %s: %v", reqs[i].Verb, reqs[i].ContainerID, r.Err())
		}
	}
	for cid, want := range map[string]int64{"x": 0, "y": 0, "w": 1} {
		resp, err := srv.cli.Get(t.Context(), calico.HandleKey("net1."+cid), clientv3.WithCountOnly())
		if err != nil || resp.Count != want {
			t.Errorf("handle of %s: %d, want %d (%v): a DEL ran out of its container's order", cid, resp.Count, want, err)
		}
	}
	if err := ipamcheck.Check(t.Context(), srv.cli, ipamcheck.Options{}); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

// TestBatchedDelsSplit: DELs of containers in as many different blocks of the node make a batch
// whose one transaction would exceed maxTxnOps (a put and a compare per block besides the handles):
// it is split into transactions that fit, and every DEL succeeds.
func TestBatchedDelsSplit(t *testing.T) {
	pause, armed, paused, release := armedPause()
	srv := startServer(t, Config{Pause: pause}, nil)
	if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest("hold", 5*time.Second)); err != nil || r.Err() != nil {
		t.Fatal(err, r.Err())
	}
	// n containers, each alone in a block of node1, written as Calico would.
	const n = 60
	confirmed, _ := calico.EncodeAffinity(calico.AffinityValue{State: calico.AffinityConfirmed})
	conf := &cni.Request{Node: "node1", Network: "net1"}
	for i := range n {
		cidr := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(100 + i), 0}), 26)
		h := fmt.Sprintf("net1.s%02d", i)
		b := calico.NewBlock(cidr, "host:node1", uint64(i))
		if err := b.Assign(0, attribute(conf, h, "eth0")); err != nil {
			t.Fatal(err)
		}
		hv := calico.NewHandle()
		hv.Add(cidr, 1)
		bv, _ := calico.EncodeBlock(b)
		hd, _ := calico.EncodeHandle(hv)
		if _, err := srv.cli.Txn(t.Context()).Then(clientv3.OpPut(calico.BlockKey(cidr), string(bv)),
			clientv3.OpPut(calico.HostAffinityKey("node1", cidr), string(confirmed)), clientv3.OpPut(calico.HandleKey(h), string(hd))).Commit(); err != nil {
			t.Fatal(err)
		}
	}
	for end := time.Now().Add(10 * time.Second); !srv.Synced() || srv.Queued() > 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the node state did not follow the new blocks")
		}
	}
	time.Sleep(200 * time.Millisecond) // the blocks' followers deliver them
	armed.Store(true)
	go ipamcall.Call(context.Background(), srv.sock, delRequest("hold", 5*time.Second))
	<-paused
	var reqs []*cni.Request
	for i := range n {
		reqs = append(reqs, delRequest(fmt.Sprintf("s%02d", i), 5*time.Second))
	}
	replies := queue(t, srv, reqs...)
	close(release)
	roundTrips := int64(0)
	for i := range n {
		r := <-replies[i]
		if r.Err() != nil {
			t.Fatalf("DEL s%02d: %v", i, r.Err())
		}
		roundTrips += r.RoundTrips
	}
	if roundTrips < 2 || roundTrips > n/4 {
		t.Errorf("%d DELs in %d blocks: %d etcd round trips, want 2 (one write would exceed %d operations) to %d", n, n, roundTrips, maxTxnOps, n/4)
	}
	t.Logf("%d DELs in %d blocks: %d etcd round trips", n, n, roundTrips)
	if resp, err := srv.cli.Get(t.Context(), calico.HandlePrefix, clientv3.WithPrefix(), clientv3.WithCountOnly()); err != nil || resp.Count != 0 {
		t.Fatalf("handles left: %v %v", resp, err)
	}
	if err := ipamcheck.Check(t.Context(), srv.cli, ipamcheck.Options{}); err != nil {
		t.Fatalf("invariants: %v", err)
	}
}

// TestBatchedDelsIsolateAConflict: one DEL of a batch whose handle changes before every write (x)
// loses every race; it is left out of the batch after its first, and the others are served before
// their deadline.
func TestBatchedDelsIsolateAConflict(t *testing.T) {
	var cli *clientv3.Client
	var hammer atomic.Bool
	var xValue []byte
	pause, armed, paused, release := armedPause()
	srv := startServer(t, Config{Pause: func(ctx context.Context) {
		pause(ctx)
		if hammer.Load() {
			// The same handle in other bytes: a new value and mod revision each time.
			xValue = append(xValue, ' ')
			if _, err := cli.Put(ctx, calico.HandleKey("net1.x"), string(xValue)); err != nil {
				t.Error(err)
			}
		}
	}}, &cli)
	for _, cid := range []string{"hold", "a", "x", "b"} {
		if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest(cid, 5*time.Second)); err != nil || r.Err() != nil {
			t.Fatal(err, r.Err())
		}
	}
	resp, err := cli.Get(t.Context(), calico.HandleKey("net1.x"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Fatal(resp, err)
	}
	xValue = resp.Kvs[0].Value
	armed.Store(true)
	lead := make(chan *cni.Reply, 1)
	go func() {
		r, _ := ipamcall.Call(context.Background(), srv.sock, delRequest("hold", 3*time.Second))
		lead <- r
	}()
	<-paused
	hammer.Store(true)
	cids := []string{"a", "x", "b"}
	replies := queue(t, srv, delRequest("a", 3*time.Second), delRequest("x", 3*time.Second), delRequest("b", 3*time.Second))
	close(release)
	if r := <-lead; r == nil || r.Err() != nil || r.Attempts > 3 {
		t.Fatalf("DEL hold: %+v", r)
	}
	for i, cid := range cids {
		r := <-replies[i]
		if cid == "x" {
			continue // it loses every race
		}
		if r.Err() != nil {
			t.Errorf("DEL %s: %v", cid, r.Err())
		}
	}
	for _, cid := range []string{"hold", "a", "b"} {
		resp, _ := cli.Get(t.Context(), calico.HandleKey("net1."+cid), clientv3.WithCountOnly())
		if resp.Count != 0 {
			t.Errorf("handle %s left", cid)
		}
	}
}

// TestBatchedDelFailureNotCounted: a DEL served by another's write that fails on its own (its
// handle is undecodable) gets its error and is not counted as batched.
func TestBatchedDelFailureNotCounted(t *testing.T) {
	pause, armed, paused, release := armedPause()
	srv := startServer(t, Config{Pause: pause}, nil)
	for _, cid := range []string{"hold", "a", "bad", "b"} {
		if r, err := ipamcall.Call(context.Background(), srv.sock, addRequest(cid, 5*time.Second)); err != nil || r.Err() != nil {
			t.Fatal(err, r.Err())
		}
	}
	if _, err := srv.cli.Put(t.Context(), calico.HandleKey("net1.bad"), "{not json"); err != nil {
		t.Fatal(err)
	}
	armed.Store(true)
	go ipamcall.Call(context.Background(), srv.sock, delRequest("hold", 5*time.Second))
	<-paused
	replies := queue(t, srv, delRequest("a", 5*time.Second), delRequest("bad", 5*time.Second), delRequest("b", 5*time.Second))
	close(release)
	a, bad, b := <-replies[0], <-replies[1], <-replies[2]
	if a.Err() != nil || b.Err() != nil || bad.Code != ErrDatastore {
		t.Fatalf("DELs a %+v, bad %+v, b %+v", a, bad, b)
	}
	if a.Batched != 1 {
		t.Errorf("DEL a served %d others, want 1 (b; bad failed)", a.Batched)
	}
}

// TestBatchAnswersEachByItsDeadline: a request queued behind a batch's leader with a shorter deadline
// than the leader's is answered with 11 at its own deadline when the batch's write is held up past
// it (neither served late nor kept waiting for the leader), and the batch goes on without it: the
// leader and the others are served, and nothing of the short one is written.
func TestBatchAnswersEachByItsDeadline(t *testing.T) {
	for _, verb := range []string{"ADD", "DEL"} {
		t.Run(verb, func(t *testing.T) {
			req := addRequest
			if verb == "DEL" {
				req = delRequest
			}
			// Once armed: the first write (the operation before the batch) waits for release,
			// the batch's first one until its context ends (or 3 s), the next one 1 s (a slow etcd).
			var armed atomic.Bool
			var writes atomic.Int32
			paused, release := make(chan struct{}), make(chan struct{})
			srv := startServer(t, Config{Pause: func(ctx context.Context) {
				if !armed.Load() {
					return
				}
				switch writes.Add(1) {
				case 1:
					close(paused)
					<-release
				case 2:
					select {
					case <-ctx.Done():
					case <-time.After(3 * time.Second):
					}
				case 3:
					time.Sleep(time.Second)
				}
			}}, nil)
			call := func(r *cni.Request) (*cni.Reply, time.Duration) {
				start := time.Now()
				reply, err := ipamcall.Call(context.Background(), srv.sock, r)
				if err != nil {
					reply = &cni.Reply{Code: 999, Msg: err.Error()}
				}
				return reply, time.Since(start)
			}
			setup := []string{"warm"}
			if verb == "DEL" {
				setup = []string{"hold", "a", "short", "b"}
			}
			for _, cid := range setup {
				if r, _ := call(addRequest(cid, 5*time.Second)); r.Err() != nil {
					t.Fatal(r.Err())
				}
			}
			armed.Store(true)
			go call(req("hold", 10*time.Second))
			<-paused
			type result struct {
				r       *cni.Reply
				elapsed time.Duration
			}
			cids := []string{"a", "short", "b"}
			results := make([]chan result, len(cids))
			for i, cid := range cids {
				timeout := 10 * time.Second
				if cid == "short" {
					timeout = time.Second
				}
				results[i] = make(chan result, 1)
				go func() {
					r, d := call(req(cid, timeout))
					results[i] <- result{r, d}
				}()
				waitQueued(t, srv, i+1)
			}
			close(release)
			short := <-results[1]
			if short.r.Code != 11 || short.elapsed > 1500*time.Millisecond {
				t.Errorf("the short request: %+v after %v, want code 11 by its deadline (0.9 s)", short.r, short.elapsed)
			}
			lead := <-results[0]
			if lead.r.Err() != nil || lead.r.Batched != 1 || lead.elapsed < short.elapsed {
				t.Errorf("the leader: %+v after %v, want served with b, after the short one (%v)", lead.r, lead.elapsed, short.elapsed)
			}
			if b := <-results[2]; b.r.Err() != nil {
				t.Errorf("b: %+v", b.r)
			}
			for cid, want := range map[string]bool{"a": verb == "ADD", "short": verb == "DEL", "b": verb == "ADD"} {
				resp, err := srv.cli.Get(t.Context(), calico.HandleKey("net1."+cid), clientv3.WithCountOnly())
				if err != nil || (resp.Count == 1) != want {
					t.Errorf("handle of %s: %d (%v), want present %v", cid, resp.Count, err, want)
				}
			}
			if err := ipamcheck.Check(t.Context(), srv.cli, ipamcheck.Options{}); err != nil {
				t.Fatalf("invariants: %v", err)
			}
		})
	}
}

// TestOversizedFrameAnsweredAsFrame: a plugin's request over cni.MaxMessage is answered in the
// plugin's protocol (a frame with error 7 naming the limit), not in the JSON of the plugins before it,
// and read to its end first, so that the client gets the answer rather than a reset connection.
func TestOversizedFrameAnsweredAsFrame(t *testing.T) {
	srv := startServer(t, Config{}, nil)
	frame := shim.AppendRecord(nil, "CNI_COMMAND", []byte("ADD"))
	frame = shim.Seal(shim.AppendRecord(frame, shim.KeyStdin, bytes.Repeat([]byte("x"), cni.MaxMessage)))
	conn, err := net.Dial("unix", srv.sock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := conn.Write(frame); err != nil {
		t.Fatalf("sending %d bytes: %v", len(frame), err)
	}
	reply, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("reading the reply: %v", err)
	}
	rec, err := shim.ParseFrame(reply)
	if err != nil {
		t.Fatalf("reply %.200q: %v", reply, err)
	}
	want := fmt.Sprintf("larger than %d bytes", cni.MaxMessage)
	if string(rec[shim.KeyExit]) != "1" || !strings.Contains(string(rec[shim.KeyStdout]), `"code": 7`) || !strings.Contains(string(rec[shim.KeyStdout]), want) {
		t.Fatalf("exit %s, printed %s; want error 7 saying %q", rec[shim.KeyExit], rec[shim.KeyStdout], want)
	}
}

// failingListener fails its first fails accepts with EMFILE, as a listener does while the process
// is out of file descriptors.
type failingListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *failingListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "unix", Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

// TestServeOutlivesAcceptErrors: failed accepts (EMFILE) are waited out, and the daemon answers the
// next connection; only the end of its context (or a closed listener) ends Serve.
func TestServeOutlivesAcceptErrors(t *testing.T) {
	srv := startServer(t, Config{}, nil)
	sock := filepath.Join(t.TempDir(), "f.sock")
	l, err := Listen(sock)
	if err != nil {
		t.Fatal(err)
	}
	fl := &failingListener{Listener: l}
	fl.fails.Store(5)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, fl) }()
	cctx, ccancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer ccancel()
	r, err := ipamcall.Call(cctx, sock, addRequest("c1", 10*time.Second))
	if err != nil || r.Code != 0 {
		t.Errorf("ADD after failed accepts: %+v, %v", r, err)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned on its own: %v", err)
	default:
	}
	cancel()
	if err := <-served; err != nil {
		t.Errorf("Serve at the end of its context: %v", err)
	}
}

// TestLeaderHangupReleasesStateLoop: when the plugin of the request whose operation leads a batch
// hangs up while it waits before its write, the operation ends then, not at the request's deadline:
// the state loop serves the next request at once.
func TestLeaderHangupReleasesStateLoop(t *testing.T) {
	var pauses atomic.Int64
	var first context.Context
	stuck, release := make(chan struct{}), make(chan struct{})
	srv := startServer(t, Config{Pause: func(ctx context.Context) {
		if pauses.Add(1) == 1 {
			first = ctx
			close(stuck)
			<-release
		}
	}}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ipamcall.Call(ctx, srv.sock, addRequest("c1", 10*time.Second)) }()
	<-stuck
	cancel() // the runtime kills the plugin
	<-done
	for end := time.Now().Add(10 * time.Second); first.Err() == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("the hang-up was not noticed")
		}
	}
	close(release)
	start := time.Now()
	r, err := ipamcall.Call(context.Background(), srv.sock, addRequest("c2", 20*time.Second))
	// A bound, not a speed target: a held loop waits out c1's 10 s.
	if took := time.Since(start); took > 5*time.Second || err != nil || r.Code != 0 {
		t.Errorf("next ADD after %v: %+v, %v (Pause ran %d times)", took, r, err, pauses.Load())
	}
}
