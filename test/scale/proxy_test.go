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
// sync on an idle store; a proxy restart with a compaction in between makes every watcher relist, and
// the proxy serves most of those lists from its cache; the registration's lease outlives the restart.
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
	dataBytes := dataSetBytes(ctx, t, cli)

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

	const probe = 200 * time.Millisecond
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
	time.Sleep(4 * probe)
	for i, wt := range behind.ws {
		if st := wt.Status(); !st.Synced {
			t.Errorf("watcher %d behind the proxy not in sync on an idle store: %+v", i, st)
		}
	}

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
	if relisted != m {
		t.Errorf("%d of %d watchers relisted after the compaction", relisted, m)
	}
	if lists > m/2 {
		t.Errorf("etcd sent the proxy %.2f data sets for %d relists: the proxy's cache did not serve them", lists, m)
	}

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
