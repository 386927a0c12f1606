package vppapi_test

import (
	"context"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptopo"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// TestIPIPDataPlane: two lab VPPs in different subnets behind a router that knows no pod block; with a
// p2p IPIP tunnel each way (EnsureIPIPTunnel: unnumbered to the memif uplink, admin up) and the peer's
// block routed through it without a next hop, pods ping each other; without the tunnel routes they do
// not. Needs VPP_TEST_BACKEND=real and VPP_LAB_PKG (make test-vpp); skipped otherwise.
func TestIPIPDataPlane(t *testing.T) {
	bin, err := vpptopo.FindLab()
	switch {
	case !vpptest.Real():
		t.Skip("needs real VPP: " + vpptest.EnvBackend + "=real and " + vpptopo.EnvLabPackage)
	case errors.Is(err, vpptopo.ErrNoLab):
		t.Skip(err.Error())
	case err != nil:
		t.Fatal(err) // VPP_LAB_PKG names something that is no lab build
	}
	dir, err := os.MkdirTemp("", "tp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	topo, err := vpptopo.Start(ctx, bin, vpptopo.Config{Kind: vpptopo.Routed, Nodes: 2, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(topo.Stop)
	a, b := topo.Nodes[0], topo.Nodes[1]
	if a.Addr4.Masked() == b.Addr4.Masked() {
		t.Fatalf("nodes share a subnet: %v %v", a.Addr4, b.Addr4)
	}

	type side struct {
		node   *vpptopo.Node
		c      *vppapi.Client
		routes []vppapi.Route
	}
	sides := []*side{{node: a}, {node: b}}
	for i, s := range sides {
		h := start(t, s.node.VPP.Socket(), func(c *vppapi.Config) { c.ReplyTimeout = vppapi.DefaultReplyTimeout })
		h.expect(vppapi.Connected)
		s.c = h.c
		peer := sides[1-i].node
		uplink, err := s.c.LookupUplink(ctx, vppapi.Uplink{Name: vpptopo.UplinkInterface})
		if err != nil {
			t.Fatal(err)
		}
		tun, err := s.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: s.node.Addr4.Addr(), Dst: peer.Addr4.Addr(), Unnumbered: uplink, MTU: 1480})
		if err != nil {
			t.Fatal(err)
		}
		s.routes = []vppapi.Route{{Prefix: peer.Block4, SwIfIndex: tun}}
	}

	ping := func(from, to *vpptopo.Node, want bool) {
		t.Helper()
		rounds := 5
		if !want {
			rounds = 1
		}
		results, ok, err := vpptopo.PingUntil(ctx, from.VPP, vpptopo.PodInterface, to.Pod4, 3, 2, rounds)
		switch {
		case err != nil:
			t.Fatal(err)
		case want && !ok:
			t.Errorf("%s -> %s pod %v: %v, want replies", from.Name, to.Name, to.Pod4, results)
		case !want && results[len(results)-1].Received > 0:
			t.Errorf("%s -> %s pod %v without tunnel routes: %v, want none", from.Name, to.Name, to.Pod4, results)
		}
	}
	ping(a, b, false) // the tunnels alone route nothing

	for _, s := range sides {
		if res := s.c.Apply(ctx, s.routes, nil); res.Err() != nil {
			t.Fatal(res.Err())
		}
	}
	ping(a, b, true)
	ping(b, a, true)

	for _, s := range sides {
		if res := s.c.Apply(ctx, nil, s.routes); res.Err() != nil {
			t.Fatal(res.Err())
		}
	}
	ping(a, b, false)
}
