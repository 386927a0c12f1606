package agent_test

import (
	"context"
	"log/slog"
	"maps"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/logging"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
)

// registrar runs a registrar for node with peer IP ip until the returned stop is called.
type testRegistrar struct {
	*agent.Registrar
	m    *agent.Metrics
	reg  *prometheus.Registry
	log  *logging.Buffer
	stop func()
}

func startRegistrar(t *testing.T, cli *clientv3.Client, node, ip string, deregister bool) *testRegistrar {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := agent.NewMetrics(reg)
	buf := &logging.Buffer{}
	r, err := agent.NewRegistrar(agent.RegistrarConfig{Client: cli, HostsPrefix: hosts, NodeName: node,
		PeerIPs: parseAddrs(ip), TTL: 5 * time.Second, Deregister: deregister,
		RequestTimeout: 2 * time.Second, CheckInterval: 200 * time.Millisecond, Metrics: m,
		Logger: slog.New(slog.NewTextHandler(buf, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	tr := &testRegistrar{Registrar: r, m: m, reg: reg, log: buf}
	var once sync.Once
	tr.stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("registrar %s %s: %v", node, ip, err)
			}
		})
	}
	t.Cleanup(tr.stop)
	return tr
}

// parseAddrs parses a comma-separated list of addresses (a node's peer IPs in uplink order).
func parseAddrs(list string) []netip.Addr {
	var out []netip.Addr
	for _, s := range strings.Split(list, ",") {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func waitUntil(t *testing.T, what string, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not %s within %s", what, within)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// valueChanges records every value the key takes, from now on: the watch starts at the revision after
// a Get made now, so no early event is missed. The returned func gives the values the key took up to
// the store's revision at the time of the call: it waits (up to 30 s) until the watch has caught up with
// that revision, so that an event already written cannot be missing from it.
func valueChanges(t *testing.T, cli *clientv3.Client, key string) func() []string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	now, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var vals []string
	seen := now.Header.Revision // the watch has delivered every event up to this revision
	wch := cli.Watch(ctx, key, clientv3.WithRev(now.Header.Revision+1))
	go func() {
		for resp := range wch {
			mu.Lock()
			for _, ev := range resp.Events {
				vals = append(vals, string(ev.Kv.Value)) // "" for a delete
			}
			seen = max(seen, resp.Header.Revision)
			mu.Unlock()
		}
	}()
	return func() []string {
		t.Helper()
		cur, err := cli.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			mu.Lock()
			caughtUp, out := seen >= cur.Header.Revision, append([]string(nil), vals...)
			mu.Unlock()
			if caughtUp {
				return out
			}
			if time.Now().After(deadline) {
				t.Fatalf("the watch of %s did not reach revision %d within 30s", key, cur.Header.Revision)
			}
			if err := cli.RequestProgress(ctx); err != nil { // a progress notify carries the revision
				t.Fatal(err)
			}
		}
	}
}

// TestSecondAgentOfANodeNameWaits: two agents with one node name and different peer IPs. The second
// never writes: it is not up, names the conflict (node, both IPs) in Problem, logs it at ERROR and
// sets the conflict gauge; it takes over only when the first one's lease is gone, and the key then
// changes exactly once.
func TestSecondAgentOfANodeNameWaits(t *testing.T) {
	_, cli := etcdtest.Start(t)
	key := hosts + "n1/peerip/ipv4/1"
	first := startRegistrar(t, cli, "n1", "192.0.2.1", false)
	waitUntil(t, "first registered", 5*time.Second, first.Up)
	changes := valueChanges(t, cli, key)

	second := startRegistrar(t, cli, "n1", "192.0.2.2", false)
	waitUntil(t, "conflict reported", 5*time.Second, func() bool { return second.Problem() != "" })
	p := second.Problem()
	for _, want := range []string{`"n1"`, "192.0.2.1", "192.0.2.2"} {
		if !strings.Contains(p, want) {
			t.Errorf("Problem() = %q, want it to name %s", p, want)
		}
	}
	if !strings.Contains(second.log.String(), "level=ERROR") || !strings.Contains(second.log.String(), "192.0.2.1") {
		t.Errorf("no ERROR line naming the other registration:\n%s", second.log.String())
	}
	if v := metricstest.Value(t, second.reg, "vpp_route_agent_registration_conflict"); v != 1 {
		t.Errorf("conflict gauge %v, want 1", v)
	}
	time.Sleep(time.Second) // five check intervals of the second agent
	if second.Up() || !first.Up() {
		t.Errorf("up: first %v second %v, want true false", first.Up(), second.Up())
	}
	if got := changes(); len(got) != 0 {
		t.Fatalf("the registration changed during the conflict: %q", got)
	}

	// The first agent stops (its lease outlives it, as on a restart): the second waits for the lease to
	// expire, then takes over.
	first.stop()
	time.Sleep(time.Second)
	if second.Up() {
		t.Fatal("the second agent took over a live lease")
	}
	waitUntil(t, "second registered after the lease expired", 10*time.Second, second.Up)
	if got := changes(); len(got) != 2 || got[0] != "" || got[1] != "192.0.2.2" {
		t.Errorf("key values seen: %q, want the expiry then 192.0.2.2", got)
	}
	if second.Problem() != "" || metricstest.Value(t, second.reg, "vpp_route_agent_registration_conflict") != 0 {
		t.Errorf("conflict still reported after the takeover: %q", second.Problem())
	}
}

// TestRestartAdoptsItsOwnRegistration: an agent restarting with the same name and peer IP adopts the
// lease its previous run left, without writing: other nodes see no event at all.
func TestRestartAdoptsItsOwnRegistration(t *testing.T) {
	_, cli := etcdtest.Start(t)
	key := hosts + "n1/peerip/ipv4/1"
	first := startRegistrar(t, cli, "n1", "192.0.2.1", false)
	waitUntil(t, "registered", 5*time.Second, first.Up)
	first.stop()
	before, err := cli.Get(context.Background(), key)
	if err != nil || len(before.Kvs) != 1 {
		t.Fatal(err, before)
	}
	changes := valueChanges(t, cli, key)
	again := startRegistrar(t, cli, "n1", "192.0.2.1", false)
	waitUntil(t, "registered again", 5*time.Second, again.Up)
	time.Sleep(300 * time.Millisecond)
	after, err := cli.Get(context.Background(), key)
	if err != nil || len(after.Kvs) != 1 {
		t.Fatal(err, after)
	}
	if after.Kvs[0].Lease != before.Kvs[0].Lease || after.Kvs[0].ModRevision != before.Kvs[0].ModRevision || len(changes()) != 0 {
		t.Errorf("restart rewrote the registration: lease %x -> %x, revision %d -> %d, events %q",
			before.Kvs[0].Lease, after.Kvs[0].Lease, before.Kvs[0].ModRevision, after.Kvs[0].ModRevision, changes())
	}
	// The adopted lease is kept alive: it outlives its original TTL.
	time.Sleep(6 * time.Second)
	ttl, err := cli.TimeToLive(context.Background(), clientv3.LeaseID(after.Kvs[0].Lease))
	if err != nil || ttl.TTL <= 0 {
		t.Errorf("adopted lease not kept alive: %v %v", ttl, err)
	}
}

// TestRegistrationWrittenByHandIsNotOverwritten: a key put without a lease (by hand, or by an old
// agent) is a conflict too; deleting it lets the agent register.
func TestRegistrationWrittenByHandIsNotOverwritten(t *testing.T) {
	_, cli := etcdtest.Start(t)
	key := hosts + "n1/peerip/ipv4/1"
	r := startRegistrar(t, cli, "n1", "192.0.2.1", true)
	waitUntil(t, "registered", 5*time.Second, r.Up)
	if _, err := cli.Put(context.Background(), key, "192.0.2.9"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "conflict", 5*time.Second, func() bool { return strings.Contains(r.Problem(), "192.0.2.9") })
	time.Sleep(500 * time.Millisecond)
	if resp, _ := cli.Get(context.Background(), key); string(resp.Kvs[0].Value) != "192.0.2.9" {
		t.Fatalf("the agent overwrote a registration it did not write: %s", resp.Kvs[0].Value)
	}
	if _, err := cli.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "registered again", 5*time.Second, r.Up)
	r.stop()
	if resp, _ := cli.Get(context.Background(), key); len(resp.Kvs) != 0 {
		t.Errorf("deregistration left %s", resp.Kvs[0].Value)
	}
}

// TestRegistrationWriteIsConditional: another agent registers the node name between the registrar's
// read of the keys (which found them absent) and its write. The interleaving is deterministic: the
// registrar's etcd client runs the other agent's write from a gRPC interceptor just before its first
// transaction reaches etcd. The write must then fail its condition: the other registration stays as it
// was written, the registrar reads again and reports the conflict instead.
func TestRegistrationWriteIsConditional(t *testing.T) {
	srv, cli := etcdtest.Start(t)
	key := hosts + "n1/peerip/ipv4/1"
	theirLease, err := cli.Grant(context.Background(), 60)
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	var theirs *clientv3.PutResponse
	raced := make(chan struct{})
	interleave := func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
		invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if method == "/etcdserverpb.KV/Txn" {
			once.Do(func() {
				defer close(raced)
				var err error
				if theirs, err = cli.Put(ctx, key, "192.0.2.9", clientv3.WithLease(theirLease.ID)); err != nil {
					t.Errorf("the other agent's write: %v", err)
				}
			})
		}
		return invoker(ctx, method, req, reply, cc, opts...)
	}
	racy, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, DialTimeout: 5 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(interleave)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { racy.Close() })

	r := startRegistrar(t, racy, "n1", "192.0.2.1", false)
	select {
	case <-raced:
	case <-time.After(10 * time.Second):
		t.Fatal("the registrar sent no transaction within 10s")
	}
	changes := valueChanges(t, cli, key)
	waitUntil(t, "settled", 5*time.Second, func() bool { return r.Up() || r.Problem() != "" })
	time.Sleep(500 * time.Millisecond) // a few check intervals: the registrar reads again, writes nothing
	resp, err := cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "192.0.2.9" || clientv3.LeaseID(resp.Kvs[0].Lease) != theirLease.ID ||
		resp.Kvs[0].ModRevision != theirs.Header.Revision {
		t.Fatalf("the registrar overwrote a registration written between its read and its write: %v", resp.Kvs)
	}
	if got := changes(); len(got) != 0 {
		t.Errorf("the registration changed after the other agent's write: %q", got)
	}
	if r.Up() || !strings.Contains(r.Problem(), "192.0.2.9") {
		t.Errorf("up %v, Problem() = %q; want the conflict with 192.0.2.9 reported", r.Up(), r.Problem())
	}
}

// TestRegistersEveryUplinksPeerIP: a node with several uplinks registers its peer IPs of each family under
// /1, /2, ... in uplink order, on one lease; a peer IP given twice is refused at start.
func TestRegistersEveryUplinksPeerIP(t *testing.T) {
	_, cli := etcdtest.Start(t)
	r := startRegistrar(t, cli, "multi", "192.0.2.1,2001:db8::1,198.51.100.1", false)
	waitUntil(t, "registered", 10*time.Second, r.Up)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cli.Get(ctx, hosts+"multi/", clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	lease := resp.Kvs[0].Lease
	for _, kv := range resp.Kvs {
		got[strings.TrimPrefix(string(kv.Key), hosts+"multi/")] = string(kv.Value)
		if kv.Lease != lease || lease == 0 {
			t.Errorf("%s is on lease %x, want one lease for all", kv.Key, kv.Lease)
		}
	}
	want := map[string]string{"peerip/ipv4/1": "192.0.2.1", "peerip/ipv4/2": "198.51.100.1", "peerip/ipv6/1": "2001:db8::1"}
	if !maps.Equal(got, want) {
		t.Errorf("registered %v, want %v", got, want)
	}
	if _, err := agent.NewRegistrar(agent.RegistrarConfig{Client: cli, HostsPrefix: hosts, NodeName: "dup", TTL: 5 * time.Second,
		PeerIPs: parseAddrs("192.0.2.1,192.0.2.1")}); err == nil || !strings.Contains(err.Error(), "given twice") {
		t.Errorf("a peer IP given twice: %v", err)
	}
}
