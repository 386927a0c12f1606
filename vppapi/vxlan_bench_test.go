package vppapi_test

import (
	"context"
	"net/netip"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// BenchmarkVXLANPeers programs benchPeers remote nodes, one /26 block each, through L2 VXLAN the way a
// felix-configured Linux node talks to: per peer a tunnel (vxlan_add_del_tunnel_v3, MAC, unnumbered,
// admin up), a static neighbour for its VTEP (the block's first address) and a route per block via that
// VTEP on the tunnel; then removes the routes and the tunnels (which take their neighbours with them). It
// reports peers/s both ways and, against a real VPP, the growth of VPP's main heap and stats segment per
// peer. It needs the vxlan plugin (the lab build):
//
//	VPP_TEST_BACKEND=real VPP_PKG=/opt/vpp-v26.06-lab go test -run '^$' -bench VXLANPeers -benchtime 1x ./vppapi/
func BenchmarkVXLANPeers(b *testing.B) {
	v := vpptest.New(b, vpptest.Options{Uplink: uplinkName, VXLAN: true})
	if !v.HasVXLAN() {
		b.Skip("the VPP package has no vxlan plugin")
	}
	h := start(b, v.Socket(), func(c *vppapi.Config) {
		c.ReplyTimeout = vppapi.DefaultReplyTimeout
		c.HealthInterval = vppapi.DefaultHealthInterval
	})
	h.expect(vppapi.Connected)
	ctx := context.Background()
	uplink, err := h.c.SetupUplink(ctx, vppapi.Uplink{Name: v.Uplink(), Addresses: []netip.Prefix{pfx("172.16.0.1/16")}})
	if err != nil {
		b.Fatal(err)
	}
	specs := make([]vppapi.VXLANSpec, benchPeers)
	blocks := make([]netip.Prefix, benchPeers)
	for i := range benchPeers {
		specs[i] = vppapi.VXLANSpec{Src: addr("172.16.0.1"), Dst: netip.AddrFrom4([4]byte{172, 16, byte(1 + i/250), byte(1 + i%250)}),
			VNI: vppapi.DefaultVXLANVNI, MAC: ourMAC, Unnumbered: uplink, Tag: "vpp-route-agent"}
		blocks[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 2), byte(i&3) << 6}), 26)
	}
	var programmed, removed time.Duration
	var heapGrowth, statsGrowth float64
	for range b.N {
		heap, stats := memUsed(b, v, "main-heap"), memUsed(b, v, "stats-segment")
		t0 := time.Now()
		routes := make([]vppapi.Route, benchPeers)
		for i, spec := range specs {
			idx, err := h.c.EnsureVXLANTunnel(ctx, spec)
			if err != nil {
				b.Fatal(err)
			}
			vtep := blocks[i].Addr()
			if err := h.c.EnsureNeighbor(ctx, idx, vtep, theirMAC); err != nil {
				b.Fatal(err)
			}
			routes[i] = vppapi.Route{Prefix: blocks[i], NextHop: vtep, SwIfIndex: idx}
		}
		if err := h.c.Apply(ctx, routes, nil).Err(); err != nil {
			b.Fatal(err)
		}
		programmed += time.Since(t0)
		heapGrowth += memUsed(b, v, "main-heap") - heap
		statsGrowth += memUsed(b, v, "stats-segment") - stats
		t0 = time.Now()
		if err := h.c.Apply(ctx, nil, routes).Err(); err != nil {
			b.Fatal(err)
		}
		for _, spec := range specs {
			if err := h.c.DeleteVXLANTunnel(ctx, spec); err != nil {
				b.Fatal(err)
			}
		}
		removed += time.Since(t0)
	}
	n := float64(benchPeers * b.N)
	b.ReportMetric(n/programmed.Seconds(), "peers/s")
	b.ReportMetric(n/removed.Seconds(), "removed-peers/s")
	if vpptest.Real() {
		b.ReportMetric(heapGrowth/n, "heap-bytes/peer")
		b.ReportMetric(statsGrowth/n, "statseg-bytes/peer")
	}
	b.ReportMetric(0, "ns/op")
}
