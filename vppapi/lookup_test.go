package vppapi_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	"go.fd.io/govpp/api"
)

// TestLookupRoute: LookupRoute answers VPP's longest-prefix match (a route through a tunnel with no next
// hop, a flat one, the drop default route), NO_SUCH_FIB for a missing table and ErrNotConnected without
// a connection; on the simulator and on a real VPP.
func TestLookupRoute(t *testing.T) {
	_, h, uplink := tunnelSetup(t)
	ctx := ctxT(t)
	tun, err := h.c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr(nodeIP), Dst: addr("198.51.100.2"), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	res := h.c.Apply(ctx, []vppapi.Route{
		{Prefix: pfx("10.244.1.0/26"), SwIfIndex: tun},
		{Prefix: pfx("10.244.2.0/26"), NextHop: addr(peerIP), SwIfIndex: uplink},
	}, nil)
	if res.Err() != nil {
		t.Fatal(res.Err())
	}
	for _, tc := range []struct {
		query, prefix string
		paths         []vppapi.Path
	}{
		{"10.244.1.5/32", "10.244.1.0/26", []vppapi.Path{{SwIfIndex: tun}}},
		{"10.244.2.0/26", "10.244.2.0/26", []vppapi.Path{{NextHop: addr(peerIP), SwIfIndex: uplink}}},
		{"10.244.0.0/16", "0.0.0.0/0", []vppapi.Path{{SwIfIndex: ^uint32(0), Type: vppapi.PathDrop}}},
	} {
		e, err := h.c.LookupRoute(ctx, 0, pfx(tc.query))
		if err != nil || e.Prefix != pfx(tc.prefix) || !slices.Equal(e.Paths, tc.paths) {
			t.Errorf("LookupRoute %s = %v %v, %v; want %s %v", tc.query, e.Prefix, e.Paths, err, tc.prefix, tc.paths)
		}
	}
	if _, err := h.c.LookupRoute(ctx, 7, pfx("10.244.1.5/32")); !errors.Is(err, api.NO_SUCH_FIB) {
		t.Errorf("LookupRoute in a missing table: %v, want NO_SUCH_FIB", err)
	}
	c, err := vppapi.New(vppapi.Config{Socket: "/nonexistent/api.sock"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.LookupRoute(ctx, 0, pfx("10.244.1.5/32")); !errors.Is(err, vppapi.ErrNotConnected) {
		t.Errorf("LookupRoute not connected: %v", err)
	}
}
