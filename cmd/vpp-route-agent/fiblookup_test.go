package main

import (
	"context"
	"errors"
	"maps"
	"net/netip"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/agent"
	"github.com/vpp-route-agent/vpp-route-agent/calico"
	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/test/vppsim"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
	"go.fd.io/govpp/adapter/socketclient"
	"go.fd.io/govpp/api"
	"go.fd.io/govpp/binapi/ip"
	"go.fd.io/govpp/binapi/ip_types"
	"go.fd.io/govpp/core"
)

// TestFIBLookupLongestPrefixMatch: ip_route_lookup (exact=0) answers with the longest entry no longer
// than the query that contains it, the default route when nothing else does, and NO_SUCH_FIB for a
// table that does not exist; the same on the simulator and on a real VPP (VPP_TEST_BACKEND=real).
func TestFIBLookupLongestPrefixMatch(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{})
	t.Logf("VPP %s", v.Version())
	v.AddRoute(vppsim.Route{Prefix: netip.MustParsePrefix("10.244.1.0/26"),
		Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1}}})
	v.AddRoute(vppsim.Route{Prefix: netip.MustParsePrefix("10.244.1.5/32"),
		Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.0.2.9"), SwIfIndex: 1}}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	drop := []vppapi.Path{{SwIfIndex: ^uint32(0), Type: vppapi.PathDrop}}
	for _, tc := range []struct {
		query string
		want  string
		paths []vppapi.Path
	}{
		{"10.244.1.5/32", "10.244.1.5/32", []vppapi.Path{{NextHop: netip.MustParseAddr("192.0.2.9"), SwIfIndex: 1}}},
		{"10.244.1.6/32", "10.244.1.0/26", []vppapi.Path{{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1}}},
		{"10.244.1.0/26", "10.244.1.0/26", []vppapi.Path{{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1}}},
		{"10.244.1.0/25", "0.0.0.0/0", drop}, // the /26 is longer than the query
		{"10.245.0.1/32", "0.0.0.0/0", drop},
		{"fd00::1/128", "::/0", drop},
	} {
		got, _, err := fibLookup(ctx, v.Socket(), 10*time.Second, 0, netip.MustParsePrefix(tc.query))
		if err != nil {
			t.Errorf("lookup %s: %v", tc.query, err)
			continue
		}
		if got.Prefix.String() != tc.want || len(got.Paths) != len(tc.paths) || (len(tc.paths) > 0 && got.Paths[0] != tc.paths[0]) {
			t.Errorf("lookup %s = %s %v, want %s %v", tc.query, got.Prefix, got.Paths, tc.want, tc.paths)
		}
	}
	_, _, err := fibLookup(ctx, v.Socket(), 10*time.Second, 7, netip.MustParsePrefix("10.244.1.5/32"))
	if !errors.Is(err, api.NO_SUCH_FIB) {
		t.Errorf("lookup in a missing table: %v, want NO_SUCH_FIB", err)
	}
}

// TestFIBLookupExact: with exact=1 ip_route_lookup answers only the entry of that very prefix, else
// NO_SUCH_ENTRY; the same on the simulator and on a real VPP. (explain uses exact=0; this pins the rest
// of the simulator's answer.)
func TestFIBLookupExact(t *testing.T) {
	v := vpptest.New(t, vpptest.Options{})
	v.AddRoute(vppsim.Route{Prefix: netip.MustParsePrefix("10.244.1.0/26"),
		Paths: []vppsim.Path{{NextHop: netip.MustParseAddr("192.0.2.7"), SwIfIndex: 1}}})
	conn, err := core.Connect(socketclient.NewVppClient(v.Socket()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Disconnect()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		query string
		want  error // nil: found, as the query
	}{
		{"10.244.1.0/26", nil},
		{"10.244.1.5/32", api.NO_SUCH_ENTRY},
		{"10.244.1.0/25", api.NO_SUCH_ENTRY},
		{"0.0.0.0/0", nil},
	} {
		qp := netip.MustParsePrefix(tc.query)
		apiQ := ip_types.Prefix{Address: ip_types.Address{Af: ip_types.ADDRESS_IP4, Un: ip_types.AddressUnionIP4(qp.Addr().As4())}, Len: uint8(qp.Bits())}
		reply := new(ip.IPRouteLookupReply)
		err := conn.Invoke(ctx, &ip.IPRouteLookup{Exact: 1, Prefix: apiQ}, reply)
		if err == nil {
			err = api.RetvalToVPPApiError(reply.Retval)
		}
		switch {
		case tc.want != nil && !errors.Is(err, tc.want):
			t.Errorf("exact lookup %s: %v, want %v", tc.query, err, tc.want)
		case tc.want == nil && (err != nil || reply.Route.Prefix != apiQ):
			t.Errorf("exact lookup %s: %v %+v, want the entry itself", tc.query, err, reply.Route)
		}
	}
}

// TestFIBLookupTunnels: the lookup's tunnels are VPP's IPIP and VXLAN tunnels (the latter when the
// plugin is loaded) with their names, peers and whether they carry the agent's tag; a route through the
// agent's VXLAN tunnel with the peer as next hop is judged as agreeing with a VXLAN route. On the
// simulator and on a real VPP (the lab build has the vxlan plugin; the minimal one does not).
func TestFIBLookupTunnels(t *testing.T) {
	pfx, addr := netip.MustParsePrefix, netip.MustParseAddr
	v := vpptest.New(t, vpptest.Options{VXLAN: true})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	c, uplink := vppClient(t, ctx, v, pfx("192.0.2.1/24"))
	own, err := c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr("192.0.2.1"), Dst: addr("198.51.100.2"), Unnumbered: uplink, Tag: agent.TunnelTag})
	if err != nil {
		t.Fatal(err)
	}
	other, err := c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: addr("192.0.2.1"), Dst: addr("198.51.100.3"), Unnumbered: uplink})
	if err != nil {
		t.Fatal(err)
	}
	want := agent.Tunnels{
		own:   {SwIfIndex: own, Name: "ipip0", Encap: calico.EncapIPIP, Source: addr("192.0.2.1"), Peer: addr("198.51.100.2"), Agent: true},
		other: {SwIfIndex: other, Name: "ipip1", Encap: calico.EncapIPIP, Source: addr("192.0.2.1"), Peer: addr("198.51.100.3")},
	}
	q := pfx("10.246.1.5/32")
	if v.HasVXLAN() {
		vx, err := c.EnsureVXLANTunnel(ctx, vppapi.VXLANSpec{Src: addr("192.0.2.1"), Dst: addr("198.51.100.4"), VNI: 4096,
			MAC: vppapi.MAC{0x02, 0, 0, 0, 0, 1}, Unnumbered: uplink, Tag: agent.TunnelTag})
		if err != nil {
			t.Fatal(err)
		}
		want[vx] = agent.Tunnel{SwIfIndex: vx, Name: "vxlan_tunnel0", Encap: calico.EncapVXLAN, Source: addr("192.0.2.1"), Peer: addr("198.51.100.4"), Agent: true}
		if err := c.EnsureNeighbor(ctx, vx, addr("198.51.100.4"), vppapi.MAC{0x02, 0, 0, 0, 0, 2}); err != nil {
			t.Fatal(err)
		}
		if res := c.Apply(ctx, []vppapi.Route{{Prefix: pfx("10.246.1.0/26"), NextHop: addr("198.51.100.4"), SwIfIndex: vx}}, nil); res.Err() != nil {
			t.Fatal(res.Err())
		}
	} else {
		t.Log("no vxlan plugin: IPIP tunnels only")
	}
	got, tunnels, err := fibLookup(ctx, v.Socket(), 10*time.Second, 0, q)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(tunnels, want) {
		t.Errorf("tunnels %v, want %v", tunnels, want)
	}
	if !v.HasVXLAN() {
		return
	}
	r := &agent.ExplainedRoute{DesiredRoute: agent.DesiredRoute{Prefix: pfx("10.246.1.0/26"), NextHop: addr("198.51.100.4"), Owner: "node-b",
		Kind: agent.KindBlock, Block: pfx("10.246.1.0/26"), Encap: calico.EncapVXLAN}}
	if verdict, why := agent.CheckFIB(agent.NodeRoutes{Forwarding: r}, q, got, nil, tunnels); verdict != agent.VerdictAgrees {
		t.Errorf("VXLAN route %v: %s %q, want agrees", got, verdict, why)
	}
}
