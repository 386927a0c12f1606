package vppapi_test

import (
	"context"
	"net/netip"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vpp-route-agent/vpp-route-agent/internal/vpptest"
	"github.com/vpp-route-agent/vpp-route-agent/vppapi"
)

// benchPeers is how many remote nodes BenchmarkIPIPPeers reaches through tunnels.
const benchPeers = 1000

// BenchmarkIPIPPeers programs benchPeers remote nodes, one /26 block each, through IPIP the two ways VPP
// offers, and removes them again:
//
//   - p2p: one tunnel per peer (ipip_add_tunnel, unnumbered to the uplink, admin up), a route per block
//     via its tunnel without next hop;
//   - p2mp: one point-to-multipoint tunnel, a TEIB entry per peer (overlay address -> node address), a
//     route per block via the peer's overlay address on the tunnel.
//
// It reports peers/s to program and to remove, and, against a real VPP, the growth of VPP's main heap per
// peer (show memory main-heap) and of its stats segment (show memory stats-segment: every interface has
// counters there, and VPP aborts when it is full). Against the simulator only the client's cost is
// meaningful.
//
//	go test -run '^$' -bench IPIPPeers -benchtime 1x ./vppapi/
//	VPP_TEST_BACKEND=real VPP_PKG=/opt/vpp-v26.06-minimal go test -run '^$' -bench IPIPPeers -benchtime 1x ./vppapi/
func BenchmarkIPIPPeers(b *testing.B) {
	peers := make([]netip.Addr, benchPeers)
	overlay := make([]netip.Addr, benchPeers)
	blocks := make([]netip.Prefix, benchPeers)
	for i := range benchPeers {
		peers[i] = netip.AddrFrom4([4]byte{172, 16, byte(1 + i/250), byte(1 + i%250)})
		overlay[i] = netip.AddrFrom4([4]byte{10, 255, byte(1 + i/250), byte(1 + i%250)})
		blocks[i] = netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(i >> 2), byte(i&3) << 6}), 26)
	}
	src := addr("172.16.0.1")

	type design struct {
		name    string
		program func(ctx context.Context, c *vppapi.Client, uplink uint32) ([]vppapi.Route, error)
		remove  func(ctx context.Context, c *vppapi.Client, routes []vppapi.Route) error
	}
	designs := []design{
		{
			name: "p2p",
			program: func(ctx context.Context, c *vppapi.Client, uplink uint32) ([]vppapi.Route, error) {
				routes := make([]vppapi.Route, benchPeers)
				for i, p := range peers {
					idx, err := c.EnsureIPIPTunnel(ctx, vppapi.IPIPSpec{Src: src, Dst: p, Unnumbered: uplink})
					if err != nil {
						return nil, err
					}
					routes[i] = vppapi.Route{Prefix: blocks[i], SwIfIndex: idx}
				}
				return routes, c.Apply(ctx, routes, nil).Err()
			},
			remove: func(ctx context.Context, c *vppapi.Client, routes []vppapi.Route) error {
				if err := c.Apply(ctx, nil, routes).Err(); err != nil {
					return err
				}
				for _, r := range routes {
					if err := c.DeleteIPIPTunnel(ctx, r.SwIfIndex); err != nil {
						return err
					}
				}
				return nil
			},
		},
		{
			name: "p2mp",
			program: func(ctx context.Context, c *vppapi.Client, uplink uint32) ([]vppapi.Route, error) {
				idx, err := c.EnsureIPIPMultipoint(ctx, src, 0, uplink, 0)
				if err != nil {
					return nil, err
				}
				routes := make([]vppapi.Route, benchPeers)
				for i, p := range peers {
					if err := c.AddTEIBEntry(ctx, vppapi.TEIBEntry{SwIfIndex: idx, Peer: overlay[i], NextHop: p}); err != nil {
						return nil, err
					}
					routes[i] = vppapi.Route{Prefix: blocks[i], NextHop: overlay[i], SwIfIndex: idx}
				}
				return routes, c.Apply(ctx, routes, nil).Err()
			},
			remove: func(ctx context.Context, c *vppapi.Client, routes []vppapi.Route) error {
				if err := c.Apply(ctx, nil, routes).Err(); err != nil {
					return err
				}
				// TEIB entries before the tunnel: VPP keeps those of a deleted tunnel.
				for i, r := range routes {
					if err := c.DeleteTEIBEntry(ctx, vppapi.TEIBEntry{SwIfIndex: r.SwIfIndex, Peer: overlay[i]}); err != nil {
						return err
					}
				}
				return c.DeleteIPIPTunnel(ctx, routes[0].SwIfIndex)
			},
		},
	}
	for _, d := range designs {
		b.Run(d.name, func(b *testing.B) {
			v := vpptest.New(b, vpptest.Options{Uplink: uplinkName})
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
			var programmed, removed time.Duration
			var heapGrowth, statsGrowth float64
			for range b.N {
				heap, stats := memUsed(b, v, "main-heap"), memUsed(b, v, "stats-segment")
				t0 := time.Now()
				routes, err := d.program(ctx, h.c, uplink)
				programmed += time.Since(t0)
				if err != nil {
					b.Fatal(err)
				}
				heapGrowth += memUsed(b, v, "main-heap") - heap
				statsGrowth += memUsed(b, v, "stats-segment") - stats
				t0 = time.Now()
				if err := d.remove(ctx, h.c, routes); err != nil {
					b.Fatal(err)
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
		})
	}
}

var memoryUsed = regexp.MustCompile(`used: ([0-9.]+)([KMG]?)`)

// memUsed returns the bytes in use of one of VPP's memories ("main-heap", "stats-segment"), 0 against the
// simulator.
func memUsed(b *testing.B, v *vpptest.VPP, which string) float64 {
	b.Helper()
	if !vpptest.Real() {
		return 0
	}
	out := v.CLI("show memory " + which)
	m := memoryUsed.FindStringSubmatch(out)
	if m == nil {
		b.Fatalf("no heap usage in %q", out)
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		b.Fatal(err)
	}
	return f * map[string]float64{"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[m[2]]
}
