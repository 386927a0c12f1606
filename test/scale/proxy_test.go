package scale

import (
	"context"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
)

// TestThroughGRPCProxy runs watchers of the real blockwatch code and a registration through etcd's
// gRPC proxy (etcd v3.6's grpcproxy, in-process) and checks what issue 13 asks of the proxy tier:
// etcd sends the proxy what it sends one direct watcher (twice the value: the proxy's own watch asks
// for each event's previous value), whatever the number of watchers behind it; the watchers stay in
// sync on an idle store; a proxy restart with a compaction in between makes every watcher relist (how
// many of those lists the proxy serves from its cache is logged here, a timing matter, and measured by
// make bench-scale); the registration's lease outlives the restart.
func TestThroughGRPCProxy(t *testing.T) {
	const m = 8
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	target := strings.TrimPrefix(srv.Endpoint(), "http://")
	direct, err := etcdtest.NewProxy(target) // the direct watcher's connection
	if err != nil {
		t.Fatal(err)
	}
	defer direct.Close()
	upstream, err := etcdtest.NewProxy(target) // the proxy's connection
	if err != nil {
		t.Fatal(err)
	}
	defer upstream.Close()
	w, err := newWriter(ctx, cli, 20, 5, m, 8)
	if err != nil {
		t.Fatal(err)
	}
	dataBytes := dataSetBytes(ctx, t, cli, blockwatch.OwnershipBlocks)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	px, err := startGRPCProxy("http://"+upstream.Addr(), ln)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { px.Stop() }()

	const probe = blockwatch.DefaultProbeInterval // a probe answered within 2s is no stall, even on a loaded machine
	one := startFleet(t, direct.Addr(), 1, func(c *blockwatch.Config) { c.ProbeInterval = probe })
	behind := startFleet(t, addr, m, func(c *blockwatch.Config) {
		c.ProbeInterval, c.CompactedRelistSpread = probe, time.Second
	})
	rev := w.revs[len(w.revs)-1]
	for _, f := range []*fleet{one, behind} {
		if err := f.waitRevision(rev, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	peer := netip.MustParseAddr("172.31.0.9")
	pcli, err := newClient(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer pcli.Close()
	reg, err := agent.NewRegistrar(agent.RegistrarConfig{Client: pcli, HostsPrefix: blockwatch.DefaultHostsPrefix,
		NodeName: "proxied", PeerIPs: []netip.Addr{peer}, TTL: 5 * time.Second,
		RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(ctx)
	regDone := make(chan error, 1)
	go func() { regDone <- reg.Run(rctx) }()
	defer func() { rcancel(); <-regDone }()

	// Idle: the probes are answered through the proxy.
	idle0 := behind.relists()
	time.Sleep(4 * probe)
	for i, wt := range behind.ws {
		for deadline := time.Now().Add(30 * time.Second); !wt.Status().Synced; time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("watcher %d behind the proxy not in sync on an idle store: %+v", i, wt.Status())
			}
		}
	}
	t.Logf("idle for %s: %d relists behind the proxy", 4*probe, behind.relists()-idle0)

	// ADDs: etcd's egress to the proxy is that of one watcher, not of m.
	d0, u0 := direct.Down.Load(), upstream.Down.Load()
	const adds = 20
	var last int64
	for range adds {
		if last, err = w.add(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []*fleet{one, behind} {
		if err := f.waitRevision(last, 30*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	toOne, toProxy := direct.Down.Load()-d0, upstream.Down.Load()-u0
	t.Logf("%d ADDs of %d B: etcd sent %d B to one direct watcher, %d B to the proxy of %d watchers",
		adds, w.bytes/adds, toOne, toProxy, m)
	if toProxy > 5*toOne/2 {
		t.Errorf("etcd sent the proxy of %d watchers %d B, more than 2.5 times what it sent one direct watcher (%d B): the proxy did not coalesce",
			m, toProxy, toOne)
	}

	// A proxy restart with a compaction meanwhile: every watcher behind it relists, mostly from the
	// proxy's cache.
	px.Stop()
	for range 3 {
		if last, err = w.add(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cli.Compact(ctx, last); err != nil {
		t.Fatal(err)
	}
	relists0 := behind.relists()
	each0 := make([]uint64, m)
	for i, wt := range behind.ws {
		each0[i] = wt.Status().Relists
	}
	u1 := upstream.Down.Load()
	if ln, err = net.Listen("tcp", addr); err != nil {
		t.Fatal(err)
	}
	if px, err = startGRPCProxy("http://"+upstream.Addr(), ln); err != nil {
		t.Fatal(err)
	}
	if err := behind.waitRevision(last, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	relisted := behind.relists() - relists0
	lists := float64(upstream.Down.Load()-u1) / float64(dataBytes)
	t.Logf("after the proxy restart with a compaction: %d relists, etcd sent the proxy %.2f data sets", relisted, lists)
	if relisted < m {
		t.Errorf("%d relists of %d watchers after the compaction, want each to relist", relisted, m)
	}
	for i, wt := range behind.ws {
		if n := wt.Status().Relists; n == each0[i] {
			t.Errorf("watcher %d did not relist after the compaction", i)
		}
	}
	// How much of it the proxy's cache served depends on timing: make bench-scale reports it.
	t.Logf("the proxy's cache: %.2f data sets from etcd for %d relists (fewer than %d when it served most)", lists, relisted, m/2)

	// The registration went through the proxy and outlived its restart.
	resp, err := cli.Get(ctx, calicotest.PeerKey(blockwatch.DefaultHostsPrefix, "proxied", peer))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) != 1 || resp.Kvs[0].Lease == 0 || !reg.Up() {
		t.Errorf("registration through the proxy: %v (up %v)", resp.Kvs, reg.Up())
	}
	ttl, err := cli.TimeToLive(ctx, clientv3.LeaseID(resp.Kvs[0].Lease))
	if err != nil || ttl.TTL <= 0 {
		t.Errorf("registration lease after the proxy restart: %+v, %v", ttl, err)
	}
}
