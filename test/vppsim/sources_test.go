package vppsim

import (
	"net/netip"
	"slices"
	"testing"
	"time"

	"go.fd.io/govpp/api"
	interfaces "go.fd.io/govpp/binapi/interface"
	"go.fd.io/govpp/binapi/interface_types"
	"go.fd.io/govpp/binapi/ip"
)

// dumpV2 dumps table 0 with ip_route_v2_dump filtered on src (0: all) and returns "prefix@src" strings,
// sorted, and the details in the order they came.
func dumpV2(t *testing.T, ch api.Channel, src Source, ip6 bool) ([]string, []ip.IPRouteV2) {
	t.Helper()
	req := ch.SendMultiRequest(&ip.IPRouteV2Dump{Src: uint8(src), Table: ip.IPTable{IsIP6: ip6}})
	var out []string
	var raw []ip.IPRouteV2
	for {
		d := new(ip.IPRouteV2Details)
		last, err := req.ReceiveReply(d)
		if err != nil {
			t.Fatalf("ip_route_v2_dump: %v", err)
		}
		if last {
			slices.Sort(out)
			return out, raw
		}
		p, _, _ := prefixFromAPI(d.Route.Prefix)
		out = append(out, p.String()+"@"+Source(d.Route.Src).String())
		raw = append(raw, d.Route)
	}
}

// TestRouteSources covers VPP's own /32s inside a pool: a recursive route's recursive-resolution entry and
// a resolved neighbour's adjacency, both dumped by ip_route_dump with ordinary-looking paths, neither
// removed by an API delete, neither returned by ip_route_v2_dump filtered on the API source.
func TestRouteSources(t *testing.T) {
	s := startSim(t, Config{Interfaces: []string{"eth0"}})
	ch := channel(t, connect(t, s))
	do(t, ch, addrReq(1, true, "192.0.2.1/24"), new(interfaces.SwInterfaceAddDelAddressReply))
	do(t, ch, &interfaces.SwInterfaceSetFlags{SwIfIndex: 1, Flags: interface_types.IF_STATUS_API_FLAG_ADMIN_UP}, new(interfaces.SwInterfaceSetFlagsReply))

	// The agent's block route, and another client's route recursive via a pod address inside it.
	do(t, ch, routeReq(true, false, 0, "10.1.7.0/26", nhPath("192.0.2.9", 1)), new(ip.IPRouteAddDelReply))
	do(t, ch, routeReq(true, false, 0, "10.99.0.0/24", nhPath("10.1.7.1", ^uint32(0))), new(ip.IPRouteAddDelReply))
	if err := s.ResolveNeighbor(1, netip.MustParseAddr("192.0.2.9")); err != nil {
		t.Fatal(err)
	}
	routes := dumpRoutes(t, ch, 0, false)
	for prefix, want := range map[string]string{
		"10.1.7.1/32":  "10.1.7.1/32 via 192.0.2.9@1",  // recursive resolution: the cover's path
		"192.0.2.9/32": "192.0.2.9/32 via 192.0.2.9@1", // adjacency
	} {
		if got, _ := findRoute(routes, prefix); got != want {
			t.Errorf("%s dumped as %q, want %q", prefix, got, want)
		}
	}
	// An API delete of either is accepted and changes nothing.
	for _, p := range []string{"10.1.7.1/32", "192.0.2.9/32"} {
		reply := new(ip.IPRouteAddDelReply)
		if rv := do(t, ch, routeReq(false, false, 0, p), reply); rv != 0 || reply.StatsIndex != ^uint32(0) {
			t.Errorf("delete %s: retval %d, stats_index %#x; want 0 and ~0", p, rv, reply.StatsIndex)
		}
		if _, ok := findRoute(dumpRoutes(t, ch, 0, false), p); !ok {
			t.Errorf("%s gone after an API delete", p)
		}
	}

	api, _ := dumpV2(t, ch, SourceAPI, false)
	if want := []string{"10.1.7.0/26@api", "10.99.0.0/24@api"}; !slices.Equal(api, want) {
		t.Errorf("ip_route_v2_dump src=api: %v, want %v", api, want)
	}
	all, _ := dumpV2(t, ch, 0, false)
	for _, want := range []string{"10.1.7.1/32@recursive-resolution", "192.0.2.9/32@adjacency", "192.0.2.1/24@interface",
		"224.0.0.0/4@special", "0.0.0.0/0@default-route"} {
		if !slices.Contains(all, want) {
			t.Errorf("ip_route_v2_dump src=0 lacks %s: %v", want, all)
		}
	}

	// The cover changes: the recursive-resolution entry follows it; the recursive route goes: so does it.
	do(t, ch, routeReq(true, false, 0, "10.1.7.0/26", nhPath("192.0.2.8", 1)), new(ip.IPRouteAddDelReply))
	if got, _ := findRoute(dumpRoutes(t, ch, 0, false), "10.1.7.1/32"); got != "10.1.7.1/32 via 192.0.2.8@1" {
		t.Errorf("after the cover changed: %q", got)
	}
	do(t, ch, routeReq(false, false, 0, "10.99.0.0/24"), new(ip.IPRouteAddDelReply))
	if got, ok := findRoute(dumpRoutes(t, ch, 0, false), "10.1.7.1/32"); ok {
		t.Errorf("recursive-resolution entry left without its recursive route: %q", got)
	}
}

// TestDumpOrderVaries: VPP dumps in hash order, so the simulator promises no order either.
func TestDumpOrderVaries(t *testing.T) {
	s := startSim(t, Config{})
	ch := channel(t, connect(t, s))
	for i := range 20 {
		do(t, ch, routeReq(true, false, 0, netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(i), 0, 0}), 16).String(),
			nhPath("172.16.0.2", 1)), new(ip.IPRouteAddDelReply))
	}
	_, first := dumpV2(t, ch, SourceAPI, false)
	for range 10 {
		_, again := dumpV2(t, ch, SourceAPI, false)
		if !slices.EqualFunc(first, again, func(a, b ip.IPRouteV2) bool { return a.Prefix == b.Prefix }) {
			return
		}
	}
	t.Error("11 dumps of 20 routes came in the same order")
}

// TestInterfacesOnDemand: with InterfacesOnDemand the interfaces appear when the test says so, after the
// start and after a restart, and not before.
func TestInterfacesOnDemand(t *testing.T) {
	s := startSim(t, Config{Interfaces: []string{"loop0"}, InterfacesOnDemand: true})
	for _, step := range []string{"start", "restart"} {
		if n := len(s.Interfaces()); n != 1 {
			t.Fatalf("%s: %d interfaces before CreateInterfaces, want only local0", step, n)
		}
		if err := s.CreateInterfaces(); err != nil {
			t.Fatal(err)
		}
		if got := s.Interfaces(); len(got) != 2 || got[1].Name != "loop0" {
			t.Fatalf("%s: interfaces %+v after CreateInterfaces, want local0 and loop0", step, got)
		}
		if err := s.CreateInterfaces(); err == nil {
			t.Errorf("%s: a second CreateInterfaces did not fail", step)
		}
		if err := s.Restart(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestInterfaceDelay: interfaces created by startup-config appear late, after start and after a restart.
func TestInterfaceDelay(t *testing.T) {
	const delay = 300 * time.Millisecond
	s := startSim(t, Config{Interfaces: []string{"loop0"}, InterfaceDelay: delay})
	for _, step := range []string{"start", "restart"} {
		start := time.Now()
		if n := len(s.Interfaces()); n != 1 {
			t.Fatalf("%s: %d interfaces at once, want only local0", step, n)
		}
		for len(s.Interfaces()) != 2 {
			if time.Since(start) > 5*time.Second {
				t.Fatalf("%s: loop0 did not appear", step)
			}
			time.Sleep(10 * time.Millisecond)
		}
		if took := time.Since(start); took < delay-50*time.Millisecond {
			t.Errorf("%s: loop0 appeared after %s, before the %s delay", step, took, delay)
		}
		if step == "start" {
			if err := s.Restart(); err != nil {
				t.Fatal(err)
			}
		}
	}
}
