package agent_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdconfig"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/metricstest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"
)

const (
	uplinkName  = "GigabitEthernet0/8/0"
	uplink2Name = "GigabitEthernet0/9/0"
	hosts       = blockwatch.DefaultHostsPrefix
)

var (
	poolV4 = netip.MustParsePrefix("10.244.0.0/16")
	poolV6 = netip.MustParsePrefix("fd00:10:244::/48")
)

// cluster is a test cluster: one embedded etcd, and per node a VPP simulator and an agent wired as the
// daemon wires them (vppapi client, blockwatch watcher, registrar, reconciler), over real sockets.
type cluster struct {
	t     *testing.T
	etcd  *etcdtest.Server  // single-member clusters
	ecl   *etcdtest.Cluster // multi-member clusters (clusterOpts.members > 1)
	cli   *clientv3.Client
	dir   string
	nodes map[string]*node
	opts  clusterOpts
}

type clusterOpts struct {
	resync time.Duration
	grace  time.Duration
	pools  []netip.Prefix // nil: IPPools from etcd
	// members > 1 runs a real etcd cluster; the agents reach it through the members' proxies, the
	// test's own client directly.
	members int
	// quota is the single etcd's QuotaBackendBytes (0: etcd's default).
	quota int64
	// probe is the watch's progress-probe interval; 0 means 500ms, -1 the daemon's default.
	probe time.Duration
	// sim, if set, adjusts each node's simulator (faults of VPP at start, an older VPP's message table).
	sim func(*vppsim.Config)
	// twoUplinks gives every node a second uplink (uplink2Name, sw_if_index 2) on the subnets of
	// peer2V4 and peer2V6, registered as the node's peerip/<family>/2.
	twoUplinks bool
	// bfd is every node's BFD configuration (registered on its uplink addresses when Enabled), except
	// the nodes in noBFD, which run without.
	bfd   agent.BFDConfig
	noBFD []string
}

type node struct {
	name   string
	index  int
	sim    *vppsim.Sim
	sock   string
	peerV4 netip.Addr
	peerV6 netip.Addr
	// peer2V4 and peer2V6 are the second uplink's addresses (clusterOpts.twoUplinks).
	peer2V4 netip.Addr
	peer2V6 netip.Addr

	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan error
	agent  *agent.Agent
	reg    *prometheus.Registry // the metrics of the running agent
	logs   *logBuffer           // its log lines, every level
	// as overrides the node name the agent runs as (a second agent for one name); peer IPs stay n's.
	as string
}

func newCluster(t *testing.T, opts clusterOpts, names ...string) *cluster {
	t.Helper()
	var srv *etcdtest.Server
	var ecl *etcdtest.Cluster
	var cli *clientv3.Client
	if opts.members > 1 {
		ecl = etcdtest.StartCluster(t, opts.members)
		var err error
		if cli, err = clientv3.New(clientv3.Config{Endpoints: ecl.DirectEndpoints(), DialTimeout: 2 * time.Second, Logger: zap.NewNop()}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cli.Close() })
	} else {
		srv, cli = etcdtest.StartWith(t, etcdtest.Options{QuotaBackendBytes: opts.quota})
	}
	dir, err := os.MkdirTemp("", "ag")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if opts.resync == 0 {
		opts.resync = time.Hour // incremental updates must work without the periodic resync
	}
	if opts.grace == 0 {
		opts.grace = 200 * time.Millisecond
	}
	c := &cluster{t: t, etcd: srv, ecl: ecl, cli: cli, dir: dir, nodes: map[string]*node{}, opts: opts}
	c.putPool("default-ipv4-ippool", poolV4, 26)
	c.putPool("default-ipv6-ippool", poolV6, 122)
	for i, name := range names {
		n := &node{name: name, index: i + 1,
			peerV4: netip.AddrFrom4([4]byte{192, 168, 100, byte(i + 1)}),
			peerV6: netip.MustParseAddr(fmt.Sprintf("fd00:100::%d", i+1)),
			sock:   filepath.Join(dir, name+".sock")}
		cfg := vppsim.Config{Interfaces: []string{uplinkName}}
		if opts.twoUplinks {
			n.peer2V4 = netip.AddrFrom4([4]byte{192, 168, 101, byte(i + 1)})
			n.peer2V6 = netip.MustParseAddr(fmt.Sprintf("fd00:101::%d", i+1))
			cfg.Interfaces = append(cfg.Interfaces, uplink2Name)
		}
		if opts.sim != nil {
			opts.sim(&cfg)
		}
		sim, err := vppsim.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := sim.Listen(n.sock); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sim.Close() })
		n.sim = sim
		c.nodes[name] = n
		c.start(name)
	}
	t.Cleanup(func() {
		for name := range c.nodes {
			c.stop(name)
		}
	})
	return c
}

func (c *cluster) ctx() context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	c.t.Cleanup(cancel)
	return ctx
}

// start runs node name's agent stack until stop.
func (c *cluster) start(name string) {
	c.t.Helper()
	n := c.nodes[name]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel != nil {
		return
	}
	logs := &logBuffer{}
	log := slog.New(teeHandler{slog.NewTextHandler(testWriter{c.t}, &slog.HandlerOptions{Level: slog.LevelWarn}),
		slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})}).With("node", name)
	reg := prometheus.NewRegistry()
	// The agents' etcd client is the daemon's: etcdconfig's settings, and its guard against frozen
	// members (which does nothing with one endpoint).
	ecfg := etcdconfig.Config{DialTimeout: 2 * time.Second, RequestTimeout: 2 * time.Second}
	if c.ecl != nil {
		ecfg.Endpoints = c.ecl.Endpoints()
	} else {
		ecfg.Endpoints = []string{c.etcd.Endpoint()}
	}
	cli, err := ecfg.Client()
	if err != nil {
		c.t.Fatal(err)
	}
	vpp, err := vppapi.New(vppapi.Config{Socket: n.sock, ReplyTimeout: time.Second, ReconnectDelay: 50 * time.Millisecond, Logger: log, Registerer: reg})
	if err != nil {
		c.t.Fatal(err)
	}
	probe := c.opts.probe
	switch probe {
	case 0:
		probe = 500 * time.Millisecond
	case -1:
		probe = 0
	}
	w, err := blockwatch.New(blockwatch.Config{Client: cli, LegacyHostAffinity: true, RequestTimeout: 2 * time.Second, ProbeInterval: probe,
		Logger: log, Registerer: reg})
	if err != nil {
		c.t.Fatal(err)
	}
	as := name
	if n.as != "" {
		as = n.as
	}
	m := agent.NewMetrics(reg)
	guard := etcdconfig.NewGuard(&ecfg, cli, log)
	peerIPs := []netip.Addr{n.peerV4, n.peerV6}
	var more []vppapi.Uplink
	if c.opts.twoUplinks {
		peerIPs = append(peerIPs, n.peer2V4, n.peer2V6)
		more = []vppapi.Uplink{{Name: uplink2Name, Addresses: []netip.Prefix{netip.PrefixFrom(n.peer2V4, 24), netip.PrefixFrom(n.peer2V6, 64)}}}
	}
	bfdCfg := c.opts.bfd
	if slices.Contains(c.opts.noBFD, name) {
		bfdCfg = agent.BFDConfig{}
	}
	var bfdIPs []netip.Addr
	if bfdCfg.Enabled {
		bfdIPs = peerIPs
	}
	registrar, err := agent.NewRegistrar(agent.RegistrarConfig{Client: cli, HostsPrefix: hosts, NodeName: as,
		PeerIPs: peerIPs, BFDPeerIPs: bfdIPs, TTL: 5 * time.Second, RequestTimeout: 2 * time.Second, Logger: log, Metrics: m})
	if err != nil {
		c.t.Fatal(err)
	}
	a, err := agent.New(agent.Config{NodeName: as, Pools: c.opts.pools,
		Uplink:         vppapi.Uplink{Name: uplinkName, Addresses: []netip.Prefix{netip.PrefixFrom(n.peerV4, 24), netip.PrefixFrom(n.peerV6, 64)}},
		MoreUplinks:    more,
		ResyncInterval: c.opts.resync, PeerLossGrace: c.opts.grace, Logger: log, EtcdHealth: guard, BFD: bfdCfg}, vpp, w, registrar, m)
	if err != nil {
		c.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return vpp.Run(gctx) })
	g.Go(func() error { return w.Run(gctx) })
	g.Go(func() error { return registrar.Run(gctx) })
	g.Go(func() error { return a.Run(gctx) })
	g.Go(func() error { return guard.Run(gctx) })
	done := make(chan error, 1)
	go func() { done <- g.Wait(); cli.Close() }()
	n.cancel, n.done, n.agent, n.reg, n.logs = cancel, done, a, reg, logs
}

// metric returns the value of node name's metric (summed over the series matching the label pairs).
func (c *cluster) metric(name, metric string, labelPairs ...string) float64 {
	c.t.Helper()
	n := c.nodes[name]
	n.mu.Lock()
	reg := n.reg
	n.mu.Unlock()
	return metricstest.Value(c.t, reg, metric, labelPairs...)
}

// logBuffer keeps log lines for tests to count.
type logBuffer struct {
	mu    sync.Mutex
	lines []string
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lines = append(b.lines, strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// count returns how many lines contain s.
func (b *logBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for _, l := range b.lines {
		if strings.Contains(l, s) {
			n++
		}
	}
	return n
}

// teeHandler sends each record to two handlers.
type teeHandler struct{ a, b slog.Handler }

func (h teeHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return h.a.Enabled(ctx, l) || h.b.Enabled(ctx, l)
}

func (h teeHandler) Handle(ctx context.Context, r slog.Record) error {
	var errs []error
	for _, x := range []slog.Handler{h.a, h.b} {
		if x.Enabled(ctx, r.Level) {
			errs = append(errs, x.Handle(ctx, r.Clone()))
		}
	}
	return errors.Join(errs...)
}

func (h teeHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return teeHandler{h.a.WithAttrs(as), h.b.WithAttrs(as)}
}

func (h teeHandler) WithGroup(g string) slog.Handler {
	return teeHandler{h.a.WithGroup(g), h.b.WithGroup(g)}
}

// stop stops node name's agent (a normal exit: routes and registration stay).
func (c *cluster) stop(name string) {
	n := c.nodes[name]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cancel == nil {
		return
	}
	n.cancel()
	select {
	case err := <-n.done:
		if err != nil {
			c.t.Errorf("agent %s: %v", name, err)
		}
	case <-time.After(10 * time.Second):
		c.t.Errorf("agent %s did not stop within 10s", name)
	}
	n.cancel, n.agent = nil, nil
}

func (c *cluster) putPool(name string, cidr netip.Prefix, blockSize int) {
	c.t.Helper()
	if err := calicotest.PutPool(c.ctx(), c.cli, calico.IPPool{Name: name, CIDR: cidr, BlockSize: blockSize}); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) put(k, v string) {
	c.t.Helper()
	if _, err := c.cli.Put(c.ctx(), k, v); err != nil {
		c.t.Fatal(err)
	}
}

func (c *cluster) del(k string) {
	c.t.Helper()
	if _, err := c.cli.Delete(c.ctx(), k); err != nil {
		c.t.Fatal(err)
	}
}

// putBlock writes a Calico block owned by owner, with the given ordinals allocated to pods on nodes
// (borrowed when the node differs from the owner).
func (c *cluster) putBlock(cidr string, owner string, podNodes map[int]string) {
	c.t.Helper()
	p := netip.MustParsePrefix(cidr)
	aff := ""
	if owner != "" {
		aff = "host:" + owner
	}
	b := calico.NewBlock(p, aff, 1)
	for _, ord := range slices.Sorted(mapsKeys(podNodes)) {
		h := fmt.Sprintf("k8s-pod-network.c%d", ord)
		b.Attributes = append(b.Attributes, calico.AllocationAttribute{HandleID: &h,
			Secondary: map[string]string{"node": podNodes[ord], "namespace": "default", "pod": fmt.Sprintf("p%d", ord)}})
		idx := len(b.Attributes) - 1
		b.Allocations[ord] = &idx
		b.Unallocated = slices.DeleteFunc(b.Unallocated, func(o int) bool { return o == ord })
		b.SequenceNumberForAllocation[fmt.Sprint(ord)] = b.SequenceNumber
		b.SequenceNumber++
	}
	if err := b.Validate(); err != nil {
		c.t.Fatal(err)
	}
	v, err := calico.EncodeBlock(b)
	if err != nil {
		c.t.Fatal(err)
	}
	c.put(calico.BlockKey(p), string(v))
}

func mapsKeys(m map[int]string) func(func(int) bool) {
	return func(yield func(int) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// fib returns node name's API routes in table 0 inside the pools, as "prefix via nh" strings, sorted.
func (c *cluster) fib(name string) []string {
	var out []string
	for _, r := range c.nodes[name].sim.APIRoutes(0) {
		if !poolV4.Contains(r.Prefix.Addr()) && !poolV6.Contains(r.Prefix.Addr()) {
			continue
		}
		var nhs []string
		for _, p := range r.Paths {
			nhs = append(nhs, fmt.Sprintf("%s@%d", p.NextHop, p.SwIfIndex))
		}
		out = append(out, fmt.Sprintf("%s via %s", r.Prefix, strings.Join(nhs, ",")))
	}
	slices.Sort(out)
	return out
}

// want formats expected routes of node name: prefix -> node whose peer IP is the next hop.
func (c *cluster) want(routes map[string]string) []string {
	var out []string
	for p, via := range routes {
		n := c.nodes[via]
		nh := n.peerV4
		if netip.MustParsePrefix(p).Addr().Is6() {
			nh = n.peerV6
		}
		out = append(out, fmt.Sprintf("%s via %s@1", p, nh))
	}
	slices.Sort(out)
	return out
}

// eventually waits until node name's FIB equals want.
func (c *cluster) eventually(name string, want []string, within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := c.fib(name)
		if slices.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("node %s FIB after %s:\n got %q\nwant %q", name, within, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// converged waits until every node's FIB equals what Desired computes from etcd for it.
func (c *cluster) converged(within time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for {
		snap := c.snapshot()
		bad := ""
		for name := range c.nodes {
			routes, _ := agent.Desired(snap, agent.Options{NodeName: name, Pools: c.opts.pools})
			want := make([]string, 0, len(routes))
			for _, r := range routes {
				want = append(want, fmt.Sprintf("%s via %s@1", r.Prefix, r.NextHop))
			}
			slices.Sort(want)
			got := slices.DeleteFunc(c.fib(name), func(r string) bool { return !strings.HasSuffix(r, "@1") }) // owned only
			if !slices.Equal(got, want) {
				bad = fmt.Sprintf("node %s:\n got %q\nwant %q", name, got, want)
				break
			}
		}
		if bad == "" {
			return
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("not converged after %s: %s", within, bad)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// snapshot lists etcd once, as the routes subcommand does.
func (c *cluster) snapshot() *blockwatch.Snapshot {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := blockwatch.List(ctx, blockwatch.Config{Client: c.cli, LegacyHostAffinity: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		c.t.Fatal(err)
	}
	return s
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// waitFor polls cond until it holds, failing the test with what after within.
func (c *cluster) waitFor(what string, within time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: not within %s", what, within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// debug returns node name's /debug/routes view.
func (c *cluster) debug(name string) agent.Debug {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d, err := c.nodes[name].agent.DebugRoutes(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	return d
}
