package vppapi_test

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// TestDumpAPIRoutesLeavesVPPOwn: VPP's recursive-resolution and adjacency /32s look like routes via the
// uplink in ip_route_dump, and an API delete does not remove them; DumpAPIRoutes leaves them out.
func TestDumpAPIRoutesLeavesVPPOwn(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	if !h.c.Status().RouteSource {
		t.Fatal("Status().RouteSource is false: VPP 26.06 has ip_route_v2_dump")
	}
	ctx := ctxT(t)
	idx, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("192.168.100.1/24")}})
	if err != nil {
		t.Fatal(err)
	}
	block := vppapi.Route{Prefix: pfx("10.244.1.64/26"), NextHop: addr("192.168.100.3"), SwIfIndex: idx}
	if res := h.c.Apply(ctx, []vppapi.Route{block}, nil); res.Err() != nil {
		t.Fatal(res.Err())
	}
	v.AddRecursiveRoute(pfx("10.99.0.0/24"), addr("10.244.1.70")) // another client's
	v.ResolveNeighbor(addr("192.168.100.3"))

	all, err := h.c.DumpRoutes(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	viaUplink := func(p string) bool {
		return slices.ContainsFunc(all, func(e vppapi.FIBEntry) bool {
			return e.Prefix == pfx(p) && len(e.Paths) == 1 && e.Paths[0].SwIfIndex == idx && e.Paths[0].NextHop == addr("192.168.100.3")
		})
	}
	for _, p := range []string{"10.244.1.70/32", "192.168.100.3/32"} {
		if !viaUplink(p) {
			t.Errorf("ip_route_dump: %s via 192.168.100.3 on the uplink missing: %v", p, all)
		}
	}
	// An API delete of VPP's own entries is accepted and changes nothing.
	res := h.c.Apply(ctx, nil, []vppapi.Route{{Prefix: pfx("10.244.1.70/32")}, {Prefix: pfx("192.168.100.3/32")}})
	if res.Err() != nil || res.Deleted != 2 {
		t.Errorf("delete VPP's own /32s: %+v", res)
	}
	if all, err = h.c.DumpRoutes(ctx, 0); err != nil || !viaUplink("10.244.1.70/32") || !viaUplink("192.168.100.3/32") {
		t.Errorf("VPP's own /32s gone after an API delete (%v): %v", err, all)
	}

	own, err := h.c.DumpAPIRoutes(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []netip.Prefix
	for _, e := range own {
		got = append(got, e.Prefix)
	}
	slices.SortFunc(got, func(a, b netip.Prefix) int { return a.Addr().Compare(b.Addr()) })
	if want := []netip.Prefix{pfx("10.99.0.0/24"), block.Prefix}; !slices.Equal(got, want) {
		t.Errorf("DumpAPIRoutes = %v, want %v (API routes only)", got, want)
	}
}

// TestSetupUplinkLate: an uplink created by VPP's startup-config does not exist for 2 s after VPP
// starts; SetupUplink says so with ErrNoInterface, and works once it appears. The first call is
// asserted to fail where the test decides when the uplink appears (the simulator); against a real VPP
// it may come after the startup-config ran.
func TestSetupUplinkLate(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{Uplink: uplinkName, LateUplink: true})
	h := start(t, v.Socket(), nil)
	h.expect(vppapi.Connected)
	ctx := ctxT(t)
	u := vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("192.168.100.1/24")}}
	_, err := h.c.SetupUplink(ctx, u)
	switch {
	case errors.Is(err, vppapi.ErrNoInterface):
	case v.UplinkGated():
		t.Fatalf("SetupUplink before the uplink exists: %v, want ErrNoInterface", err)
	case err != nil:
		t.Fatalf("SetupUplink: %v, want ErrNoInterface or success", err)
	default:
		t.Log("the real VPP's uplink existed already at the first SetupUplink")
	}
	v.ReleaseUplink()
	v.WaitUplink(30 * time.Second)
	if idx, err := h.c.SetupUplink(ctx, u); err != nil || idx != 1 {
		t.Fatalf("SetupUplink once it exists: %d, %v", idx, err)
	}
}
