package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/blockwatch"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/calicotest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/etcdtest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// explainLab writes a small cluster into etcd: this node node-a (owner of 10.244.0.0/26), node-b
// (10.244.1.0/26, in which node-c borrowed 10.244.1.3), node-c (10.244.4.0/26), node-d unregistered
// (10.244.2.0/26), a malformed block 10.244.3.0/26, and a disabled pool 10.250.0.0/16 with a block of
// node-b. VPP holds the routes node-a's agent would program, except the one to 10.244.4.0/26 (deleted
// behind the agent's back).
func explainLab(t *testing.T, ctx context.Context) (endpoint string, vpp *vpptest.VPP) {
	t.Helper()
	srv, cli := etcdtest.Start(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(calicotest.PutPool(ctx, cli, calico.IPPool{Name: "default", CIDR: netip.MustParsePrefix("10.244.0.0/16"), BlockSize: 26,
		VXLANMode: calico.EncapCrossSubnet, IPIPMode: calico.EncapNever}))
	// The Calico Nodes put the nodes in one subnet: the VXLAN CrossSubnet pool's routes are flat.
	for node, ip := range map[string]string{"node-a": "192.0.2.1", "node-b": "192.0.2.2", "node-c": "192.0.2.3"} {
		_, err := cli.Put(ctx, calico.NodeKey(node),
			`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"`+node+`"},"spec":{"bgp":{"ipv4Address":"`+ip+`/24"}}}`)
		must(err)
	}
	must(calicotest.PutPool(ctx, cli, calico.IPPool{Name: "v6", CIDR: netip.MustParsePrefix("fd00:10:244::/48"), BlockSize: 122}))
	must(calicotest.PutPeer(ctx, cli, blockwatch.DefaultHostsPrefix, "node-b", netip.MustParseAddr("fd00:100::2")))
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(netip.MustParsePrefix("fd00:10:244::/122"), "node-b", 6)))
	must(calicotest.PutPool(ctx, cli, calico.IPPool{Name: "old", CIDR: netip.MustParsePrefix("10.250.0.0/16"), BlockSize: 26, Disabled: true}))
	for node, ip := range map[string]string{"node-a": "192.0.2.1", "node-b": "192.0.2.2", "node-c": "192.0.2.3"} {
		must(calicotest.PutPeer(ctx, cli, blockwatch.DefaultHostsPrefix, node, netip.MustParseAddr(ip)))
	}
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(netip.MustParsePrefix("10.244.0.0/26"), "node-a", 0)))
	b := calicotest.Block(netip.MustParsePrefix("10.244.1.0/26"), "node-b", 1)
	if ord := calicotest.Allocate(b, "h-borrowed", calicotest.PodAttrs("node-c", "shop", "cart-0", time.Unix(1700000000, 0))); ord != 3 {
		t.Fatalf("borrowed ordinal %d, want 3", ord)
	}
	must(calicotest.PutBlock(ctx, cli, b))
	h := calico.NewHandle()
	h.Add(b.CIDR, 1)
	hv, err := calico.EncodeHandle(h)
	must(err)
	_, err = cli.Put(ctx, calico.HandleKey("h-borrowed"), string(hv))
	must(err)
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(netip.MustParsePrefix("10.244.2.0/26"), "node-d", 2)))
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(netip.MustParsePrefix("10.244.4.0/26"), "node-c", 4)))
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(netip.MustParsePrefix("10.250.0.0/26"), "node-b", 5)))
	_, err = cli.Put(ctx, calico.BlockKey(netip.MustParsePrefix("10.244.3.0/26")), `{"cidr":"10.244.3.0/26",`)
	must(err)

	vpp = vpptest.New(t, vpptest.Options{})
	vpp.AddRoute(vppsim.Route{Prefix: netip.MustParsePrefix("10.244.1.0/26"), Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.0.2.2"), SwIfIndex: 1}}})
	vpp.AddRoute(vppsim.Route{Prefix: netip.MustParsePrefix("10.244.1.3/32"), Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.0.2.3"), SwIfIndex: 1}}})
	vpp.AddRoute(vppsim.Route{Prefix: netip.MustParsePrefix("fd00:10:244::/122"), Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("fd00:100::2"), SwIfIndex: 1}}})
	return srv.Endpoint(), vpp
}

// TestExplain: for each kind of address the explain subcommand gives the block, allocation, route of
// this node (the agent's own View) and VPP's verdict, and exits with the documented error.
func TestExplain(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	endpoint, vpp := explainLab(t, ctx)
	type want struct {
		block      string // "" = no block
		allocated  bool
		borrowed   bool
		handleN    int // 0 = no count
		forwarding string
		local      bool
		why        string
		verdict    agent.Verdict
		err        error
		extra      func(t *testing.T, x explanation)
	}
	for _, tc := range []struct {
		name, query string
		want        want
	}{
		{"remote block", "10.244.1.2", want{block: "10.244.1.0/26", allocated: true, forwarding: "10.244.1.0/26 via 192.0.2.2 node-b block", verdict: agent.VerdictAgrees,
			extra: func(t *testing.T, x explanation) {
				if x.Allocation.Node != "node-b" || x.Allocation.Attributes["pod"] != "web-1-1" || x.Allocation.Handle == nil {
					t.Errorf("allocation %+v", x.Allocation)
				}
				if len(x.Pools) != 1 || x.Pools[0].Encap != "vxlan" || !x.Pools[0].Managed || x.Pools[0].BlocksClaimed != 5 || x.Pools[0].BlocksPossible != 1024 {
					t.Errorf("pools %+v", x.Pools)
				}
				if x.Block.Owner != "node-b" || x.Block.Allocated != 4 || x.Block.Free != 60 {
					t.Errorf("block %+v", x.Block)
				}
				groupOf(t, x, "node-b", true, "its own block 10.244.1.0/26")
			}}},
		{"borrowed", "10.244.1.3", want{block: "10.244.1.0/26", allocated: true, borrowed: true, handleN: 1,
			forwarding: "10.244.1.3/32 via 192.0.2.3 node-c borrowed", verdict: agent.VerdictAgrees,
			extra: func(t *testing.T, x explanation) {
				groupOf(t, x, "node-c", true, "its own pod's address, borrowed from block 10.244.1.0/26")
				g := groupOf(t, x, "node-b", false, "")
				if g.Forwarding == nil || g.Forwarding.NextHop != netip.MustParseAddr("192.0.2.3") {
					t.Errorf("node-b should route the borrowed address to node-c: %+v", g)
				}
			}}},
		{"own block", "10.244.0.2", want{block: "10.244.0.0/26", allocated: true, local: true, why: "its own block", verdict: agent.VerdictNotJudged}},
		{"free address", "10.244.1.40", want{block: "10.244.1.0/26", forwarding: "10.244.1.0/26 via 192.0.2.2 node-b block", verdict: agent.VerdictAgrees}},
		{"unregistered owner", "10.244.2.1", want{block: "10.244.2.0/26", allocated: true,
			why: `node "node-d" has no registered IPv4 peer IP`, verdict: agent.VerdictNotJudged}},
		{"held block", "10.244.3.1", want{block: "10.244.3.0/26", why: "is held", verdict: agent.VerdictNotJudged,
			extra: func(t *testing.T, x explanation) {
				if x.Block.Held == nil || !strings.Contains(x.Block.Held.Reason, "decode block") || x.Allocation != nil {
					t.Errorf("block %+v allocation %+v", x.Block, x.Allocation)
				}
			}}},
		{"outside every pool", "10.99.0.1", want{why: "outside every managed IP pool", verdict: agent.VerdictAgrees,
			extra: func(t *testing.T, x explanation) {
				if len(x.Pools) != 0 {
					t.Errorf("pools %+v", x.Pools)
				}
			}}},
		{"pool not managed", "10.250.0.2", want{block: "10.250.0.0/26", allocated: true, why: "outside the managed pools", verdict: agent.VerdictAgrees,
			extra: func(t *testing.T, x explanation) {
				if len(x.Pools) != 1 || x.Pools[0].Managed || !x.Pools[0].Disabled {
					t.Errorf("pools %+v", x.Pools)
				}
			}}},
		{"FIB disagrees", "10.244.4.1", want{block: "10.244.4.0/26", allocated: true, forwarding: "10.244.4.0/26 via 192.0.2.3 node-c block",
			verdict: agent.VerdictDisagrees, err: errDisagrees,
			extra: func(t *testing.T, x explanation) {
				if !strings.Contains(x.VPP.Detail, "deleted behind the agent's back") || x.VPP.Lookup.Prefix != "0.0.0.0/0" {
					t.Errorf("vpp %+v", x.VPP)
				}
			}}},
		{"IPv6", "fd00:10:244::2", want{block: "fd00:10:244::/122", allocated: true, forwarding: "fd00:10:244::/122 via fd00:100::2 node-b block", verdict: agent.VerdictAgrees,
			extra: func(t *testing.T, x explanation) {
				if x.Allocation.Attributes["pod"] == "" || x.Block.Allocated != 3 {
					t.Errorf("block %+v allocation %+v", x.Block, x.Allocation)
				}
			}}},
		{"prefix", "10.244.1.0/26", want{block: "10.244.1.0/26", forwarding: "10.244.1.0/26 via 192.0.2.2 node-b block", verdict: agent.VerdictAgrees,
			extra: func(t *testing.T, x explanation) {
				if x.Address != nil || x.Allocation != nil || len(x.ThisNode.Routes) != 2 {
					t.Errorf("address %v allocation %+v routes %+v", x.Address, x.Allocation, x.ThisNode.Routes)
				}
			}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			args := []string{"explain", "--etcd-endpoints", endpoint, "--nodename", "node-a", "--vpp-api-socket", vpp.Socket(),
				"--vpp-reply-timeout", "10s", "--output", "json", tc.query}
			err := run(ctx, args, &out, &bytes.Buffer{}, env(nil))
			if !errors.Is(err, tc.want.err) || (tc.want.err == nil && err != nil) {
				t.Fatalf("explain %s: %v, want %v\n%s", tc.query, err, tc.want.err, out.String())
			}
			var x explanation
			if err := json.Unmarshal(out.Bytes(), &x); err != nil {
				t.Fatalf("%v\n%s", err, out.String())
			}
			w := tc.want
			switch {
			case w.block == "" && x.Block != nil, w.block != "" && (x.Block == nil || x.Block.CIDR != w.block):
				t.Errorf("block %+v, want %q", x.Block, w.block)
			}
			if w.block != "" && x.Block.Held == nil && strings.Contains(tc.query, "/") == false {
				a := x.Allocation
				if a == nil || a.Allocated != w.allocated || a.Borrowed != w.borrowed {
					t.Errorf("allocation %+v, want allocated %v borrowed %v", a, w.allocated, w.borrowed)
				} else if w.handleN != 0 && (a.HandleAddresses == nil || *a.HandleAddresses != w.handleN) {
					t.Errorf("handle addresses %v, want %d", a.HandleAddresses, w.handleN)
				}
			}
			f := x.ThisNode.Forwarding
			switch {
			case w.forwarding == "" && f != nil:
				t.Errorf("this node forwards by %+v, want no route", f)
			case w.forwarding != "" && (f == nil || f.Prefix.String()+" via "+f.NextHop.String()+" "+f.Owner+" "+string(f.Kind) != w.forwarding):
				t.Errorf("this node forwards by %+v, want %s", f, w.forwarding)
			}
			if x.ThisNode.Local != w.local || !strings.Contains(x.ThisNode.Why, w.why) {
				t.Errorf("this node local %v why %q, want %v %q", x.ThisNode.Local, x.ThisNode.Why, w.local, w.why)
			}
			if x.VPP == nil || x.VPP.Verdict != w.verdict {
				t.Errorf("vpp %+v, want verdict %s", x.VPP, w.verdict)
			}
			if w.extra != nil {
				w.extra(t, x)
			}
		})
	}
}

// groupOf returns the route group of node, checking its Local and Why.
func groupOf(t *testing.T, x explanation, node string, local bool, why string) agent.RouteGroup {
	t.Helper()
	for _, g := range x.Routes {
		for _, n := range g.Nodes {
			if n == node {
				if g.Local != local || !strings.Contains(g.Why, why) {
					t.Errorf("%s: local %v why %q, want %v %q", node, g.Local, g.Why, local, why)
				}
				return g
			}
		}
	}
	t.Errorf("no route group has %s: %+v", node, x.Routes)
	return agent.RouteGroup{}
}

// TestExplainText: the default output has the documented headings and says what it found.
func TestExplainText(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	endpoint, vpp := explainLab(t, ctx)
	var out bytes.Buffer
	args := []string{"explain", "--etcd-endpoints", endpoint, "--nodename", "node-a", "--vpp-api-socket", vpp.Socket(), "10.244.1.3"}
	if err := run(ctx, args, &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{
		"Address 10.244.1.3\n", "\nPool\n  default 10.244.0.0/16: block size /26, enabled, managed by the agents\n",
		"ipipMode Never, vxlanMode CrossSubnet: encapsulation vxlan, cross-subnet only", "\nBlock\n  10.244.1.0/26: owner node node-b (affinity \"host:node-b\")",
		"\nAllocation\n  ordinal 3: allocated, handle h-borrowed (its record holds 1 address(es) in this block)",
		"BORROWED by node node-c from the block of node-b", "\nRoutes (every node: what it should have and why)\n",
		"10.244.1.3/32 via 192.0.2.3: address borrowed by node-c from block 10.244.1.0/26",
		"no route: its own pod's address", "\nThis node's VPP\n  table 0, ip_route_lookup 10.244.1.3/32: 10.244.1.3/32 via 192.0.2.3 sw_if_index 1",
		"AGREES: ",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}

// TestExplainRefuses: bad input is refused as bad usage (exit status 2), naming what was refused,
// before anything is read.
func TestExplainRefuses(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	if err := calicotest.PutPeer(ctx, cli, blockwatch.DefaultHostsPrefix, "node-a", netip.MustParseAddr("192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"not-an-address"}, `"not-an-address" is neither an IP address nor a prefix`},
		{[]string{"10.244.1.5/26"}, "10.244.1.5/26 has host bits set: give the address 10.244.1.5 or the prefix 10.244.1.0/26"},
		{[]string{"fe80::1%eth0"}, "an address with a zone"},
		{[]string{}, "explain takes one ADDRESS or PREFIX, got 0 arguments"},
		{[]string{"10.0.0.1", "10.0.0.2"}, "got 2 arguments"},
		{[]string{"--output", "yaml", "10.0.0.1"}, `--output: "yaml" is not text or json`},
		{[]string{"--nodename", "node-zz", "10.0.0.1"}, `node "node-zz" is not known in etcd`},
	} {
		args := append([]string{"explain", "--etcd-endpoints", srv.Endpoint(), "--nodename", "node-a", "--vpp-api-socket", ""}, tc.args...)
		var out bytes.Buffer
		err := run(ctx, args, &out, &bytes.Buffer{}, env(nil))
		if !isUsage(err) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("explain %v: %v, want a usage error with %q", tc.args, err, tc.want)
		}
		if out.Len() != 0 {
			t.Errorf("explain %v printed %q", tc.args, out.String())
		}
	}
}

// TestExplainVPPUnreachable: when this node's VPP cannot be asked, explain still prints what etcd says,
// with the error in the VPP section, and fails (exit status 1, not 3).
func TestExplainVPPUnreachable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	srv, cli := etcdtest.Start(t)
	if err := calicotest.PutPeer(ctx, cli, blockwatch.DefaultHostsPrefix, "node-a", netip.MustParseAddr("192.0.2.1")); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	args := []string{"explain", "--etcd-endpoints", srv.Endpoint(), "--nodename", "node-a", "--vpp-api-socket", t.TempDir() + "/api.sock",
		"--vpp-reply-timeout", "500ms", "--output", "json", "10.244.1.1"}
	err := run(ctx, args, &out, &bytes.Buffer{}, env(nil))
	if err == nil || isUsage(err) || errors.Is(err, errDisagrees) || !strings.Contains(err.Error(), "connect to VPP") {
		t.Fatalf("explain: %v, want a VPP connection error", err)
	}
	t.Log(err)
	var x explanation
	if err := json.Unmarshal(out.Bytes(), &x); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if x.VPP == nil || !strings.Contains(x.VPP.Error, "connect to VPP") || x.VPP.Lookup != nil || x.ThisNode.Why == "" {
		t.Errorf("vpp %+v this node %+v", x.VPP, x.ThisNode)
	}
}

// ipipLab writes a cluster whose pool "tunnelled" (10.245.0.0/16) has ipipMode CrossSubnet: this node
// node-a (uplink 192.0.2.1/24) reaches node-b (198.51.100.2, another subnet) through an IPIP tunnel and
// node-c (192.0.2.3, its own subnet) flat. VPP holds what node-a's agent programs: a tagged tunnel to
// 198.51.100.2 and the route to node-b's block through it (no next hop), node-c's block via 192.0.2.3;
// node-d's block (198.51.100.4) is routed flat, as an agent that missed the pool's mode would have it.
func ipipLab(t *testing.T, ctx context.Context) (endpoint string, vpp *vpptest.VPP, tunnel uint32) {
	t.Helper()
	srv, cli := etcdtest.Start(t)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	must(calicotest.PutPool(ctx, cli, calico.IPPool{Name: "tunnelled", CIDR: pfx("10.245.0.0/16"), BlockSize: 26,
		IPIPMode: calico.EncapCrossSubnet, VXLANMode: calico.EncapNever}))
	for node, ip := range map[string]string{"node-a": "192.0.2.1", "node-b": "198.51.100.2", "node-c": "192.0.2.3", "node-d": "198.51.100.4"} {
		must(calicotest.PutPeer(ctx, cli, blockwatch.DefaultHostsPrefix, node, addr(ip)))
	}
	_, err := cli.Put(ctx, calico.NodeKey("node-a"),
		`{"kind":"Node","apiVersion":"projectcalico.org/v3","metadata":{"name":"node-a"},"spec":{"bgp":{"ipv4Address":"192.0.2.1/24"}}}`)
	must(err)
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(pfx("10.245.0.0/26"), "node-a", 0)))
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(pfx("10.245.1.0/26"), "node-b", 1)))
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(pfx("10.245.2.0/26"), "node-c", 2)))
	must(calicotest.PutBlock(ctx, cli, calicotest.Block(pfx("10.245.3.0/26"), "node-d", 3)))

	vpp = vpptest.New(t, vpptest.Options{})
	c, uplink := vppClient(t, ctx, vpp, pfx("192.0.2.1/24"))
	tunnel, err = c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr("192.0.2.1"), Dst: addr("198.51.100.2"), Unnumbered: uplink, Tag: agent.TunnelTag})
	must(err)
	res := c.Apply(ctx, []vppapi.Route{
		{Prefix: pfx("10.245.1.0/26"), SwIfIndex: tunnel},
		{Prefix: pfx("10.245.2.0/26"), NextHop: addr("192.0.2.3"), SwIfIndex: uplink},
		{Prefix: pfx("10.245.3.0/26"), NextHop: addr("198.51.100.4"), SwIfIndex: uplink},
	}, nil)
	must(res.Err())
	return srv.Endpoint(), vpp, tunnel
}

// vppClient connects a vppapi.Client to vpp, as the agent's, until the test ends, and sets up the uplink
// with address a.
func vppClient(t *testing.T, ctx context.Context, vpp *vpptest.VPP, a netip.Prefix) (*vppapi.Client, uint32) {
	t.Helper()
	c, err := vppapi.New(vppapi.Config{Socket: vpp.Socket(), ReplyTimeout: 10 * time.Second, Registerer: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	cctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(cctx) }()
	t.Cleanup(func() { stop(); <-done })
	select {
	case ev := <-c.Events():
		if ev.Kind != vppapi.Connected {
			t.Fatalf("vppapi: %v %v", ev.Kind, ev.Err)
		}
	case <-ctx.Done():
		t.Fatal(ctx.Err())
	}
	uplink, err := c.SetupUplink(ctx, vppapi.Uplink{Name: vpp.Uplink(), Addresses: []netip.Prefix{a}})
	if err != nil {
		t.Fatal(err)
	}
	return c, uplink
}

// TestExplainIPIP: explain gives each route's encapsulation and why (the pool's mode, and for
// CrossSubnet the peer IP against this node's subnet), names this node's tunnel to the peer from VPP's
// dump, and judges VPP's answer: a route through the agent's tunnel to the right peer (a path with no
// next hop) agrees; a flat route where IPIP is due disagrees, saying so.
func TestExplainIPIP(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	endpoint, vpp, tunnel := ipipLab(t, ctx)
	explainJSON := func(query string) (explanation, error) {
		t.Helper()
		var out bytes.Buffer
		args := []string{"explain", "--etcd-endpoints", endpoint, "--nodename", "node-a", "--vpp-api-socket", vpp.Socket(),
			"--vpp-reply-timeout", "10s", "--output", "json", query}
		err := run(ctx, args, &out, &bytes.Buffer{}, env(nil))
		var x explanation
		if jerr := json.Unmarshal(out.Bytes(), &x); jerr != nil {
			t.Fatalf("%v\n%s", jerr, out.String())
		}
		t.Logf("%s:\n%s", query, out.String())
		return x, err
	}

	x, err := explainJSON("10.245.1.5")
	if err != nil {
		t.Fatalf("explain of a route through the agent's tunnel: %v (%+v)", err, x.VPP)
	}
	f := x.ThisNode.Forwarding
	if f == nil || f.Encap != calico.EncapIPIP || !strings.Contains(f.EncapWhy, "ipipMode CrossSubnet") ||
		!strings.Contains(f.EncapWhy, "198.51.100.2 is outside") || !strings.Contains(f.EncapWhy, "192.0.2.0/24") {
		t.Errorf("forwarding %+v, want ipip because 198.51.100.2 is outside 192.0.2.0/24", f)
	}
	if x.VPP.Verdict != agent.VerdictAgrees || !strings.Contains(x.VPP.Detail, "ipip0") {
		t.Errorf("vpp %+v, want agrees through ipip0", x.VPP)
	}
	if tun := x.VPP.Tunnel; tun == nil || tun.SwIfIndex != tunnel || tun.Name != "ipip0" || tun.Peer != netip.MustParseAddr("198.51.100.2") || !tun.Agent {
		t.Errorf("vpp tunnel %+v, want the agent's ipip0 (sw_if_index %d) to 198.51.100.2", x.VPP.Tunnel, tunnel)
	}
	if p := x.VPP.Lookup.Paths; len(p) != 1 || p[0].Tunnel == nil || *p[0].Tunnel != "ipip0" || p[0].NextHop != nil {
		t.Errorf("lookup paths %+v, want one through ipip0 with no next hop", p)
	}

	x, err = explainJSON("10.245.2.5")
	if err != nil || x.ThisNode.Forwarding == nil || x.ThisNode.Forwarding.Encap != calico.EncapNone ||
		!strings.Contains(x.ThisNode.Forwarding.EncapWhy, "192.0.2.3 is inside") || x.VPP.Verdict != agent.VerdictAgrees || x.VPP.Tunnel != nil {
		t.Errorf("same subnet: %v forwarding %+v vpp %+v, want flat, agreeing", err, x.ThisNode.Forwarding, x.VPP)
	}

	x, err = explainJSON("10.245.3.5")
	if !errors.Is(err, errDisagrees) || !strings.Contains(x.VPP.Detail, "flat") || !strings.Contains(x.VPP.Detail, "IPIP") {
		t.Errorf("flat where IPIP is due: %v %+v, want a disagreement saying it goes flat", err, x.VPP)
	}
	if x.VPP.Tunnel != nil || !strings.Contains(x.VPP.TunnelWhy, "has no ipip tunnel of the agent") {
		t.Errorf("vpp %+v, want no tunnel to 198.51.100.4", x.VPP)
	}

	var out bytes.Buffer
	args := []string{"explain", "--etcd-endpoints", endpoint, "--nodename", "node-a", "--vpp-api-socket", vpp.Socket(), "10.245.1.5"}
	if err := run(ctx, args, &out, &bytes.Buffer{}, env(nil)); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	for _, want := range []string{"10.245.1.0/26 via 198.51.100.2: block of node-b, encap ipip", "through ipip0 (sw_if_index",
		"AGREES: "} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("text lacks %q:\n%s", want, out.String())
		}
	}
	t.Log("\n" + out.String())
}
